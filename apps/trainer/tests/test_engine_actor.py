"""`EngineActor` (what cluster mode runs inside each Ray actor) builds its engine with
rstar2-rollout's `build_engine` from the recipe's `engine` section, so any kind runs there.

The class is plain (cluster.py wraps it with `ray.remote`), so it is exercised here in-process
with the transformers engine: the same answers as the engine built directly, no capacity or
progress where the engine reports none, no sleep where it cannot, and weight loads that change
the answer. The Ray path itself is covered by test_cluster.py (slow).
"""

import asyncio

import torch

from rstar2_rollout import SamplingParams, build_engine
from rstar2_rollout.tiny import build_tiny_model
from rstar2_trainer.config import load_config
from rstar2_trainer.placement.engine_actor import EngineActor

GREEDY = SamplingParams(max_tokens=8, temperature=0.0, logprobs=False)
PROMPT = [1, 2, 3, 4, 5]


def test_an_engine_actor_runs_the_recipes_engine_kind(tmp_path):
    model_dir = build_tiny_model(tmp_path / "model", seed=0, vocab_size=1024, layers=2)
    config = load_config("tiny", ["engine={kind: hf}"]).engine_for(str(model_dir), replica=0)
    actor = EngineActor(config, "hf-0-0")
    direct = build_engine(config)

    async def scenario():
        out, capacity, progress = await actor.generate(PROMPT, GREEDY, "a")
        reference = await direct.generate(PROMPT, GREEDY, "b")
        awake = await actor.wake_up()  # nothing to wake: an engine that cannot sleep is awake
        state = direct.model.state_dict()  # type: ignore[attr-defined]
        generator = torch.Generator().manual_seed(1)
        noisy = [
            (k, v + v.std() * torch.randn(v.shape, generator=generator) if v.dim() > 1 else v)
            for k, v in state.items()
        ]
        seconds = await actor.update_weights(noisy)
        after, _, _ = await actor.generate(PROMPT, GREEDY, "c")
        await direct.update_weights(noisy)
        reference_after = await direct.generate(PROMPT, GREEDY, "d")
        await actor.close()
        await direct.close()
        return out, capacity, progress, reference, awake, seconds, after, reference_after

    out, capacity, progress, reference, awake, seconds, after, reference_after = asyncio.run(
        scenario()
    )
    assert actor.name == "hf-0-0" and len(out.token_ids) == 8
    assert out.token_ids == reference.token_ids
    assert capacity is None and progress is None and actor.progress() is None
    assert actor.can_sleep() is False and awake is True
    assert seconds > 0 and after.token_ids == reference_after.token_ids != out.token_ids
