"""Arena-Hard: pairwise judgments against the baseline's answers, as arena-hard-auto judges them.

No maintained package ships Arena-Hard's method (arena-hard-auto is a repository of scripts;
LMArena's `arena-rank` ranks arena battles with JAX and pins numpy), so this module follows the
published code of lmarena/arena-hard-auto at commit 196f6b826783b3da7310e361a805fa36f0be83f3:
- the judge's system prompt and the benchmark's baseline (`utils/judge_utils.py`, JUDGE_SETTINGS),
  the user template, verdict regexes, temperature and max tokens (`config/arena-hard-v*.yaml`);
- two games per question, the baseline as assistant A, then swapped (`gen_judgment.py`), and the
  verdict as the last match of the first regex that matches the upper-cased judgment
  (`get_score`);
- a question's battle scores: each game's label mapped to the model's scores, a strong verdict
  counted `WEIGHT` = 3 times, a game without a verdict dropping the question (`show_result.py`,
  `load_judgments`);
- answer style metadata (`utils/add_markdown_info.py`): tiktoken's o200k_base (gpt-4o) token
  count, then header, list and bold counts with code blocks removed; offline the encoding must
  be in tiktoken's cache;
- published judgments (`data/<bench>/model_judgment/<judge>/*.jsonl`, with `model_answer/`) read
  as `Battle`s, in show_result's order, so other models join the style-controlled fit.
The win rates themselves are `arena_rates.py`'s. The judge is any OpenAI-compatible chat
endpoint (`JudgeEndpoint`): its key is handed in by the caller, held in memory and sent only in
the request header. Not covered: generating the model's answers (the caller does, with
`arena_messages`, greedy); v2.0's creative-writing category (its own judge prompt and baseline).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Collection
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import httpx

from rstar2_evaluator.scorers._data import ScorerDataError, read_jsonl, require_fields
from rstar2_evaluator.scorers.arena_rates import Battle

JUDGE_PROMPT = "Please act as an impartial judge and evaluate the quality of the responses provided by two AI assistants to the user prompt displayed below. You will be given assistant A's answer and assistant B's answer. Your job is to evaluate which assistant's answer is better.\n\nBegin your evaluation by generating your own answer to the prompt. You must provide your answers before judging any answers.\n\nWhen evaluating the assistants' answers, compare both assistants' answers with your answer. You must identify and correct any mistakes or inaccurate information.\n\nThen consider if the assistant's answers are helpful, relevant, and concise. Helpful means the answer correctly responds to the prompt or follows the instructions. Note when user prompt has any ambiguity or more than one interpretation, it is more helpful and appropriate to ask for clarifications or more information from the user than providing an answer based on assumptions. Relevant means all parts of the response closely connect or are appropriate to what is being asked. Concise means the response is clear and not verbose or excessive.\n\nThen consider the creativity and novelty of the assistant's answers when needed. Finally, identify any missing important information in the assistants' answers that would be beneficial to include when responding to the user prompt.\n\nAfter providing your explanation, you must output only one of the following choices as your final verdict with a label:\n\n1. Assistant A is significantly better: [[A>>B]]\n2. Assistant A is slightly better: [[A>B]]\n3. Tie, relatively the same: [[A=B]]\n4. Assistant B is slightly better: [[B>A]]\n5. Assistant B is significantly better: [[B>>A]]\n\nExample output: \"My final verdict is tie: [[A=B]]\"."
PROMPT_TEMPLATE = "<|User Prompt|>\n{QUESTION}\n\n<|The Start of Assistant A's Answer|>\n{ANSWER_A}\n<|The End of Assistant A's Answer|>\n\n<|The Start of Assistant B's Answer|>\n{ANSWER_B}\n<|The End of Assistant B's Answer|>"
VERDICT_PATTERNS = (r"\[\[([AB<>=]+)\]\]", r"\[([AB<>=]+)\]")
BASELINES = {"arena-hard-v0.1": "gpt-4-0314", "hard_prompt": "o3-mini-2025-01-31"}
JUDGE_MAX_TOKENS = {"arena-hard-v0.1": 4096, "arena-hard-v2.0": 16000}
WEIGHT = 3
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
class JudgeEndpoint:
    """The judge the games go to: an OpenAI-compatible chat endpoint (base URL ending in /v1),
    the model's name there, and its key. The key is the caller's to read (rstar2-eval reads the
    variable `judge.api_key_env` names); it stays in memory, out of repr, and goes only into the
    request's Authorization header."""

    url: str
    model: str
    api_key: str = field(default="", repr=False)
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
    judge: JudgeEndpoint,
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
    encoding = _o200k()
    if isinstance(encoding, Exception):  # fetched on first use; offline it must be cached
        raise ScorerDataError(
            f"style control needs tiktoken's o200k_base encoding ({type(encoding).__name__}): "
            "run once online, or set TIKTOKEN_CACHE_DIR to a folder that holds it"
        )
    return {"token_len": len(encoding.encode(answer, disallowed_special=()))} | style_counts(answer)


@cache
def _o200k() -> Any:
    """tiktoken's o200k_base, or why it cannot be had (asked once per process)."""
    try:
        import tiktoken

        return tiktoken.get_encoding("o200k_base")
    except Exception as e:
        return e


def load_published(
    folder: Path, judge: str, *, category: str, exclude: Collection[str] = ()
) -> list[Battle]:
    """The judgments `judge` published in an arena-hard-auto data folder, as show_result reads
    them: `model_judgment/<judge>/*.jsonl` by file name, records in file order, those of
    `category` whose two games both have a verdict. Each battle carries its answer's and the
    baseline's style from `model_answer/<model>.jsonl` (the record's `metadata`, else computed
    by `style_metadata`; None where neither can be had). Models in `exclude` are left out (a
    run's own model replaces its published judgments). No such folder: no battles."""
    directory = folder / "model_judgment" / judge
    if not directory.is_dir():
        return []
    answers: dict[str, dict[str, dict[str, Any]]] = {}

    def style_of(model: str, uid: str) -> dict[str, Any] | None:
        if model not in answers:
            path = folder / "model_answer" / f"{model}.jsonl"
            answers[model] = {}
            if path.is_file():
                rows = read_jsonl(path, what=f"answers of {model}", download=ARENA_DOWNLOAD)
                answers[model] = {str(r.get("uid")): r for r in rows}
        record = answers[model].get(uid)
        if record is None:
            return None
        if "metadata" not in record:
            try:
                record["metadata"] = style_metadata(answer_text(record))
            except (ScorerDataError, KeyError, IndexError, TypeError):
                return None
        return record["metadata"]

    battles = []
    for path in sorted(directory.glob("*.jsonl")):
        for n, row in enumerate(read_jsonl(path, what="judgments", download=ARENA_DOWNLOAD), 1):
            require_fields(row, ("uid", "model", "category", "games"), where=f"{path}:{n}")
            name = str(row["model"]).split("/")[-1]  # show_result drops a model's path
            games = row["games"]
            if row["category"] != category or name in exclude or not isinstance(games, list):
                continue
            scores = battle_scores(games) if len(games) == 2 and None not in games else None
            if scores is None:
                continue
            uid = str(row["uid"])
            battles.append(
                Battle(
                    name,
                    tuple(scores),
                    style_of(str(row["model"]), uid),
                    style_of(BASELINES[category], uid),
                )
            )
    return battles


async def _chat(
    client: httpx.AsyncClient, judge: JudgeEndpoint, messages: list[dict[str, str]]
) -> str:
    headers = {"Authorization": f"Bearer {judge.api_key}"} if judge.api_key else {}
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
                status = e.response.status_code if isinstance(e, httpx.HTTPStatusError) else None
                raise RuntimeError(
                    f"judge {judge.model} at {judge.url} failed: {type(e).__name__}"
                    + (f" (HTTP {status})" if status else "")
                ) from None
            await asyncio.sleep(2**attempt)
    raise AssertionError("unreachable")
