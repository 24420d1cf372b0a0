"""IFEval: Google's instruction-following checks, scored by the checkers lm-eval ships.

The verdicts come from `lm_eval.tasks.ifeval` (lm-eval 0.4.13): its `instructions_registry` is
Google's `instruction_following_eval` registry, and its `utils.process_results` runs the strict
check (each instruction on the response) and the loose one (also on the response without its
first line, its last line, both, and without `*`), as Google's `evaluation_lib` does. Nothing
here decides whether an instruction is followed. `summarize_ifeval` aggregates with lm-eval's own
functions: prompt level is the share of prompts whose every instruction holds, instruction level
the share of all instructions (`agg_inst_level_acc`). The paper's table reports strict, prompt
level.

Two things the checkers need at run time are fixed here, before lm-eval's module is imported:
- NLTK's English Punkt parameters (`punkt_tab`), used by `number_sentences` and
  `capital_word_frequency`. lm-eval downloads them on import when nltk cannot find them; this
  package ships them (`nltk_data/`, MIT, see its NOTICE) and puts them first on nltk's path, so
  no download is tried and every machine splits sentences the same way. nltk >= 3.10 refuses a
  data file with more than one hard link (an installer's hard-linked cache makes such files), so
  those are copied to a private temporary folder first.
- langdetect draws random numbers; its seed is set to 0 (`DetectorFactory.seed`) so that the
  language checks give one verdict per text. Google's reference leaves it unseeded.
- A few published arguments are outside what a checker accepts (keywords:letter_frequency with
  the letter `#` or `!`, keys 1122 and 1129), and the checker then draws its argument from
  Python's `random`. `score_ifeval` seeds that draw with the problem's key and restores the
  caller's random state afterwards, so a response gets the same verdict on every run.

Prompt: the benchmark's default template is the prompt alone as one user turn, greedy
(lm-eval's ifeval.yaml: `doc_to_text: prompt`, temperature 0, up to 1280 new tokens).
Not covered: stripping a reasoning block from a response (pass the final answer text).
"""

from __future__ import annotations

import atexit
import functools
import random
import shutil
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from rstar2_evaluator.scorers._data import ScorerDataError, read_jsonl, require_fields

IFEVAL_DOWNLOAD = (
    "input_data.jsonl from google-research/google-research instruction_following_eval/data "
    "(or ifeval_input_data.jsonl from the google/IFEval dataset) and pass --data PATH"
)
MAX_NEW_TOKENS = 1280
_NLTK_DATA = Path(__file__).parent / "nltk_data"


@dataclass(frozen=True)
class IFEvalProblem:
    """One IFEval prompt with its instructions and their arguments, as published."""

    key: int
    prompt: str
    instruction_id_list: tuple[str, ...]
    kwargs: tuple[dict[str, Any], ...]


@dataclass(frozen=True)
class IFEvalVerdict:
    """Per-instruction verdicts of one response, strict and loose."""

    strict: tuple[bool, ...]
    loose: tuple[bool, ...]

    @property
    def prompt_strict(self) -> bool:
        return all(self.strict)

    @property
    def prompt_loose(self) -> bool:
        return all(self.loose)


def load_ifeval(path: Path) -> list[IFEvalProblem]:
    """Google's `input_data.jsonl` (or the hub's copy, whose kwargs list every key as null)."""
    problems = []
    for n, row in enumerate(read_jsonl(path, what="IFEval data", download=IFEVAL_DOWNLOAD), 1):
        require_fields(row, ("key", "prompt", "instruction_id_list", "kwargs"), where=f"{path}:{n}")
        if len(row["kwargs"]) != len(row["instruction_id_list"]):
            raise ScorerDataError(f"{path}:{n}: kwargs and instruction_id_list differ in length")
        problems.append(
            IFEvalProblem(
                key=int(row["key"]),
                prompt=str(row["prompt"]),
                instruction_id_list=tuple(row["instruction_id_list"]),
                kwargs=tuple(dict(k) for k in row["kwargs"]),
            )
        )
    return problems


def ifeval_messages(problem: IFEvalProblem) -> list[dict[str, str]]:
    """The default template: the prompt as the only user message (no system prompt)."""
    return [{"role": "user", "content": problem.prompt}]


def score_ifeval(problem: IFEvalProblem, response: str) -> IFEvalVerdict:
    """Strict and loose verdicts of `response` from lm-eval's `process_results`."""
    utils = _reference()
    unknown = [i for i in problem.instruction_id_list if i not in _registry().INSTRUCTION_DICT]
    if unknown:
        raise ScorerDataError(f"IFEval key {problem.key}: unknown instruction ids {unknown}")
    doc = {
        "key": problem.key,
        "prompt": problem.prompt,
        "instruction_id_list": list(problem.instruction_id_list),
        "kwargs": [dict(k) for k in problem.kwargs],
    }
    state = random.getstate()
    random.seed(problem.key)
    try:
        out = utils.process_results(doc, [response])
    finally:
        random.setstate(state)
    return IFEvalVerdict(
        strict=tuple(bool(v) for v in out["inst_level_strict_acc"]),
        loose=tuple(bool(v) for v in out["inst_level_loose_acc"]),
    )


def summarize_ifeval(verdicts: list[IFEvalVerdict]) -> dict[str, float]:
    """The four IFEval metrics, aggregated as lm-eval's ifeval.yaml aggregates them."""
    if not verdicts:
        raise ValueError("no IFEval verdicts to summarize")
    agg = _reference().agg_inst_level_acc
    return {
        "prompt_level_strict_acc": statistics.fmean(v.prompt_strict for v in verdicts),
        "inst_level_strict_acc": agg([list(v.strict) for v in verdicts]),
        "prompt_level_loose_acc": statistics.fmean(v.prompt_loose for v in verdicts),
        "inst_level_loose_acc": agg([list(v.loose) for v in verdicts]),
    }


def punkt_root() -> Path:
    """The nltk data folder holding the shipped English Punkt parameters, readable by nltk."""
    files = list((_NLTK_DATA / "tokenizers" / "punkt_tab" / "english").iterdir())
    if all(f.stat().st_nlink == 1 for f in files):
        return _NLTK_DATA
    private = Path(tempfile.mkdtemp(prefix="rstar2-nltk-"))  # mode 0700: nltk trusts it
    atexit.register(shutil.rmtree, private, True)
    target = private / "tokenizers" / "punkt_tab" / "english"
    target.mkdir(parents=True)
    for f in files:
        shutil.copyfile(f, target / f.name)  # a new inode: one link
    return private


@functools.cache
def _reference() -> ModuleType:
    """lm-eval's ifeval utils, imported once nltk and langdetect are set up."""
    import langdetect
    import nltk

    root = str(punkt_root())
    if root not in nltk.data.path:
        nltk.data.path.insert(0, root)
    langdetect.DetectorFactory.seed = 0
    from lm_eval.tasks.ifeval import utils

    return utils


def _registry() -> ModuleType:
    _reference()
    from lm_eval.tasks.ifeval import instructions_registry

    return instructions_registry
