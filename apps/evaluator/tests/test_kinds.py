"""The kinds beyond maths, end to end with a policy whose replies are written in advance: the
real tokenizer, agent loop, sandbox, grader, checker and run directory.

- multiple choice: each sample sees the options in its own seeded order, recorded with the
  sample; the letter is graded as a letter (a number is no answer);
- `use_tool=false`: the prompt offers no tool, and a tool call the model writes is text;
- the chat path: the model's chat template, one reply, a reference checker's verdict recorded.
"""

from __future__ import annotations

import asyncio
import re
from string import ascii_uppercase

import pytest

from rstar2_curriculum import BenchmarkConfig, choice_variant, load_benchmark
from rstar2_evaluator.chat import sample_and_check
from rstar2_evaluator.config import EvalConfig
from rstar2_evaluator.evaluate import evaluate, rollout_config
from rstar2_evaluator.scorers.code import CodeChecker
from rstar2_evaluator.store import RunStore
from rstar2_rollout import Generation, SamplingParams
from rstar2_rollout.tiny import build_tokenizer
from rstar2_sandbox import LocalSandbox, SandboxConfig
from rstar2_verify import Verifier, VerifyConfig

TOOL = "execute_python_code_with_standard_io"


class Scripted:
    """An Engine whose reply is `reply(prompt text, request id)`; it records the prompts."""

    name = "scripted"

    def __init__(self, tokenizer, reply) -> None:
        self.tokenizer = tokenizer
        self.reply = reply
        self.prompts: dict[str, str] = {}

    async def generate(self, prompt_ids, params: SamplingParams, request_id: str) -> Generation:
        prompt = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        self.prompts[request_id] = prompt
        ids = self.tokenizer.encode(self.reply(prompt, request_id), add_special_tokens=False)
        return Generation(ids[: params.max_tokens], finish_reason="stop")

    def kv_capacity(self):
        return None

    async def update_weights(self, named_tensors) -> None:
        raise RuntimeError("no weights")

    async def close(self) -> None:
        return None


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(seed=0, vocab_size=2048)


def _config(tmp_path, **values) -> EvalConfig:
    return EvalConfig.model_validate(
        {
            "model": {"kind": "local", "path": "scripted"},
            "benchmark": {"name": "gpqa_diamond"},
            "samples": 4,
            "max_turns": 2,
            "max_response_tokens": 300,
            "out": str(tmp_path / "run"),
            **values,
        }
    )


def _letter_of_right_option(prompt: str) -> str:
    """The letter the prompt shows the right option (text ending in '.5') under."""
    return re.findall(r"\n([A-D])\) \d\.5\n", prompt)[-1]


def test_choices_are_shuffled_per_sample_recorded_and_graded_as_letters(
    tmp_path, tokenizer, gpqa_csv
):
    problems = load_benchmark(BenchmarkConfig(name="gpqa_diamond", data=str(gpqa_csv)))
    config = _config(tmp_path)

    def reply(prompt: str, request_id: str) -> str:
        sample = int(request_id.split("/")[1])
        right = _letter_of_right_option(prompt)
        wrong = next(x for x in "ABCD" if x != right)
        answer = {0: right, 1: wrong, 2: f"({right})", 3: "0"}[sample]  # 3: a number, no letter
        return f"Checked.</reason>\n<answer>\\boxed{{{answer}}}</answer><|im_end|>"

    todo = [(choice_variant(p, config.seed, i), i) for p in problems for i in range(4)]

    async def run():
        verifier = Verifier.local(VerifyConfig(workers=1))
        try:
            with RunStore.open(config.run_dir(), {}, config.identity()) as store:
                failures = await evaluate(
                    Scripted(tokenizer, reply),
                    None,
                    verifier,
                    tokenizer,
                    todo,
                    rollout_config(config.model_copy(update={"use_tool": False}), None),
                    store,
                    max_failures=1,
                    choice=True,
                )
                return failures, store.finished()
        finally:
            await verifier.close()

    failures, records = asyncio.run(run())
    assert failures == []
    assert sorted(records) == [(p.id, i) for p in problems for i in range(4)]
    for (pid, i), record in records.items():
        order = record.details["order"]
        assert sorted(order) == [0, 1, 2, 3]
        assert record.reference == ascii_uppercase[order.index(0)]  # where the right one went
        assert record.correct == (i in (0, 2)), (pid, i, record.answer)
    assert records[(problems[0].id, 3)].answer is None  # "0" is no letter
    orders = {tuple(r.details["order"]) for r in records.values()}
    assert len(orders) > 1  # the samples saw different orders


def test_without_the_tool_the_prompt_offers_none_and_a_call_is_text(tmp_path, tokenizer):
    config = _config(tmp_path, benchmark={"name": "x.jsonl"}, samples=1, tool=False)
    assert config.use_tool is False and config.identity()["use_tool"] is False
    call = f'{{"name": "{TOOL}", "arguments": {{"code": "print(6*7)", "input": ""}}}}'

    def reply(prompt: str, request_id: str) -> str:
        return f"I will run it.\n<tool_call>{call}</tool_call><|im_end|>"

    problems = load_benchmark(BenchmarkConfig(name="aime24", data=str(_aime(tmp_path))))
    engine = Scripted(tokenizer, reply)

    async def run():
        verifier = Verifier.local(VerifyConfig(workers=1))
        try:
            with RunStore.open(config.run_dir(), {}, config.identity()) as store:
                failures = await evaluate(
                    engine,
                    None,  # no sandbox at all: nothing may call one
                    verifier,
                    tokenizer,
                    [(problems[0], 0)],
                    rollout_config(config, None),
                    store,
                    max_failures=1,
                )
                return failures, store.finished()
        finally:
            await verifier.close()

    failures, records = asyncio.run(run())
    (record,) = records.values()
    assert failures == [] and record.tool_calls == {} and record.turns == 1
    assert record.finish_reason == "no_tool_call" and TOOL in record.response
    (prompt,) = engine.prompts.values()
    assert TOOL not in prompt and "<tools>" not in prompt


def _aime(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"id": 60, "problem": "Find 6 times 7.", "answer": "42", "year": "2024"}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "aime24.parquet")
    return tmp_path / "aime24.parquet"


def test_the_chat_path_renders_the_template_samples_once_and_records_the_verdict(
    tokenizer, lcb_dir
):
    program = (
        "a, b = map(float, input().split())\nprint(int(a + b) if a + b == int(a + b) else a + b)"
    )

    def reply(prompt: str, request_id: str) -> str:
        assert prompt.startswith("<|im_start|>system\nYou are an expert Python programmer")
        assert prompt.endswith("<|im_start|>assistant\n")  # the model's own template, no <reason>
        if request_id.startswith("scale"):
            return "I cannot.<|im_end|>"
        return f"```python\n{program}\n```<|im_end|>"

    records = []

    async def run():
        async with LocalSandbox(SandboxConfig(workers=1, preload=())) as sandbox:
            checker = CodeChecker(sandbox, release="v6", timeout_s=2.0)
            problems = checker.load(lcb_dir)
            return await sample_and_check(
                Scripted(tokenizer, reply),
                tokenizer,
                checker,
                [(p, 0) for p in problems],
                temperature=0.0,
                top_p=1.0,
                max_tokens=200,
                context=4096,
                seed=0,
                concurrency=2,
                max_failures=1,
                on_done=records.append,
            )

    assert asyncio.run(run()) == []
    by_id = {r.problem_id: r for r in records}
    assert (
        by_id["add"].score == 1.0 and by_id["add"].correct and by_id["add"].details["passed"] == 3
    )
    assert by_id["scale"].score == 0.0 and by_id["scale"].details["why"] == "no_code"
    assert by_id["add"].turns == 1 and by_id["add"].finish_reason == "stop"
