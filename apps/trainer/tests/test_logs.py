"""Quiet by default: `rstar2-train` on its default engine (vLLM) and child servers prints its own
lines; vLLM, torch and the servers write to RUN_DIR/logs/run.log."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from rstar2_trainer.rundir.logs import quiet
from rstar2_trainer.rundir.report import COLUMNS

# The default recipe's engine and servers, at sizes a 2-core machine runs in minutes.
SMALL = [
    "sft.examples=16",
    "sft.epochs=1",
    "sft.batch_size=8",
    "eval.problems=2",
    "eval.max_response_tokens=32",
    "curriculum.batch_size=1",
    "curriculum.source.n=8",
    "algo.group_size=2",
    "curriculum.tiny.steps=[1,1,1]",
    "curriculum.tiny.max_response_tokens=[32,32,32]",
    "model.layers=1",
    "model.vocab_size=512",
    "engine.kv_cache_memory_bytes=33554432",
    "run.plots=false",
]


@pytest.mark.slow
def test_the_terminal_shows_the_trainers_lines_and_the_file_the_libraries(tmp_path):
    run_dir = tmp_path / "run"
    argv = [sys.executable, "-m", "rstar2_trainer.cli", "tiny", f"run.output_dir={run_dir}"]
    done = subprocess.run([*argv, *SMALL], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stderr == ""
    assert "Held-out evaluation" in done.stdout and "SFT: " in done.stdout
    # not a terminal: the final table is Markdown with every header whole, no line cut
    header = next(line for line in done.stdout.splitlines() if line.startswith("| set"))
    assert [c.strip() for c in header.strip("|").split("|")] == list(COLUMNS)
    assert "…" not in done.stdout
    assert re.search(r"^SFT: \d+/\d+ \(100 %\), .* \(done\)$", done.stdout, re.M)
    for line in done.stdout.splitlines():  # no vLLM, torch or server line among them
        assert not re.search(r"\b(INFO|WARNING|DEBUG)\b|pid=|W\d{4} |confinement", line), line
    log = (run_dir / "logs" / "run.log").read_text()
    assert "Initializing a V1 LLM engine" in log  # vLLM at INFO (run.log_level default)
    assert "(MainProcess pid=" in log


def test_quiet_routes_stderr_and_library_logs_to_the_file_and_restores(tmp_path, capfd):
    import logging
    import os

    with quiet(tmp_path, "warning") as path:
        os.write(2, b"from C\n")
        logging.getLogger("vllm.engine").warning("a library warning")
        logging.getLogger("vllm.engine").info("a library note")
        logging.getLogger("rstar2_trainer.x").warning("the trainer's warning")
        logging.getLogger("some_library").error("anyone's error")  # ray and vllm: own handlers
    os.write(2, b"after\n")
    text = path.read_text()
    assert "from C" in text and "a library warning" in text and "a library note" not in text
    assert "the trainer's warning" in text  # the file has everything at its level
    err = capfd.readouterr().err
    assert "the trainer's warning" in err and "anyone's error" in err and "after" in err
    assert "a library warning" not in err and "from C" not in err
