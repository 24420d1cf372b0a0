"""Quiet by default: what the libraries say goes to RUN_DIR/logs/run.log, the terminal keeps the
trainer's own output.

`quiet(run_dir, level)` spans a run in the `rstar2-train` process:
- file descriptor 2 (stderr) points at the file, so whatever writes there lands in it: torch's C++
  warnings, progress bars of transformers and vLLM, Python warnings, the sandbox and verify
  servers (child processes inherit it), and the loggers whose handler holds stderr (torch's,
  transformers', Ray's driver logger);
- vLLM logs to stdout unless told: `VLLM_LOGGING_STREAM` sends it to stderr (so the file) and
  `VLLM_LOGGING_LEVEL` takes `level`; vLLM reads both when it builds an engine;
- Python logging: the root logger writes the file at `level`; a handler on the terminal shows
  the trainer's own loggers (`rstar2_*`) from WARNING and anyone's errors;
- transformers' verbosity is `level` (Ray's, in cluster mode: `ray.init(logging_level=...)`).
stdout, where the trainer prints its progress, step lines and tables, is left alone. Everything is
restored on exit, so an error message or a traceback after the run reaches the terminal.

Not covered: Ray's workers and raylets log into Ray's session folder (`log_to_driver` is off);
what a library prints to stdout (none of the ones the trainer runs do, with vLLM redirected).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path

LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


class _Terminal(logging.Filter):
    """The trainer's warnings and anyone's errors."""

    def filter(self, record: logging.LogRecord) -> bool:
        own = record.name.startswith("rstar2")
        return record.levelno >= logging.ERROR or (own and record.levelno >= logging.WARNING)


@contextlib.contextmanager
def quiet(run_dir: Path, level: str) -> Iterator[Path]:
    """Route the libraries' logs and stderr to RUN_DIR/logs/run.log for the block; yields it."""
    path = run_dir / "logs" / "run.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    numeric = LEVELS[level]
    env = {"VLLM_LOGGING_STREAM": "ext://sys.stderr", "VLLM_LOGGING_LEVEL": level.upper()}
    saved_env = {key: os.environ.get(key) for key in env}
    os.environ.update(env)

    sys.stderr.flush()
    terminal_fd = os.dup(2)
    log_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    terminal = open(terminal_fd, "w", buffering=1, closefd=False)  # noqa: SIM115

    root = logging.getLogger()
    saved_level = root.level
    to_file = logging.FileHandler(path)
    to_file.setLevel(numeric)
    to_file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    to_terminal = logging.StreamHandler(terminal)
    to_terminal.addFilter(_Terminal())
    to_terminal.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root.addHandler(to_file)
    root.addHandler(to_terminal)
    root.setLevel(min(numeric, logging.WARNING))
    hf_level = _set_transformers_verbosity(numeric)
    try:
        yield path
    finally:
        root.removeHandler(to_file)
        root.removeHandler(to_terminal)
        root.setLevel(saved_level)
        to_file.close()
        if hf_level is not None:
            _set_transformers_verbosity(hf_level)
        sys.stderr.flush()
        os.dup2(terminal_fd, 2)
        terminal.close()
        os.close(terminal_fd)
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _set_transformers_verbosity(level: int) -> int | None:
    """Set transformers' level; return the one it had (None: transformers is not loaded)."""
    if "transformers" not in sys.modules:
        return None
    from transformers.utils import logging as hf_logging

    before = hf_logging.get_verbosity()
    hf_logging.set_verbosity(level)
    return before
