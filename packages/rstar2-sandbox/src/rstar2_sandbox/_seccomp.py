"""A seccomp-BPF filter built by hand, installed with prctl through ctypes (no libseccomp).

Contract: `install_filter()` confines the calling process (and everything it could start) for the
rest of its life. The filter checks the architecture (any other ABI, x32 included, is killed), then
answers EPERM to system calls that a maths snippet never needs and that an escape does: sockets,
ptrace and cross-process memory access, mount and namespace changes, kernel modules, kexec, bpf,
io_uring, keyrings, SysV IPC, POSIX message queues and memfds (memory outside RLIMIT_AS that could
outlive the call), pidfds, and every way to start a process (fork, vfork, execve, and clone
without CLONE_THREAD; clone3, whose flags BPF cannot read, answers ENOSYS so glibc falls back to
clone). Signals (kill, tgkill, sigqueue), prlimit, scheduling and setpriority are allowed only
when aimed at the calling process itself (0 or its own pid, patched in at install time), so a call
cannot signal or starve its siblings even when they share its uid. Threads still work. `supported()` says whether this machine can take a filter, and why not.

Not covered: argument filtering beyond the ones above, and architectures other than x86_64 and
aarch64 (where `supported()` says so and the caller reports seccomp as unavailable).
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct

# Classic BPF opcodes.
_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_JSET_K = 0x45  # BPF_JMP | BPF_JSET | BPF_K
_RET_K = 0x06  # BPF_RET | BPF_K

_RET_KILL_PROCESS = 0x80000000
_RET_ERRNO = 0x00050000
_RET_ALLOW = 0x7FFF0000

_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
_CLONE_THREAD = 0x00010000
_X32_SYSCALL_BIT = 0x40000000

# Offsets in struct seccomp_data.
_NR, _ARCH, _ARG0_LOW = 0, 4, 16

_DENIED = [
    "socket",
    "socketpair",
    "connect",
    "bind",
    "listen",
    "accept",
    "accept4",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "unshare",
    "setns",
    "kexec_load",
    "kexec_file_load",
    "bpf",
    "perf_event_open",
    "init_module",
    "finit_module",
    "delete_module",
    "reboot",
    "swapon",
    "swapoff",
    "keyctl",
    "add_key",
    "request_key",
    "userfaultfd",
    "open_by_handle_at",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "open_tree",
    "move_mount",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    "fork",
    "vfork",
    "execve",
    "execveat",
    # Memory outside RLIMIT_AS and state that would outlive the call: SysV IPC, POSIX message
    # queues, memfds.
    "shmget",
    "shmat",
    "shmctl",
    "shmdt",
    "semget",
    "semop",
    "semctl",
    "semtimedop",
    "msgget",
    "msgsnd",
    "msgrcv",
    "msgctl",
    "mq_open",
    "mq_unlink",
    "mq_timedsend",
    "mq_timedreceive",
    "mq_notify",
    "mq_getsetattr",
    "memfd_create",
    "memfd_secret",
    # Reaching other processes: pidfds, kcmp, and signals not aimed at the call itself.
    "pidfd_open",
    "pidfd_send_signal",
    "pidfd_getfd",
    "kcmp",
    "process_madvise",
    "process_mrelease",
    "tkill",
    "ioprio_set",
]

# Allowed only when the first argument names the call itself (0 or its own pid): kill(0, ...)
# reaches the call's own process group, which holds only the call.
_SELF_ONLY = [
    "kill",
    "tgkill",
    "rt_sigqueueinfo",
    "rt_tgsigqueueinfo",
    "prlimit64",
    "sched_setaffinity",
    "sched_setscheduler",
    "sched_setparam",
    "sched_setattr",
    "move_pages",
    "migrate_pages",
]

# System call numbers of the denied calls (x86_64 and the generic table of aarch64).
_TABLES: dict[str, tuple[int, dict[str, int]]] = {
    "x86_64": (
        0xC000003E,
        {
            "socket": 41,
            "socketpair": 53,
            "connect": 42,
            "bind": 49,
            "listen": 50,
            "accept": 43,
            "accept4": 288,
            "ptrace": 101,
            "process_vm_readv": 310,
            "process_vm_writev": 311,
            "mount": 165,
            "umount2": 166,
            "pivot_root": 155,
            "chroot": 161,
            "unshare": 272,
            "setns": 308,
            "kexec_load": 246,
            "kexec_file_load": 320,
            "bpf": 321,
            "perf_event_open": 298,
            "init_module": 175,
            "finit_module": 313,
            "delete_module": 176,
            "reboot": 169,
            "swapon": 167,
            "swapoff": 168,
            "keyctl": 250,
            "add_key": 248,
            "request_key": 249,
            "userfaultfd": 323,
            "open_by_handle_at": 304,
            "io_uring_setup": 425,
            "io_uring_enter": 426,
            "io_uring_register": 427,
            "open_tree": 428,
            "move_mount": 429,
            "fsopen": 430,
            "fsconfig": 431,
            "fsmount": 432,
            "fspick": 433,
            "mount_setattr": 442,
            "fork": 57,
            "vfork": 58,
            "execve": 59,
            "execveat": 322,
            "shmget": 29,
            "shmat": 30,
            "shmctl": 31,
            "shmdt": 67,
            "semget": 64,
            "semop": 65,
            "semctl": 66,
            "semtimedop": 220,
            "msgget": 68,
            "msgsnd": 69,
            "msgrcv": 70,
            "msgctl": 71,
            "mq_open": 240,
            "mq_unlink": 241,
            "mq_timedsend": 242,
            "mq_timedreceive": 243,
            "mq_notify": 244,
            "mq_getsetattr": 245,
            "memfd_create": 319,
            "memfd_secret": 447,
            "pidfd_open": 434,
            "pidfd_send_signal": 424,
            "pidfd_getfd": 438,
            "kcmp": 312,
            "process_madvise": 440,
            "process_mrelease": 448,
            "tkill": 200,
            "ioprio_set": 251,
            "kill": 62,
            "tgkill": 234,
            "rt_sigqueueinfo": 129,
            "rt_tgsigqueueinfo": 297,
            "prlimit64": 302,
            "sched_setaffinity": 203,
            "sched_setscheduler": 144,
            "sched_setparam": 142,
            "sched_setattr": 314,
            "move_pages": 279,
            "migrate_pages": 256,
            "setpriority": 141,
            "clone": 56,
            "clone3": 435,
        },
    ),
    "aarch64": (
        0xC00000B7,
        {
            "socket": 198,
            "socketpair": 199,
            "connect": 203,
            "bind": 200,
            "listen": 201,
            "accept": 202,
            "accept4": 242,
            "ptrace": 117,
            "process_vm_readv": 270,
            "process_vm_writev": 271,
            "mount": 40,
            "umount2": 39,
            "pivot_root": 41,
            "chroot": 51,
            "unshare": 97,
            "setns": 268,
            "kexec_load": 104,
            "kexec_file_load": 294,
            "bpf": 280,
            "perf_event_open": 241,
            "init_module": 105,
            "finit_module": 273,
            "delete_module": 106,
            "reboot": 142,
            "swapon": 224,
            "swapoff": 225,
            "keyctl": 219,
            "add_key": 217,
            "request_key": 218,
            "userfaultfd": 282,
            "open_by_handle_at": 265,
            "io_uring_setup": 425,
            "io_uring_enter": 426,
            "io_uring_register": 427,
            "open_tree": 428,
            "move_mount": 429,
            "fsopen": 430,
            "fsconfig": 431,
            "fsmount": 432,
            "fspick": 433,
            "mount_setattr": 442,
            "execve": 221,
            "execveat": 281,
            "shmget": 194,
            "shmat": 196,
            "shmctl": 195,
            "shmdt": 197,
            "semget": 190,
            "semop": 193,
            "semctl": 191,
            "semtimedop": 192,
            "msgget": 186,
            "msgsnd": 189,
            "msgrcv": 188,
            "msgctl": 187,
            "mq_open": 180,
            "mq_unlink": 181,
            "mq_timedsend": 182,
            "mq_timedreceive": 183,
            "mq_notify": 184,
            "mq_getsetattr": 185,
            "memfd_create": 279,
            "memfd_secret": 447,
            "pidfd_open": 434,
            "pidfd_send_signal": 424,
            "pidfd_getfd": 438,
            "kcmp": 272,
            "process_madvise": 440,
            "process_mrelease": 448,
            "tkill": 130,
            "ioprio_set": 30,
            "kill": 129,
            "tgkill": 131,
            "rt_sigqueueinfo": 138,
            "rt_tgsigqueueinfo": 240,
            "prlimit64": 261,
            "sched_setaffinity": 122,
            "sched_setscheduler": 119,
            "sched_setparam": 118,
            "sched_setattr": 274,
            "move_pages": 239,
            "migrate_pages": 238,
            "setpriority": 140,
            "clone": 220,
            "clone3": 435,
        },
    ),
}


class _SockFilter(ctypes.Structure):
    _fields_ = (
        ("code", ctypes.c_ushort),
        ("jt", ctypes.c_ubyte),
        ("jf", ctypes.c_ubyte),
        ("k", ctypes.c_uint32),
    )


class _SockFprog(ctypes.Structure):
    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter)))


_PID = 0xFFFFFFFF  # placeholder, patched with the caller's pid when the filter is installed
_ARG1_LOW = 24


def _program(arch: str) -> list[tuple[int, int, int, int]]:
    """The filter as (code, jt, jf, k) instructions for `arch` (pids still as `_PID`)."""
    audit_arch, numbers = _TABLES[arch]
    eperm = _RET_ERRNO | errno.EPERM
    allow = (_RET_K, 0, 0, _RET_ALLOW)
    prog = [
        (_LD_W_ABS, 0, 0, _ARCH),
        (_JEQ_K, 1, 0, audit_arch),
        (_RET_K, 0, 0, _RET_KILL_PROCESS),
        (_LD_W_ABS, 0, 0, _NR),
    ]
    if arch == "x86_64":
        prog += [(_JGE_K, 0, 1, _X32_SYSCALL_BIT), (_RET_K, 0, 0, _RET_KILL_PROCESS)]
    denied = [numbers[name] for name in _DENIED if name in numbers]
    for number in denied:  # each: if nr == number return EPERM
        prog += [(_JEQ_K, 0, 1, number), (_RET_K, 0, 0, eperm)]
    for name in _SELF_ONLY:  # if nr == number: allow when arg0 is 0 or our pid, else EPERM
        prog += [
            (_JEQ_K, 0, 5, numbers[name]),
            (_LD_W_ABS, 0, 0, _ARG0_LOW),
            (_JEQ_K, 2, 0, 0),
            (_JEQ_K, 1, 0, _PID),
            (_RET_K, 0, 0, eperm),
            allow,
        ]
    prog += [  # setpriority(PRIO_PROCESS, 0 or our pid, ...) only: never a group or a user
        (_JEQ_K, 0, 7, numbers["setpriority"]),
        (_LD_W_ABS, 0, 0, _ARG0_LOW),
        (_JEQ_K, 0, 3, 0),
        (_LD_W_ABS, 0, 0, _ARG1_LOW),
        (_JEQ_K, 2, 0, 0),
        (_JEQ_K, 1, 0, _PID),
        (_RET_K, 0, 0, eperm),
        allow,
    ]
    prog += [
        (_JEQ_K, 0, 1, numbers["clone3"]),
        (_RET_K, 0, 0, _RET_ERRNO | errno.ENOSYS),
        (_JEQ_K, 0, 3, numbers["clone"]),
        (_LD_W_ABS, 0, 0, _ARG0_LOW),  # clone's flags (low 32 bits)
        (_JSET_K, 1, 0, _CLONE_THREAD),
        (_RET_K, 0, 0, eperm),
        allow,
    ]
    return prog


def supported() -> str | None:
    """None when a filter can be installed here, else the reason it cannot."""
    arch = platform.machine()
    if arch not in _TABLES:
        return f"no system-call table for architecture {arch}"
    if platform.system() != "Linux":
        return "seccomp needs Linux"
    try:
        with open("/proc/self/status") as status:
            if "Seccomp:" not in status.read():
                return "kernel built without CONFIG_SECCOMP"
    except OSError as exc:
        return f"cannot read /proc/self/status: {exc}"
    return None


def denied_calls() -> tuple[str, ...]:
    """Names of the system calls the filter denies (clone only without CLONE_THREAD)."""
    return (*_DENIED, "clone (new processes)", "clone3")


_LIBC = ctypes.CDLL(None, use_errno=True)
_prepared: tuple[ctypes.Array[_SockFilter], _SockFprog, list[int]] | None = None


def prepare() -> None:
    """Build the filter once (a worker does this before forking, so each call only installs)."""
    global _prepared
    prog = _program(platform.machine())
    array = (_SockFilter * len(prog))(*(_SockFilter(*ins) for ins in prog))
    program = _SockFprog(len(prog), ctypes.cast(array, ctypes.POINTER(_SockFilter)))
    _prepared = (array, program, [i for i, ins in enumerate(prog) if ins[3] == _PID])


def install_filter() -> None:
    """Confine the calling process; raises OSError when the kernel refuses the filter."""
    if _prepared is None:
        prepare()
    assert _prepared is not None
    pid = os.getpid()
    for index in _prepared[2]:  # signals and scheduling may only aim at this process
        _prepared[0][index].k = pid
    libc = _LIBC
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_NO_NEW_PRIVS): {errno.errorcode.get(err, err)}")
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(_prepared[1]), 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_SECCOMP): {errno.errorcode.get(err, err)}")


def program_bytes() -> bytes:
    """The filter for this machine as the kernel reads it (for tests and inspection)."""
    program = [
        (c, t, f, os.getpid() if k == _PID else k) for c, t, f, k in _program(platform.machine())
    ]
    return b"".join(struct.pack("=HBBI", *ins) for ins in program)
