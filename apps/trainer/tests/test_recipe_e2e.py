"""The paper's recipe on a user's own model and data, end to end (issue 20's test).

Everything a user brings is written to disk in the formats users have, and read back through the
real code path: a model and tokenizer saved as a Hugging Face folder (`model.kind=pretrained`),
an SFT set in chat format plus one in a converter's source format (instruction rows), an RL set
in verl's parquet layout with rows that cleaning must drop and rows that a benchmark file also
holds, and that benchmark file. One run does SFT from the data, the three stages with the
paper's rollout hard-subset pass before the last, and benchmark evaluation; the run directory
must say what was read, cleaned out and decontaminated, and the per-benchmark accuracy.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rstar2_curriculum import generate_problems, sft_traces, write_sft_jsonl
from rstar2_rollout.tiny import build_tiny_model
from rstar2_trainer.rundir import read_metrics

pytestmark = pytest.mark.slow


def _user_data(root: Path) -> dict[str, Path]:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    problems = generate_problems(14, seed=7, difficulty=1)
    rl, bench = problems[:10], problems[8:]  # two problems are in both: decontamination hits
    rows = [
        {
            "data_source": "user/math",
            "prompt": [{"role": "user", "content": p.question}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": p.answer},
            "extra_info": {"index": i},
        }
        for i, p in enumerate(rl)
    ]
    rows.append(  # not an integer answer: the paper's cleaning drops it
        {
            "data_source": "user/math",
            "prompt": [{"role": "user", "content": "What is one third written as a fraction?"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": "1/3"},
            "extra_info": {"index": 99},
        }
    )
    paths = {
        "rl": root / "rl.parquet",
        "bench": root / "mini-aime.jsonl",
        "chat": root / "sft_chat.jsonl",
        "instruction": root / "sft_instruction.jsonl",
    }
    pq.write_table(pa.Table.from_pylist(rows), paths["rl"])
    paths["bench"].write_text(
        "".join(json.dumps({"question": p.question, "answer": p.answer}) + "\n" for p in bench)
    )
    sft_problems = generate_problems(12, seed=11, difficulty=1)
    write_sft_jsonl(sft_traces(sft_problems, seed=0), paths["chat"])
    paths["instruction"].write_text(
        "".join(
            json.dumps({"instruction": f"Repeat the number {n}.", "output": f"{n}"}) + "\n"
            for n in range(6)
        )
    )
    return paths


def test_sft_from_data_then_stages_with_the_hard_pass_and_benchmarks(tmp_path):
    data = _user_data(tmp_path)
    model = build_tiny_model(tmp_path / "model", seed=0, vocab_size=1024, layers=1, hidden_size=64)
    run_dir = tmp_path / "run"
    sources = (
        f"[{{path: {data['chat']}, format: chat}},"
        f" {{path: {data['instruction']}, format: instruction, weight: 0.5}}]"
    )
    args = [
        "tiny",
        f"run.output_dir={run_dir}",
        f"model={{kind: pretrained, path: {model}}}",
        "engine={kind: hf}",
        "scheduler.policy={kind: least_requests}",  # transformers reports no KV size
        "tool.kind=local",
        "verify_service.mode=local",
        f"sft.source={sources}",
        "sft.epochs=1",
        "sft.batch_size=4",
        f"curriculum.source={{kind: parquet, path: {data['rl']}, preset: verl}}",
        "curriculum.batch_size=2",
        "curriculum.tiny.steps=[1,1,1]",
        "curriculum.tiny.max_response_tokens=[32,32,32]",
        "curriculum.tiny.hard_k=2",
        "hard_pass.mode=rollouts",
        "algo.group_size=2",
        f"eval.sources=[{data['bench']}]",
        "eval.synthetic=false",
        "eval.every_stage=true",  # the tiny recipe evaluates only after SFT and at the end
        "eval.benchmark.samples=2",
        "eval.benchmark.max_response_tokens=32",
        "eval.benchmark.max_turns=2",
        "run.trackers=[jsonl]",
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "rstar2_trainer.cli", *args],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]

    report = json.loads((run_dir / "data_report.json").read_text())
    assert report["rows_read"] == 11 and report["loaded"] == 11
    assert sum(report["cleaned_out"].values()) >= 1  # the fraction answer
    assert report["decontamination"]["hits"] == 2  # the two problems the benchmark holds
    assert report["kept"] == 8
    sft = json.loads((run_dir / "sft_report.json").read_text())
    assert [s["used"] for s in sft["sources"]] == [12, 3]  # weight 0.5 keeps half of six

    records = read_metrics(run_dir)
    assert [r["step"] for r in records if r["phase"] == "rl"] == [1, 2, 3]
    (hard,) = [r for r in records if r["phase"] == "hard_pass"]
    assert hard["problems"] == 8 and hard["k"] == 2 and hard["rolled_now"] == 8
    assert hard["kept"] + hard["solved_all"] == 8
    assert (run_dir / "hard_pass" / "tiny3-hard.jsonl").read_text().count("\n") == 8
    bench = [r for r in records if r["phase"] == "benchmark"]
    assert [r["when"] for r in bench] == [
        "after_sft",
        "after_tiny1",
        "after_tiny2",
        "after_tiny3-hard",
    ]
    for r in bench:
        assert r["benchmark"] == "mini-aime" and r["problems"] == 6 and r["samples"] == 2
        assert 0.0 <= r["accuracy"] <= 1.0 and r["trajectories"] == 12
    assert "mini-aime" in proc.stdout  # the final table has the benchmark's rows
    assert not (run_dir / "heldout.jsonl").exists()  # eval.synthetic=false
