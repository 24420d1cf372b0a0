"""Arena-Hard: pairwise judgments against the baseline's answers, win rates as arena-hard-auto.

No maintained package ships Arena-Hard's computation (arena-hard-auto is a repository of scripts;
LMArena's `arena-rank` ranks arena battles with JAX and pins numpy), so this module follows the
published code of lmarena/arena-hard-auto at commit 196f6b826783b3da7310e361a805fa36f0be83f3:
- the judge's system prompt and the benchmark's baseline (`utils/judge_utils.py`, JUDGE_SETTINGS),
  the user template, verdict regexes, temperature and max tokens (`config/arena-hard-v*.yaml`);
- two games per question, the baseline as assistant A, then swapped (`gen_judgment.py`), and the
  verdict as the last match of the first regex that matches the upper-cased judgment
  (`get_score`);
- battles: a game's label mapped to scores, a strong verdict counted `weight=3` times, a game
  without a verdict dropping the question (`show_result.py`, `load_judgments`);
- the plain win rate: mean of 100 bootstrap means (resampling battles), interval the 5 % and
  95 % quantiles (`print_leaderboard`);
- the style-controlled win rate: a Bradley-Terry model over +1/-1 model features plus
  normalised style differences (answer length, header / list / bold density), fitted with LBFGS
  on 100 bootstrap resamples; median, 5 % and 95 % quantiles of the implied win probability
  against the baseline (`print_leaderboard_with_style_features`, `utils/math_utils.py`). Style
  counts are `utils/add_markdown_info.py`'s (code blocks removed); the length is tiktoken's
  o200k_base (gpt-4o) token count, so style control needs that encoding available offline.
Bootstrap draws come from a numpy/torch generator seeded by the caller (the original uses the
global ones, unseeded). The judge is any OpenAI-compatible chat endpoint; its key is read from
the environment variable the caller names and only sent in the request header. Not covered:
generating the model's answers (the caller does, with `arena_messages`, greedy).
"""

from __future__ import annotations

import asyncio
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from rstar2_evaluator.scorers._data import ScorerDataError, read_jsonl, require_fields

JUDGE_PROMPT = "Please act as an impartial judge and evaluate the quality of the responses provided by two AI assistants to the user prompt displayed below. You will be given assistant A's answer and assistant B's answer. Your job is to evaluate which assistant's answer is better.\n\nBegin your evaluation by generating your own answer to the prompt. You must provide your answers before judging any answers.\n\nWhen evaluating the assistants' answers, compare both assistants' answers with your answer. You must identify and correct any mistakes or inaccurate information.\n\nThen consider if the assistant's answers are helpful, relevant, and concise. Helpful means the answer correctly responds to the prompt or follows the instructions. Note when user prompt has any ambiguity or more than one interpretation, it is more helpful and appropriate to ask for clarifications or more information from the user than providing an answer based on assumptions. Relevant means all parts of the response closely connect or are appropriate to what is being asked. Concise means the response is clear and not verbose or excessive.\n\nThen consider the creativity and novelty of the assistant's answers when needed. Finally, identify any missing important information in the assistants' answers that would be beneficial to include when responding to the user prompt.\n\nAfter providing your explanation, you must output only one of the following choices as your final verdict with a label:\n\n1. Assistant A is significantly better: [[A>>B]]\n2. Assistant A is slightly better: [[A>B]]\n3. Tie, relatively the same: [[A=B]]\n4. Assistant B is slightly better: [[B>A]]\n5. Assistant B is significantly better: [[B>>A]]\n\nExample output: \"My final verdict is tie: [[A=B]]\"."
PROMPT_TEMPLATE = "<|User Prompt|>\n{QUESTION}\n\n<|The Start of Assistant A's Answer|>\n{ANSWER_A}\n<|The End of Assistant A's Answer|>\n\n<|The Start of Assistant B's Answer|>\n{ANSWER_B}\n<|The End of Assistant B's Answer|>"
VERDICT_PATTERNS = (r"\[\[([AB<>=]+)\]\]", r"\[([AB<>=]+)\]")
BASELINES = {"arena-hard-v0.1": "gpt-4-0314", "hard_prompt": "o3-mini-2025-01-31"}
JUDGE_MAX_TOKENS = {"arena-hard-v0.1": 4096, "arena-hard-v2.0": 16000}
WEIGHT = 3
_BASELINE = "\x00baseline"  # the baseline's column; sorts before any model name
_LABEL_TO_SCORE = {
    "A>B": [1.0], "A>>B": [1.0] * WEIGHT, "A=B": [0.5], "A<<B": [0.0] * WEIGHT, "A<B": [0.0],
    "B>A": [0.0], "B>>A": [0.0] * WEIGHT, "B=A": [0.5], "B<<A": [1.0] * WEIGHT, "B<A": [1.0],
}  # fmt: skip
ARENA_DOWNLOAD = (
    "question.jsonl and model_answer/<baseline>.jsonl of the benchmark from "
    "lmarena/arena-hard-auto data/<bench>/ and pass --data FOLDER"
)


@dataclass(frozen=True)
class ArenaQuestion:
    uid: str
    category: str
    prompt: str


@dataclass(frozen=True)
class JudgeConfig:
    """An OpenAI-compatible judge: base URL (…/v1), model name, and the env var with its key."""

    url: str
    model: str
    api_key_env: str = "OPENAI_API_KEY"
    temperature: float = 0.0
    max_tokens: int = 4096
    timeout_s: float = 600.0


def load_arena(folder: Path) -> tuple[list[ArenaQuestion], dict[str, dict[str, Any]]]:
    """Questions and the baseline's answer records (by uid) from arena-hard-auto's layout."""
    rows = read_jsonl(
        folder / "question.jsonl", what="Arena-Hard questions", download=ARENA_DOWNLOAD
    )
    questions = []
    for n, row in enumerate(rows, 1):
        require_fields(row, ("uid", "category", "prompt"), where=f"{folder / 'question.jsonl'}:{n}")
        if row["category"] not in BASELINES:
            raise ScorerDataError(f"Arena-Hard category {row['category']!r} has no baseline here")
        questions.append(ArenaQuestion(str(row["uid"]), str(row["category"]), str(row["prompt"])))
    baselines: dict[str, dict[str, Any]] = {}
    for name in sorted({BASELINES[q.category] for q in questions}):
        path = folder / "model_answer" / f"{name}.jsonl"
        for row in read_jsonl(
            path, what=f"Arena-Hard baseline answers ({name})", download=ARENA_DOWNLOAD
        ):
            require_fields(row, ("uid", "messages"), where=str(path))
            baselines[str(row["uid"])] = row
    missing = [q.uid for q in questions if q.uid not in baselines]
    if missing:
        raise ScorerDataError(
            f"baseline answers lack {len(missing)} questions, first uid {missing[0]}"
        )
    return questions, baselines


def answer_text(record: dict[str, Any]) -> str:
    """The answer in an arena-hard-auto answer record (last message's content.answer)."""
    return str(record["messages"][-1]["content"]["answer"])


def arena_messages(question: ArenaQuestion) -> list[dict[str, str]]:
    """The default template: the question as the only user message."""
    return [{"role": "user", "content": question.prompt}]


def judge_messages(question: ArenaQuestion, answer_a: str, answer_b: str) -> list[dict[str, str]]:
    """The judge's conversation for one game (assistant A's answer first)."""
    user = PROMPT_TEMPLATE.format(QUESTION=question.prompt, ANSWER_A=answer_a, ANSWER_B=answer_b)
    return [{"role": "system", "content": JUDGE_PROMPT}, {"role": "user", "content": user}]


def extract_verdict(judgment: str) -> str | None:
    """arena-hard-auto's `get_score`: the last match of the first pattern that matches."""
    for pattern in VERDICT_PATTERNS:
        matches = [m for m in re.findall(pattern, judgment.upper()) if m != ""]
        if matches:
            return matches[-1].strip("\n")
    return None


async def judge_games(
    client: httpx.AsyncClient,
    judge: JudgeConfig,
    question: ArenaQuestion,
    answer: str,
    baseline: str,
) -> list[dict[str, Any]]:
    """Both games for one question: the baseline as A, then the model as A."""
    games = []
    for a, b in ((baseline, answer), (answer, baseline)):
        messages = judge_messages(question, a, b)
        text = await _chat(client, judge, messages)
        games.append({"score": extract_verdict(text), "judgment": text, "prompt": messages})
    return games


def battle_scores(games: list[dict[str, Any]]) -> list[float] | None:
    """The model's scores from a question's two games (None when a game has no verdict)."""
    first, second = games
    if first["score"] not in _LABEL_TO_SCORE or second["score"] not in _LABEL_TO_SCORE:
        return None
    return _LABEL_TO_SCORE[second["score"]] + [1 - s for s in _LABEL_TO_SCORE[first["score"]]]


def win_rate(scores: list[float], *, seed: int, rounds: int = 100) -> dict[str, float]:
    """The plain win rate against the baseline with its 90 % bootstrap interval."""
    if not scores:
        raise ValueError("no battles to score")
    rng = np.random.default_rng(seed)
    values = np.asarray(scores, dtype=np.float64)
    means = np.array([rng.choice(values, size=len(values)).mean() for _ in range(rounds)])
    return {
        "score": float(means.mean()),
        "lower": float(np.quantile(means, 0.05)),
        "upper": float(np.quantile(means, 0.95)),
    }


def style_counts(answer: str) -> dict[str, Any]:
    """Markdown counts of an answer with its code blocks removed (add_markdown_info.py)."""
    for block in re.findall("```([^`]*)```", answer):
        answer = answer.replace(block, "")
    m = re.MULTILINE
    return {
        "header_count": {f"h{i}": len(re.findall(rf"^#{{{i}}}\s", answer, m)) for i in range(1, 7)},
        "list_count": {
            "ordered": len(re.findall(r"^\s*\d+\.\s", answer, m)),
            "unordered": len(re.findall(r"^\s*[-*+]\s", answer, m)),
        },
        "bold_count": {
            "**": len(re.findall(r"\*\*[^*\n]+\*\*", answer)),
            "__": len(re.findall(r"__[^_\n]+__", answer)),
        },
    }


def style_metadata(answer: str) -> dict[str, Any]:
    """arena-hard-auto's answer metadata: o200k token length, then the markdown counts."""
    try:
        import tiktoken

        encoder = tiktoken.get_encoding("o200k_base")
    except Exception as e:  # the encoding is fetched on first use; offline it must be cached
        raise ScorerDataError(
            f"style control needs tiktoken's o200k_base encoding ({type(e).__name__}): run once "
            "online, or set TIKTOKEN_CACHE_DIR to a folder that holds it"
        ) from None
    return {"token_len": len(encoder.encode(answer, disallowed_special=()))} | style_counts(answer)


def style_controlled_win_rate(
    battles: list[tuple[str, list[float], dict[str, Any], dict[str, Any]]],
    *,
    seed: int,
    rounds: int = 100,
) -> dict[str, dict[str, float]]:
    """Per model, the win rate against the baseline with length and markdown controlled.

    `battles` holds (model, the question's battle scores, model answer metadata, baseline answer
    metadata) for every judged question of every model. As in arena-hard-auto, all models are
    fitted together and the style features are centred over all their battles: a model is
    compared at the pool's average style, so a pool of one model controls nothing (include the
    published judgments of other models).
    """
    import torch

    rows = [(m, s, mm, bm) for m, ss, mm, bm in battles for s in ss]
    if not rows:
        raise ValueError("no battles to score")
    model = torch.tensor([_features(mm) for _, _, mm, _ in rows], dtype=torch.float32)
    base = torch.tensor([_features(bm) for _, _, _, bm in rows], dtype=torch.float32)
    style = torch.zeros_like(model)
    style[:, 0] = (model[:, 0] - base[:, 0]) / (model[:, 0] + base[:, 0])
    model_density = model[:, 1:] / (model[:, :1] + 1)
    base_density = base[:, 1:] / (base[:, :1] + 1)
    style[:, 1:] = (model_density - base_density) / (model_density + base_density + 1)
    style = (style - style.mean(dim=0)) / style.std(dim=0)
    style = torch.nan_to_num(style)  # a feature constant over all battles carries no signal
    # one_hot_encode: columns sorted by name, the battle's model +1, the baseline -1.
    names = sorted({m for m, _, _, _ in rows} | {_BASELINE})
    one_hot = torch.zeros(len(rows), len(names))
    for i, (m, _, _, _) in enumerate(rows):
        one_hot[i, names.index(m)] = 1
        one_hot[i, names.index(_BASELINE)] = -1
    features = torch.cat([one_hot, style], dim=1)
    outcomes = torch.tensor([s for _, s, _, _ in rows], dtype=torch.float32)
    rng = np.random.default_rng(seed)
    boot = rng.integers(0, len(rows), size=(rounds, len(rows)))
    coefs = torch.stack([_fit_bt(features[idx], outcomes[idx]) for idx in boot])[:, : len(names)]
    exp = torch.exp(coefs)
    b = names.index(_BASELINE)
    out = {}
    for name in names:
        if name == _BASELINE:
            continue
        probs = exp[:, names.index(name)] / (exp[:, names.index(name)] + exp[:, b])
        out[name] = {
            "score": float(torch.quantile(probs, 0.5)),
            "lower": float(torch.quantile(probs, 0.05)),
            "upper": float(torch.quantile(probs, 0.95)),
        }
    return out


def _features(meta: dict[str, Any]) -> list[float]:
    """token_len, then each count group summed, in the metadata's key order (as the original)."""
    return [float(v if isinstance(v, int) else sum(v.values())) for v in meta.values()]


def _fit_bt(features: Any, outcomes: Any) -> Any:
    """math_utils.fit_pairwise_model with loss "bt": LBFGS, lr 0.1, 50 iterations, tol 1e-9."""
    import torch
    import torch.nn.functional as F

    logits = torch.nn.Parameter(torch.full((features.shape[1],), 0.5))
    optimizer = torch.optim.LBFGS(
        [logits], lr=0.1, max_iter=50, tolerance_grad=1e-9, tolerance_change=1e-9
    )

    def closure() -> Any:
        optimizer.zero_grad()
        loss = F.binary_cross_entropy_with_logits(features @ logits, outcomes, reduction="sum")
        loss.backward()
        return loss

    optimizer.step(closure)
    return logits.detach()


async def _chat(
    client: httpx.AsyncClient, judge: JudgeConfig, messages: list[dict[str, str]]
) -> str:
    key = os.environ.get(judge.api_key_env, "")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = {
        "model": judge.model,
        "messages": messages,
        "temperature": judge.temperature,
        "max_tokens": judge.max_tokens,
    }
    url = judge.url.rstrip("/") + "/chat/completions"
    for attempt in range(3):
        try:
            response = await client.post(url, json=body, headers=headers, timeout=judge.timeout_s)
            response.raise_for_status()
            return str(response.json()["choices"][0]["message"]["content"])
        except httpx.HTTPError as e:
            if attempt == 2:
                raise RuntimeError(
                    f"judge {judge.model} at {judge.url} failed: {type(e).__name__}"
                ) from None
            await asyncio.sleep(2**attempt)
    raise AssertionError("unreachable")
