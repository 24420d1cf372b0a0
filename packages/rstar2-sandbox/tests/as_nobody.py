"""Run a command as `nobody`, with the interpreter reachable (a test helper, run as root).

    python as_nobody.py PROGRAM ARGS...

The interpreter of a CI machine may live under a directory other users cannot enter (pyenv under
a 0700 /root). In a private mount namespace (nothing changes on the host) each such directory is
covered with an empty tmpfs and the interpreter's trees are bound back at their own paths; then
the process drops to nobody (no groups, no capabilities) and execs the command.
"""

from __future__ import annotations

import ctypes
import os
import pwd
import sys

_LIBC = ctypes.CDLL(None, use_errno=True)
_CLONE_NEWNS, _MS_BIND, _MS_REC, _MS_PRIVATE = 0x20000, 0x1000, 0x4000, 1 << 18


def _mount(source: bytes | None, target: bytes, kind: bytes | None, flags: int, data: bytes | None):
    if _LIBC.mount(source, target, kind, flags, data) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {target!r}: {os.strerror(err)}")


def _blocked(path: str) -> str | None:
    parts = path.split(os.sep)[1:]
    for depth in range(1, len(parts)):
        ancestor = os.sep + os.path.join(*parts[:depth])
        if not os.stat(ancestor).st_mode & 0o001:
            return ancestor
    return None


def main() -> None:
    nobody = pwd.getpwnam("nobody")
    trees = {os.path.realpath(p) for p in (sys.base_prefix, sys.prefix, *sys.path) if p}
    trees = {t for t in trees if os.path.isdir(t)}
    hide = {a for t in trees if (a := _blocked(t)) is not None}
    if hide:
        if _LIBC.unshare(_CLONE_NEWNS) != 0:
            raise OSError(ctypes.get_errno(), "unshare")
        _mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None)
        keep = [t for t in sorted(trees) if any(t.startswith(a + os.sep) for a in hide)]
        held = [(t, os.open(t, os.O_PATH)) for t in keep]
        for ancestor in hide:
            _mount(b"tmpfs", ancestor.encode(), b"tmpfs", 0, b"mode=0755,size=1m")
        for tree, fd in held:
            os.makedirs(tree, mode=0o755, exist_ok=True)
            _mount(f"/proc/self/fd/{fd}".encode(), tree.encode(), None, _MS_BIND | _MS_REC, None)
            os.close(fd)
    os.setgroups([])
    os.setgid(nobody.pw_gid)
    os.setuid(nobody.pw_uid)
    os.execv(sys.argv[1], sys.argv[1:])


if __name__ == "__main__":
    main()
