"""End to end with a policy whose answers are known: the real tokenizer, agent loop, sandbox,
grader and run directory, so pass@k and majority vote are checked against values worked out by
hand, and a run interrupted by engine failures resumes to the same summary.

The policy is an outside model written down in advance (`ScriptedModel`): per (problem, sample)
it writes Python that prints its answer, reads the sandbox's output back from the prompt, and
answers with it in the paper's format; or its code fails and it falls back to a fixed answer; or
it rambles until the token budget runs out. Its text goes through the real tokenizer, so the
agent loop parses exactly what a model would have sampled.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence

import pytest

from rstar2_curriculum import Problem
from rstar2_evaluator.config import EvalConfig
from rstar2_evaluator.evaluate import evaluate, rollout_config
from rstar2_evaluator.metrics import summarize
from rstar2_evaluator.store import RunStore
from rstar2_rollout import Generation, SamplingParams
from rstar2_rollout.tiny import build_tokenizer
from rstar2_sandbox import LocalSandbox, SandboxClient, SandboxConfig, ServerConfig
from rstar2_sandbox.server import SandboxServer
from rstar2_verify import Verifier, VerifyConfig

TOOL = "execute_python_code_with_standard_io"
RAMBLE = "Let me count the ways again, carefully, one more time. " * 60

PROBLEMS = [
    Problem(id="p1", question="What is 6 times 7?", answer="42"),
    Problem(id="p2", question="What is 2 to the 10th power?", answer="1024"),
    Problem(id="p3", question="What is 7 choose 3?", answer="35"),
]
# Per problem, per sample: "N" prints N with the tool and answers what the tool printed; "!N"
# runs failing code and answers N anyway; "" rambles until the token budget ends (no answer).
PLAN = {
    "p1": ["42", "42", "41", "42"],  # c=3; vote 42 (right)
    "p2": ["1000", "1024", "1000", "!1024"],  # c=2; 1000 and 1024 tie, 1000 came first (wrong)
    "p3": ["", "36", "35", ""],  # c=1; 36 and 35 tie, 36 came first (wrong)
}


class ScriptedModel:
    """An Engine whose outputs are fixed in advance; `outage` samples fail like a dead server."""

    name = "scripted"

    def __init__(self, tokenizer, outage: Sequence[tuple[str, int]] = ()) -> None:
        self.tokenizer = tokenizer
        self.outage = set(outage)

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    async def generate(self, prompt_ids, params: SamplingParams, request_id: str) -> Generation:
        problem, sample, turn = request_id.rsplit("/", 2)
        if (problem, int(sample)) in self.outage:
            return Generation([], finish_reason="error", error="scripted outage")
        plan = PLAN[problem][int(sample)]
        if not plan:
            ids = self._ids(RAMBLE)[: params.max_tokens]
            return Generation(ids, [0.0] * len(ids), finish_reason="length")
        if turn == "0":
            code = "raise ValueError('no idea')" if plan.startswith("!") else f"print({plan})"
            call = f'{{"name": "{TOOL}", "arguments": {{"code": "{code}", "input": ""}}}}'
            text = f"I will compute it.\n<tool_call>{call}</tool_call><|im_end|>"
        else:
            prompt = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
            output = re.findall(r"<tool_response>\n?(.*?)\n?</tool_response>", prompt, re.S)[-1]
            answer = plan[1:] if plan.startswith("!") else output.strip()
            text = f"The tool gave {output.strip()[:20]}.</reason>\n<answer>\\boxed{{{answer}}}</answer><|im_end|>"
        ids = self._ids(text)
        return Generation(ids, [0.0] * len(ids), finish_reason="stop")

    def kv_capacity(self):
        return None

    async def update_weights(self, named_tensors) -> None:
        raise RuntimeError("a scripted model has no weights")

    async def close(self) -> None:
        return None


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(seed=0, vocab_size=2048)


def _config(tmp_path) -> EvalConfig:
    return EvalConfig.model_validate(
        {
            "model": {"kind": "local", "path": "scripted"},
            "benchmark": {"name": "three.jsonl"},
            "samples": 4,
            "max_turns": 4,
            "max_response_tokens": 400,
            "pass_k": [1, 2, 4],
            "concurrency": 6,
            "out": str(tmp_path / "run"),
        }
    )


async def _evaluate(config, tokenizer, store, todo, model, sandbox):
    verifier = Verifier.local(VerifyConfig(workers=1))
    try:
        return await evaluate(
            model,
            sandbox,
            verifier,
            tokenizer,
            todo,
            rollout_config(config, None),
            store,
            max_failures=100,
        )
    finally:
        await verifier.close()


def test_known_answers_give_hand_computed_metrics_and_resume_after_an_outage(tmp_path, tokenizer):
    config = _config(tmp_path)
    todo = [(p, i) for p in PROBLEMS for i in range(4)]
    outage = [("p2", 1), ("p3", 2)]

    async def scenario():
        async with LocalSandbox(SandboxConfig(workers=1, preload=())) as sandbox:
            with RunStore.open(config.run_dir(), {}, config.identity()) as store:
                model = ScriptedModel(tokenizer, outage)
                failures = await _evaluate(config, tokenizer, store, todo, model, sandbox)
                assert sorted(f.split(":")[0] for f in failures) == ["p2#1", "p3#2"]
                assert len(store.finished()) == 10  # failed samples are not recorded
            with RunStore.open(config.run_dir(), {}, config.identity()) as store:
                left = [(p, i) for p, i in todo if (p.id, i) not in store.finished()]
                assert [(p.id, i) for p, i in left] == outage
                model = ScriptedModel(tokenizer)
                assert await _evaluate(config, tokenizer, store, left, model, sandbox) == []
                return store.finished()

    records = asyncio.run(scenario())
    by_key = {k: r for k, r in records.items()}
    assert by_key[("p1", 2)].answer == "41" and not by_key[("p1", 2)].correct
    assert by_key[("p2", 3)].tool_calls == {"error": 1} and by_key[("p2", 3)].correct
    assert by_key[("p3", 0)].answer is None and by_key[("p3", 0)].finish_reason == "max_length"

    summary = summarize([records[(p.id, i)] for p in PROBLEMS for i in range(4)], ks=(1, 2, 4))
    assert summary.pass_at_1 == pytest.approx((3 / 4 + 2 / 4 + 1 / 4) / 3)
    # pass@2 per problem: 1 - C(n-c, 2)/C(4, 2) = 1, 1 - 1/6, 1 - 3/6
    assert summary.pass_at_k == pytest.approx(
        {"pass@1": 0.5, "pass@2": (1 + 5 / 6 + 1 / 2) / 3, "pass@4": 1.0}
    )
    assert summary.maj_at_k == pytest.approx({"maj@1": 1 / 3, "maj@2": 1 / 3, "maj@4": 1 / 3})
    assert [(p.majority_answer, p.majority_correct) for p in summary.per_problem] == [
        ("42", True),
        ("1000", False),
        ("36", False),
    ]
    assert summary.tool_outcomes == {"error": 1, "ok": 9}
    assert summary.tool_error_ratio == pytest.approx(1 / 10)
    assert summary.tool_calls_per_problem == pytest.approx((1 + 1 + 0.5) / 3)
    assert summary.finish_reasons == {"answered": 10, "max_length": 2}
    assert summary.mean_sampled_tokens < summary.mean_response_tokens <= 400


def test_a_sandbox_server_outage_is_not_scored_as_the_models_tool_errors(tmp_path, tokenizer):
    config = _config(tmp_path)
    todo = [(p, i) for p in PROBLEMS for i in range(4)]

    async def scenario():
        server = SandboxServer(ServerConfig(port=0, sandbox=SandboxConfig(workers=1, preload=())))
        port = await server.start()
        address = f"127.0.0.1:{port}"
        with RunStore.open(tmp_path / "up", {}, config.identity()) as store:
            async with SandboxClient(address) as client:
                model = ScriptedModel(tokenizer)
                failures = await _evaluate(config, tokenizer, store, todo[:4], model, client)
            up = store.finished()
        await server.stop(0)
        with RunStore.open(tmp_path / "down", {}, config.identity()) as store:
            async with SandboxClient(address) as client:
                model = ScriptedModel(tokenizer)
                down_failures = await _evaluate(config, tokenizer, store, todo, model, client)
            down = store.finished()
        return failures, up, down_failures, down

    failures, up, down_failures, down = asyncio.run(scenario())
    assert failures == [] and [up[("p1", i)].answer for i in range(4)] == ["42", "42", "41", "42"]
    # Server gone: every sample that called the tool fails (kept for a rerun); the two that
    # never called it are recorded as usual.
    assert sorted(down) == [("p3", 0), ("p3", 3)]
    assert len(down_failures) == 10 and "UNAVAILABLE" in down_failures[0]
