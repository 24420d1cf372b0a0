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


# ------------------------------------------------------------------ multiple choice (GPQA)


def _gpqa_csv(path: Path) -> Path:
    import csv

    columns = ["Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2"]
    columns += ["Incorrect Answer 3", "Record ID"]
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        for i in range(2):
            values = [f"Which value, case {i}?", f"{i}.5", f"{i}.1", f"{i}.2", f"{i}.3", f"rec{i}"]
            writer.writerow(dict(zip(columns, values, strict=True)))
    return path


class LetterModel:
    """Answers each choice variant by its sample index (from the variant's id `X#i`): the right
    letter, a wrong one, the right one in the reasoning only, a number."""

    name = "letters"

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.asked: dict[str, str] = {}

    async def generate(self, prompt_ids, params: SamplingParams, request_id: str) -> Generation:
        import re

        variant = request_id.rsplit("/", 2)[0]  # gpqa_diamond/rec0#2 (then /sample/turn)
        index = int(variant.rsplit("#", 1)[1])
        prompt = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        self.asked[variant] = prompt
        right = re.findall(r"\n([A-D])\) \d\.5\n", prompt)[-1]
        wrong = next(x for x in "ABCD" if x != right)
        text = [
            f"It is {right}.</reason>\n<answer>\\boxed{{{right}}}</answer><|im_end|>",
            f"It is {wrong}.</reason>\n<answer>\\boxed{{{wrong}}}</answer><|im_end|>",
            f"So \\boxed{{{right}}}.</reason>\n<answer>no idea</answer><|im_end|>",
            "</reason>\n<answer>\\boxed{0}</answer><|im_end|>",
        ][index]
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return Generation(ids, [0.0] * len(ids), finish_reason="stop")

    def kv_capacity(self):
        return None

    async def update_weights(self, named_tensors) -> None:
        raise RuntimeError("no weights")

    async def close(self) -> None:
        return None


def test_gpqa_by_name_in_training_scores_each_sample_as_rstar2_eval_does(tmp_path):
    from rstar2_curriculum import choice_variant
    from rstar2_trainer.data import load_benchmark as trainer_benchmark

    source = f"gpqa_diamond={_gpqa_csv(tmp_path / 'gpqa_diamond.csv')}"
    trainer_config = load_config("tiny", [f"eval.sources=[{source}]", "eval.benchmark.samples=4"])
    problems = trainer_benchmark(trainer_config.eval.sources[0])
    assert [p.id for p in problems] == ["gpqa_diamond/rec0", "gpqa_diamond/rec1"]
    protocol = trainer_config.eval.benchmark.model_copy(update={"max_turns": 2})
    tokenizer = build_tokenizer(seed=0, vocab_size=2048)
    trained_engine, eval_engine = LetterModel(tokenizer), LetterModel(tokenizer)
    base = {"model": {"kind": "local", "path": "scripted"}, "benchmark": {"name": "gpqa_diamond"}}
    settings = [f"{k}={v}" for k, v in protocol.model_dump(exclude={"reward"}).items()]
    settings += [f"reward.{k}={v}" for k, v in protocol.reward.model_dump().items()]
    settings += [f"system_prompt={trainer_config.rollout.system_prompt}"]
    eval_config = load_eval_config("paper", base, settings)

    async def both():
        async with LocalSandbox(SandboxConfig(workers=1, preload=())) as sandbox:
            meter = EngineMeter(trained_engine)
            worker, scheduler = local_source(trainer_config, [meter], sandbox, tokenizer)
            verifier = Verifier.local(VerifyConfig(workers=1))
            parts = Parts(
                model_dir=Path("scripted"),
                model=None,
                tokenizer=tokenizer,
                engines=Engines([meter]),
                source=worker,
                sandbox=sandbox,
                scorer=Scorer(verifier, protocol.reward, tokenizer),
                mover=TensorMover(Engines([])),  # not used: an evaluation pushes nothing
            )
            try:
                stats, collected = await measure_accuracy(
                    parts, problems, protocol, trainer_config.rollout
                )
                todo = [
                    (choice_variant(p, eval_config.seed, i), i) for p in problems for i in range(4)
                ]
                with RunStore.open(tmp_path / "e", {}, eval_config.identity()) as store:
                    failures = await eval_app_evaluate(
                        eval_engine,
                        sandbox,
                        verifier,
                        tokenizer,
                        todo,
                        rollout_config(eval_config, None),
                        store,
                        max_failures=1,
                        reward=eval_config.reward,
                        choice=True,
                    )
                    records = store.finished()
            finally:
                await scheduler.close()
                await verifier.close()
            return stats, collected, failures, records

    stats, collected, failures, records = asyncio.run(both())
    assert failures == [] and stats["problems"] == 2 and stats["samples"] == 4
    trained = {
        (t.group_id.rsplit("#", 1)[0], int(t.group_id.rsplit("#", 1)[1])): t.reward
        for t in collected.trajectories
    }
    evaluated = {key: float(r.correct) for key, r in records.items()}
    assert trained == evaluated  # same variants, same letters, same verdicts
    assert trained_engine.asked == eval_engine.asked  # every sample saw the same options
    assert stats["accuracy"] == 0.25  # only the right letter in the answer block counts
