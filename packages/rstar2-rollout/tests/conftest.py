"""Shared fixtures: one tiny model per session, one event loop and one sandbox per module.

`ScriptedModel` stands in for a model's choices where a test must control exactly what the
model says (bad output, a given tool call); it is not a stand-in for an engine's behaviour,
which the engine tests check on real engines.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from rstar2_rollout.chat import IM_END
from rstar2_rollout.engine import Generation, KVCapacity, SamplingParams
from rstar2_sandbox import LocalSandbox, SandboxConfig


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rstar2_rollout.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0)


@pytest.fixture(scope="session")
def tokenizer(tiny_model: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


@pytest.fixture(scope="module")
def runner() -> Iterator[asyncio.Runner]:
    with asyncio.Runner() as r:
        yield r


@pytest.fixture(scope="module")
def sandbox(runner: asyncio.Runner) -> Iterator[LocalSandbox]:
    sb = LocalSandbox(SandboxConfig(workers=2, default_timeout_s=5.0))
    runner.run(sb.start())
    yield sb
    runner.run(sb.close())


class ScriptedModel:
    """Says the given texts, turn after turn, per problem id (the request id's first part).

    Each turn's text is encoded, `<|im_end|>` appended unless `stop=False` for that turn (a
    turn given as `(text, False)` runs out of tokens instead). `delay_s` sleeps before answering.
    """

    def __init__(
        self, tokenizer: Any, scripts: dict[str, Sequence[Any]], delay_s: float = 0.0
    ) -> None:
        self.name = "scripted"
        self.tokenizer = tokenizer
        self.scripts = scripts
        self.delay_s = delay_s
        self.requests: list[tuple[str, list[int], SamplingParams]] = []

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, request_id: str
    ) -> Generation:
        self.requests.append((request_id, list(prompt_ids), params))
        problem, turn = request_id.split("/")[0], int(request_id.rsplit("/", 1)[1])
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        entry = self.scripts[problem][turn]
        text, stop = (entry, True) if isinstance(entry, str) else entry
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if stop:
            ids.append(self.tokenizer.convert_tokens_to_ids(IM_END))
        finish = "stop" if stop else "length"
        if len(ids) > params.max_tokens:
            ids, finish = ids[: params.max_tokens], "length"
        return Generation(ids, [-0.5] * len(ids), finish_reason=finish)

    def kv_capacity(self) -> KVCapacity | None:
        return None

    async def update_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        raise RuntimeError("a script has no weights")

    async def close(self) -> None:
        return None


@pytest.fixture(scope="session")
def scripted() -> type[ScriptedModel]:
    """The `ScriptedModel` class (test modules cannot import conftest under importlib mode)."""
    return ScriptedModel


async def _roll_out(
    engine: Any, sandbox: Any, tokenizer: Any, config: Any, problems: Sequence[Any]
) -> list[Any]:
    from rstar2_rollout import RolloutSampling, one_engine_service

    service = one_engine_service(engine, sandbox, tokenizer, config)
    try:
        sampling = RolloutSampling.of(config, config.n)
        trajs = [r.trajectory async for r in service.generate(problems, sampling)]
    finally:
        await service.scheduler.close()
    order = {p.id: i for i, p in enumerate(problems)}
    return sorted(trajs, key=lambda t: (order[t.group_id], t.sample_index))


@pytest.fixture(scope="session")
def roll_out() -> Any:
    """`await roll_out(engine, sandbox, tokenizer, config, problems)`: `config.n` trajectories
    per problem on one engine (the rollout service), grouped by problem in sample order."""
    return _roll_out


def _score(model: Any, prompt: Sequence[int], tokens: Sequence[int], temperature: float) -> Any:
    """The trainer's scoring of `tokens` after `prompt` (rstar2_trainer's `response_logprobs`):
    log_softmax(logits / temperature) in fp32 at the position before each token. [N] tensor."""
    import torch

    ids = torch.tensor([list(prompt) + list(tokens)])  # [1, P + N]
    with torch.inference_mode():
        logits = model(input_ids=ids).logits[0].float()  # [P + N, V]
    start = len(prompt) - 1
    scored = logits[start : start + len(tokens)] / temperature  # [N, V]
    picked = torch.log_softmax(scored, dim=-1).gather(1, torch.tensor(list(tokens))[:, None])
    return picked[:, 0]  # [N]


@pytest.fixture(scope="session")
def score() -> Any:
    """`score(model, prompt_ids, token_ids, temperature)`: the trainer's tempered logprobs."""
    return _score
