"""The curriculum's data against the rollout package: SFT examples encode as the agent loop's
stream, and `rstar2-curriculum verify-labels` runs end to end on a tiny model saved to disk."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from rstar2_curriculum import LabelCheckConfig, Problem, SFTSourceConfig, load_sft
from rstar2_curriculum.labels import check_labels

# A small corpus keeps the tokenizer's training short on a loaded machine.
CORPUS = [
    f"What is {i} times {i + 3}? <reason> compute </reason> {i * (i + 3)}" for i in range(200)
]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    from rstar2_rollout.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0, vocab_size=512, corpus=CORPUS)


def test_loaded_sft_examples_encode_with_the_agent_loops_encoder(tmp_path):
    from rstar2_rollout.chat import encode_conversation
    from rstar2_rollout.tiny import build_tokenizer

    rows = [
        {"instruction": "Say hi.", "output": "Hi!"},
        {
            "query": "Weather in Paris?",
            "tools": [{"name": "get_weather", "parameters": {"city": {"type": "str"}}}],
            "answers": [{"name": "get_weather", "arguments": {"city": "Paris"}}],
        },
        {
            "messages": [
                {"role": "user", "content": "2+2?"},
                {
                    "role": "assistant",
                    "content": "<reason>easy</reason>\n<answer>\\boxed{4}</answer>",
                },
            ]
        },
    ]
    path = tmp_path / "mix.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = load_sft([SFTSourceConfig(path=str(path))], seed=0)
    assert len(result.examples) == 3
    tokenizer = build_tokenizer(0, 512, CORPUS)
    for example in result.examples:
        ids, mask = encode_conversation(tokenizer, example.messages, example.tools)  # type: ignore[arg-type]
        assert len(ids) == len(mask) and 0 < sum(mask) < len(mask)
        trained = tokenizer.decode([i for i, m in zip(ids, mask, strict=True) if m])
        assert example.messages[-1].content.removeprefix("<reason>") in trained


def _verify(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rstar2_curriculum.cli", "verify-labels", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_verify_labels_keeps_the_problems_the_model_agrees_with(tmp_path, tiny_model):
    questions = ["What is 6 times 7?", "How many primes are below 20?", "What is 2 to the 10?"]
    first = tmp_path / "problems.jsonl"
    first.write_text(
        "".join(json.dumps({"id": f"p{i}", "question": q, "answer": "12345"}) + "\n"
                for i, q in enumerate(questions))
    )  # fmt: skip
    common = ["--engine", "hf", "--model", str(tiny_model), "--k", "2", "--m", "2",
              "--temperature", "0", "--max-response-tokens", "4", "--system-prompt", "compact"]  # fmt: skip
    done = _verify(str(first), *common, "--out", str(tmp_path / "k1.jsonl"),
                   "--report", str(tmp_path / "r1.json"))  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "r1.json").read_text())["labels"]
    assert [v["samples"] for v in report["verdicts"]] == [2, 2, 2]
    assert sum(report["finish_reasons"].values()) == 6
    assert report["kept"] == 0 and (tmp_path / "k1.jsonl").read_text() == ""

    # Greedy samples repeat: label each problem with what the model said, except the last.
    said = [v["answers"][0] for v in report["verdicts"]]
    assert all(v["answers"][0] == v["answers"][1] for v in report["verdicts"])
    agreeable = [i for i, a in enumerate(said) if a]
    assert agreeable, f"the tiny model answered nothing gradable: {said}"
    relabelled = tmp_path / "relabelled.jsonl"
    agree = agreeable[:-1] or agreeable  # one agreeable problem keeps a wrong label when it can
    rows = [
        {"id": f"p{i}", "question": q, "answer": said[i] if i in agree else "12345"}
        for i, q in enumerate(questions)
    ]
    relabelled.write_text("".join(json.dumps(r) + "\n" for r in rows))
    done = _verify(str(relabelled), *common, "--out", str(tmp_path / "k2.jsonl"),
                   "--report", str(tmp_path / "r2.json"))  # fmt: skip
    assert done.returncode == 0, done.stderr
    kept = [json.loads(line)["id"] for line in (tmp_path / "k2.jsonl").read_text().splitlines()]
    expected = [r["id"] for r in rows if r["answer"] != "12345"]
    assert kept == expected and expected
    assert "kept" in done.stdout


@pytest.mark.slow
def test_agent_mode_runs_the_agent_loop_on_a_sandbox(tiny_model):
    from rstar2_rollout.config import HFEngineConfig
    from rstar2_rollout.engines import build_engine
    from rstar2_sandbox import LocalSandbox, SandboxConfig

    async def go():
        engine = build_engine(HFEngineConfig(model=str(tiny_model)))
        sandbox = LocalSandbox(SandboxConfig())
        await sandbox.start()
        try:
            config = LabelCheckConfig(
                k=2, m=1, mode="agent", max_turns=2, max_response_tokens=24,
                system_prompt="compact", temperature=1.0,
            )  # fmt: skip
            problems = [Problem(id="a", question="1+1?", answer="2")]
            return await check_labels(problems, engine, engine.tokenizer, config, sandbox=sandbox)  # type: ignore[attr-defined]
        finally:
            await sandbox.close()
            await engine.close()

    kept, report = asyncio.run(go())
    assert report.verdicts[0].samples == 2
    assert sum(report.finish_reasons.values()) == 2
    assert set(report.finish_reasons) <= {"answered", "no_tool_call", "max_turns", "max_length"}
    assert [p.id for p in kept] == (["a"] if report.verdicts[0].agree >= 1 else [])
