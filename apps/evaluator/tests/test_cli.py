"""`rstar2-eval` as a user runs it: one-line errors that write nothing, and (slow) real runs of a
tiny model built on the spot, killed and resumed, compared, with vLLM and with transformers."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from rstar2_evaluator.cli import main

QUESTIONS = [("What is 6 times 7?", "42"), ("What is 2 to the 10th?", "1024"), ("9 - 4?", "5")]


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "three.jsonl"
    path.write_text("".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in QUESTIONS))
    return path


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("rstar2-eval: ") and err.count("\n") == 1, err
    return err


def test_an_unknown_benchmark(tmp_path, capsys):
    assert main(["run", str(tmp_path), "aime23", "--out", str(tmp_path / "out")]) == 2
    assert "unknown benchmark 'aime23'" in _one_line_error(capsys)
    assert not (tmp_path / "out").exists()


def test_a_dataset_without_the_needed_fields(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"problem": "1+1", "solution": "2"}\n')
    assert main(["run", str(tmp_path), str(bad), "--out", str(tmp_path / "out")]) == 2
    assert "benchmark.question_field=..." in _one_line_error(capsys)
    assert not (tmp_path / "out").exists()


def test_an_unreachable_endpoint_writes_nothing(tmp_path, data, capsys):
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = tmp_path / "out"
    code = main(
        [
            "run",
            f"http://127.0.0.1:{port}/v1",
            str(data),
            "model.tokenizer=/nowhere",
            "--out",
            str(out),
        ]
    )
    assert code == 2
    assert "model.tokenizer='/nowhere' is not a tokenizer folder" in _one_line_error(capsys)
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer_config.json").write_text("{}")
    code = main(
        [
            "run",
            f"http://127.0.0.1:{port}/v1",
            str(data),
            f"model.tokenizer={tmp_path / 'tok'}",
            "--out",
            str(out),
        ]
    )
    assert code == 2
    assert f"cannot reach the endpoint http://127.0.0.1:{port}/v1 (ConnectError" in _one_line_error(
        capsys
    )
    assert not out.exists()


def test_an_unreachable_sandbox_server_writes_nothing(tmp_path, data, capsys):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"max_position_embeddings": 4096}')
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = tmp_path / "out"
    args = ["run", str(model), str(data), "tool.kind=grpc", f"tool.address=127.0.0.1:{port}"]
    assert main([*args, "--out", str(out)]) == 2
    assert f"no sandbox server answers at 127.0.0.1:{port}" in _one_line_error(capsys)
    assert not out.exists()


def test_a_folder_that_is_no_model(tmp_path, data, capsys):
    assert main(["run", str(tmp_path), str(data), "--out", str(tmp_path / "out")]) == 2
    assert "is not a model folder (no config.json)" in _one_line_error(capsys)


def test_a_bad_override(tmp_path, data, capsys):
    assert main(["run", str(tmp_path), str(data), "temperature=-1"]) == 2
    err = _one_line_error(capsys)
    assert err == "rstar2-eval: temperature: Input should be greater than or equal to 0 (got -1)\n"


def test_every_bad_override_is_a_line(tmp_path, data, capsys):
    argv = ["run", str(tmp_path), str(data), "temperature=-1", "samples=0", "pass_k.9=3"]
    assert main(argv) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "rstar2-eval: 3 mistakes in paper.yaml:"  # the trainer's words
    assert sorted(lines[1:]) == [
        "rstar2-eval: override pass_k.9: index 9 is out of range: pass_k has 5 items (0-4 "
        "replace one, 5 appends)",
        "rstar2-eval: samples: Input should be greater than 0 (got 0)",
        "rstar2-eval: temperature: Input should be greater than or equal to 0 (got -1)",
    ]


@pytest.mark.parametrize("argv", [["--help-config"], ["run", "--help-config"]])
def test_help_config_lists_the_keys(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "  samples: int = 16  -- Samples per problem (n)." not in out  # top level: no indent
    assert "samples: int = 16  -- Samples per problem (n)." in out
    assert "model (kind: local)  -- " in out and "model (kind: openai)  -- " in out
    assert "  model.engine.max_num_seqs: int = 128" in out  # a variant inside a variant


def test_help_config_of_a_section_and_of_no_such_section(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--help-config", "verify"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert all(line.startswith(("verify", "  verify.")) for line in out.splitlines() if line)
    with pytest.raises(SystemExit) as exit_:
        main(["--help-config", "nope"])
    assert exit_.value.code == 2
    assert "no config section 'nope': choose one of reward, model, benchmark" in _one_line_error(
        capsys
    )


def test_overrides_may_follow_options(tmp_path, data, capsys):
    argv = ["run", str(tmp_path), str(data), "--config", "quick", "samples=0"]
    assert main(argv) == 2
    assert "samples" in capsys.readouterr().err.strip().splitlines()[-1]


def test_policy_trained_with_another_system_prompt(tmp_path, tiny_model, data, capsys):
    policy = tmp_path / "policy"
    shutil.copytree(tiny_model, policy)
    (policy / "rstar2.json").write_text('{"system_prompt": "compact", "step": 3}')
    assert main(["run", str(policy), str(data), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"rstar2-eval: {policy} was trained with the compact system prompt (its "
        "rstar2.json); add system_prompt=compact"
    ]
    assert not (tmp_path / "out").exists()


def test_benchmarks_lists_the_names_kinds_and_the_paper_suite(capsys):
    assert main(["benchmarks"]) == 0
    lines = {line.split()[0]: line.split()[1] for line in capsys.readouterr().out.splitlines()}
    names = "aime24 aime25 aime26 hmmt_feb25 brumo25 beyond_aime math500 gpqa_diamond ifeval"
    for name in [*names.split(), "bfcl_v3", "arena_hard", "livecodebench", "paper"]:
        assert name in lines, name
    assert (lines["aime26"], lines["gpqa_diamond"], lines["ifeval"]) == (
        "math",
        "choice",
        "instruction",
    )
    assert (lines["livecodebench"], lines["paper"]) == ("code", "suite")


# ------------------------------------------------------------------ real runs (slow)


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "rstar2_evaluator.cli", *args]


FAST = [
    "samples=2",
    "max_turns=2",
    "max_response_tokens=16",
    "concurrency=1",
    "tool.sandbox.workers=1",
]


@pytest.mark.slow
def test_a_killed_run_resumes_without_redoing_samples(tmp_path, tiny_model, data):
    out = tmp_path / "run"
    args = _cli(
        "run",
        str(tiny_model),
        str(data),
        "model.engine=transformers",
        *FAST,
        "--out",
        str(out),
        "--no-progress",
    )
    log = tmp_path / "first.log"
    with log.open("w") as stderr:
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=stderr)
    samples = out / "samples.jsonl"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if samples.exists() and samples.read_bytes().count(b"\n") >= 2:
            break
        time.sleep(0.05)
    assert proc.poll() is None, log.read_text()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    before = [json.loads(line) for line in samples.read_text().splitlines() if line.endswith("}")]
    assert 2 <= len(before) < 6
    assert not (out / "summary.json").exists()  # killed: nothing says finished

    done = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    after = [json.loads(line) for line in samples.read_text().splitlines()]
    keys = [(r["problem_id"], r["sample_index"]) for r in after]
    assert len(keys) == len(set(keys)) == 6
    assert after[: len(before)] == before  # finished samples were kept, not redone
    summary = json.loads((out / "summary.json").read_text())
    assert summary["samples"] == 6 and summary["samples_per_problem"] == 2


@pytest.mark.slow
def test_vllm_run_then_compare(tmp_path, tiny_model, data):
    runs = []
    for seed in (0, 1):
        out = tmp_path / f"run{seed}"
        args = _cli(
            "run",
            str(tiny_model),
            str(data),
            "model.engine=vllm",
            "model.kv_cache_gib=0.25",
            *FAST,
            f"seed={seed}",
            "--out",
            str(out),
            "--no-progress",
        )
        done = subprocess.run(args, capture_output=True, text=True, timeout=400)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "pass@1 (avg@n)" in done.stdout and "finish reason" in done.stdout
        runs.append(out)
    cmp = subprocess.run(
        _cli("compare", *map(str, runs), "--json", str(tmp_path / "cmp.json")),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert cmp.returncode == 0, cmp.stderr
    assert "B - A" in cmp.stdout
    assert len(json.loads((tmp_path / "cmp.json").read_text())["problems"]) == 3
