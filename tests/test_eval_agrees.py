"""rstar2-train's evaluation and rstar2-eval's agree because they are one function.

Both call `rstar2_rollout.collect` with rstar2-verify's `Scorer` under one `SamplingProtocol`;
the trainer prints that protocol as rstar2-eval settings (`final_eval_command`). Here the tiny
recipe's held-out evaluation runs through the trainer's `measure_accuracy` (its `Parts`: the rollout
worker over a metered engine, a sandbox, the scorer) and through rstar2-eval's `evaluate` with
the settings the trainer prints, on the same scripted engine: every request must carry the same
sampling settings and every sample the same verdict. The script holds samples on which the
reward rule matters (a box in the reasoning, a right answer cut by the budget), so a command
that dropped the rule would give another accuracy.
"""

from __future__ import annotations

import asyncio
import shlex
from pathlib import Path

from rstar2_curriculum import Problem
from rstar2_evaluator.config import load_config as load_eval_config
from rstar2_evaluator.evaluate import evaluate as eval_app_evaluate
from rstar2_evaluator.evaluate import rollout_config
from rstar2_evaluator.store import RunStore
from rstar2_rollout import Generation, SamplingParams, SamplingProtocol
from rstar2_rollout.tiny import build_tokenizer
from rstar2_sandbox import LocalSandbox, SandboxConfig
from rstar2_trainer.config import load_config
from rstar2_trainer.evaluate import measure_accuracy
from rstar2_trainer.meter import EngineMeter
from rstar2_trainer.placement.engines import Engines
from rstar2_trainer.placement.local import Parts, local_source
from rstar2_trainer.placement.weights import TensorMover
from rstar2_trainer.train import final_eval_command
from rstar2_verify import Scorer, Verifier, VerifyConfig

PROBLEMS = [
    Problem(id="p1", question="What is 6 times 7?", answer="42"),
    Problem(id="p2", question="What is 3 times 4?", answer="12"),
]
# Per sample index: the first turn's text and whether it stops (False: the budget ran out).
SCRIPT = {
    0: ("It is {a}.</reason>\n<answer>\\boxed{{{a}}}</answer><|im_end|>", True),  # right
    1: ("So \\boxed{{{a}}}, I think.</reason> No answer block.<|im_end|>", True),  # box only
    2: ("</reason>\n<answer>\\boxed{{{a}}}</answer> and then more and more", False),  # cut
    3: ("It is 5.</reason>\n<answer>\\boxed{{5}}</answer><|im_end|>", True),  # wrong
}


class ScriptedModel:
    """An Engine that answers from SCRIPT and records every request's sampling settings."""

    name = "scripted"

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.requests: dict[str, tuple] = {}

    async def generate(self, prompt_ids, params: SamplingParams, request_id: str) -> Generation:
        problem, sample, _ = request_id.rsplit("/", 2)
        self.requests[request_id] = (
            params.temperature,
            params.top_p,
            params.seed,
            params.max_tokens,
        )
        answer = next(p.answer for p in PROBLEMS if p.id == problem)
        text, stops = SCRIPT[int(sample)]
        ids = self.tokenizer.encode(text.format(a=answer), add_special_tokens=False)
        return Generation(ids, [0.0] * len(ids), finish_reason="stop" if stops else "length")

    def kv_capacity(self):
        return None

    async def update_weights(self, named_tensors) -> None:
        raise RuntimeError("a scripted model has no weights")

    async def close(self) -> None:
        return None


async def _trainer(config, tokenizer, sandbox, engine: ScriptedModel) -> dict:
    meter = EngineMeter(engine)
    worker, scheduler = local_source(config, [meter], sandbox, tokenizer)
    verifier = Verifier.local(VerifyConfig(workers=1))
    parts = Parts(
        model_dir=Path("scripted"),
        model=None,
        tokenizer=tokenizer,
        engines=Engines([meter]),
        source=worker,
        sandbox=sandbox,
        scorer=Scorer(verifier, config.reward, tokenizer),
        mover=TensorMover(Engines([])),  # not used: an evaluation pushes nothing
    )
    protocol = config.eval.protocol(top_p=config.rollout.top_p, reward=config.reward)
    try:
        stats, collected = await measure_accuracy(parts, PROBLEMS, protocol, config.rollout)
    finally:
        await scheduler.close()
        await verifier.close()
    verdicts = {(t.group_id, t.sample_index): t.reward for t in collected.trajectories}
    return {"accuracy": stats["accuracy"], "verdicts": verdicts}


async def _evaluator(config, tokenizer, sandbox, engine: ScriptedModel, out: Path) -> dict:
    verifier = Verifier.local(VerifyConfig(workers=1))
    todo = [(p, i) for p in PROBLEMS for i in range(config.samples)]
    try:
        with RunStore.open(out, {}, config.identity()) as store:
            failures = await eval_app_evaluate(
                engine,
                sandbox,
                verifier,
                tokenizer,
                todo,
                rollout_config(config, None),
                store,
                max_failures=1,
                reward=config.reward,
            )
            records = store.finished()
    finally:
        await verifier.close()
    assert failures == []
    verdicts = {key: float(r.correct) for key, r in records.items()}
    return {"accuracy": sum(verdicts.values()) / len(verdicts), "verdicts": verdicts}


def test_trainer_and_evaluator_give_the_same_verdict_on_every_sample(tmp_path):
    trainer_config = load_config("tiny", [])
    settings = shlex.split(final_eval_command(trainer_config))
    base = {"model": {"kind": "local", "path": "scripted"}, "benchmark": {"name": "held.jsonl"}}
    eval_config = load_eval_config("paper", base, settings)
    protocol = trainer_config.eval.protocol(
        top_p=trainer_config.rollout.top_p, reward=trainer_config.reward
    )
    shared = eval_config.model_dump(include=set(SamplingProtocol.model_fields))
    assert SamplingProtocol.model_validate(shared) == protocol

    tokenizer = build_tokenizer(seed=0, vocab_size=2048)
    trained_engine, eval_engine = ScriptedModel(tokenizer), ScriptedModel(tokenizer)

    async def both():
        async with LocalSandbox(SandboxConfig(workers=1, preload=())) as sandbox:
            a = await _trainer(trainer_config, tokenizer, sandbox, trained_engine)
            b = await _evaluator(eval_config, tokenizer, sandbox, eval_engine, tmp_path / "e")
            return a, b

    trained, evaluated = asyncio.run(both())
    assert trained_engine.requests and trained_engine.requests == eval_engine.requests
    assert trained["verdicts"] == evaluated["verdicts"]
    # Training's rule: only sample 0 of each problem counts (a box outside the answer block and
    # a truncated answer earn nothing), so 1 of the 4 samples per problem.
    assert trained["accuracy"] == evaluated["accuracy"] == 0.25
