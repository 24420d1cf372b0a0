"""A checkpoint's manifest: the files it holds, written last, checked before it is trusted.

`write_manifest(folder, checksums=...)` records every file of a finished checkpoint folder
(name, size, and with `checksums` its CRC32) in `folder/manifest.json`, fsynced, together with
the folder itself; the folder is renamed into place only after that, so a folder under its final
name with a manifest whose files all match is complete. `check_manifest(folder)` returns None for
such a folder and otherwise one line saying what is wrong (no manifest, a file missing, a size or
a checksum that differs). CRC32 (zlib, about 6 GB/s here) catches torn and bit-flipped files,
not a deliberate forgery.

`CheckpointError` is a checkpoint that could not be written (a full disk, a quota, a file too
large): its message names the step, the OS's reason and the checkpoint that is still intact.

Also the fsync helpers the savers share. Not covered: which folders are checkpoints and which
is the newest good one (checkpoint.py), or the DCP format itself (sharded_checkpoint.py).
"""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"
FORMAT = 2  # state.json's "format": 2 promises a manifest; older checkpoints have neither


class CheckpointError(RuntimeError):
    """A checkpoint could not be written; the message is one line a person can act on."""


def fsync_file(path: Path) -> None:
    with path.open("rb") as f:
        os.fsync(f.fileno())


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def crc32_file(path: Path, chunk: int = 1 << 22) -> int:
    crc = 0
    with path.open("rb") as f:
        while block := f.read(chunk):
            crc = zlib.crc32(block, crc)
    return crc


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p != folder / MANIFEST)


def write_manifest(folder: Path, *, checksums: bool) -> dict[str, Any]:
    """Fsync every file of `folder`, record them in `folder/manifest.json`, fsync it and the
    folder; the manifest's content."""
    files: dict[str, dict[str, int]] = {}
    for path in _files(folder):
        fsync_file(path)
        entry = {"size": path.stat().st_size}
        if checksums:
            entry["crc32"] = crc32_file(path)
        files[path.relative_to(folder).as_posix()] = entry
    manifest = {"format": FORMAT, "files": files}
    path = folder / MANIFEST
    path.write_text(json.dumps(manifest, indent=1, sort_keys=True))
    fsync_file(path)
    fsync_dir(folder)
    return manifest


def check_manifest(folder: Path, *, checksums: bool = True) -> str | None:
    """None when every file the manifest lists is in `folder` with its size (and, with
    `checksums`, its CRC32 where recorded); otherwise what is wrong, in a few words."""
    path = folder / MANIFEST
    try:
        manifest = json.loads(path.read_text())
        files = manifest["files"]
    except FileNotFoundError:
        return "no manifest.json: it was never completed"
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"manifest.json cannot be read ({type(exc).__name__})"
    for name, entry in sorted(files.items()):
        file = folder / name
        try:
            size = file.stat().st_size
        except FileNotFoundError:
            return f"{name} is missing"
        if size != entry["size"]:
            return f"{name} is {size} bytes, the manifest says {entry['size']}"
        if checksums and "crc32" in entry and crc32_file(file) != entry["crc32"]:
            return f"{name} does not match its checksum"
    return None


def os_error(exc: BaseException) -> OSError | None:
    """The OS error under `exc` (itself, or its cause or context), or None."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None
