"""Split placement's engines come back: two transformers engine actors on a local Ray cluster,
the driver's weights pushed to them (`TensorMover`), then each actor's process stopped by pid
as a cluster would: kill -9 of one in the middle of a burst of turns, SIGSTOP (a hang) of the
other.

- every turn of the burst ends well (no "error" generation reaches the agent loop): the turns
  the dead actor held are sent again to the other engine (`turns_moved`);
- the dead engine is started again once (`restarts`, a new `incarnation`), is not dropped, and
  computes the pushed weights (its greedy answer equals the other engine's and differs from
  the model folder's): it got the current weights before it served again;
- the stopped actor is noticed by the health check's deadline (`cluster.engine_health_timeout_s`),
  its process is killed (it stops being a stopped process), its turns finish on the other
  engine, and it comes back.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from rstar2_rollout.engine import SamplingParams
from rstar2_trainer.config import TrainerConfig
from rstar2_trainer.placement.cluster import open_cluster_parts

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

HEALTH_TIMEOUT_S = 4.0
SPLIT = {
    "colocate": False,
    "train_workers": 0,  # the driver trains: TensorMover, one object-store copy per version
    "engines_per_node": 2,
    "engine_health_interval_s": 0.5,
    "engine_health_timeout_s": HEALTH_TIMEOUT_S,
}
ENGINE = ["engine={kind: hf}"]
PROMPT = [5, 40, 7, 300]
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, logprobs=False)
LONG = SamplingParams(max_tokens=48, temperature=1.0, logprobs=False)
# the killed burst must still be running when the kill lands, on a quiet or a loaded host
LONGER = SamplingParams(max_tokens=256, temperature=1.0, logprobs=False, ignore_eos=True)


def _state(pid: int) -> str:
    """The process's state letter (R, S, T: stopped, Z: dead, not reaped), "" when gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return ""


async def _burst(engine: Any, tag: str, n: int = 6, params: SamplingParams = LONG) -> list[Any]:
    return list(
        await asyncio.gather(
            *(engine.generate([5 + i, 40, 7, 300 + i], params, f"{tag}{i}") for i in range(n))
        )
    )


async def scenario(config: TrainerConfig, run_dir: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with open_cluster_parts(config, run_dir) as parts:
        first, second = (e.inner for e in parts.engines)
        out["pids"] = [first.pid, second.pid]
        out["folder"] = (await first.generate(PROMPT, GREEDY, "folder")).token_ids
        model = parts.model
        assert model is not None
        with torch.no_grad():
            gen = torch.Generator().manual_seed(1)
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.5)
        await parts.mover.push(list(model.state_dict().items()))
        out["pushed"] = (await second.generate(PROMPT, GREEDY, "pushed")).token_ids

        assert first.pid is not None
        start = time.perf_counter()
        burst = asyncio.ensure_future(_burst(parts.engines[0], "k", params=LONGER))
        await asyncio.sleep(0.3)
        out["kill_in_burst"] = not burst.done()
        os.kill(first.pid, signal.SIGKILL)
        out["killed_burst"] = await burst
        out["killed_burst_s"] = time.perf_counter() - start
        await first.ready()
        out["first"] = {
            "restarts": first.restarts,
            "incarnation": first.incarnation,
            "moved": first.turns_moved,
            "greedy": (await first.generate(PROMPT, GREEDY, "back")).token_ids,
        }

        hung = second.pid
        assert hung is not None
        os.kill(hung, signal.SIGSTOP)
        start = time.perf_counter()
        out["hung_burst"] = await _burst(parts.engines[1], "h", n=3)
        out["hung_burst_s"] = time.perf_counter() - start
        out["hung_state"] = _state(hung)
        await second.ready()
        out["second"] = {
            "restarts": second.restarts,
            "incarnation": second.incarnation,
            "moved": second.turns_moved,
            "greedy": (await second.generate(PROMPT, GREEDY, "back2")).token_ids,
        }
        out["dropped"] = list(parts.engines.dropped)
        out["counts"] = parts.service_counts()
    return out


@pytest.fixture(scope="module")
def record(tiny_on_ray, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    config = tiny_on_ray.config(SPLIT, engine=ENGINE)
    return tiny_on_ray.run(config, scenario, tmp_path_factory.mktemp("revive"))


def test_an_engine_killed_mid_turns_comes_back_with_the_current_weights(record):
    assert all(p is not None for p in record["pids"])  # actors on this host: killable by pid
    assert record["pushed"] != record["folder"]  # the push changed what the engines compute
    assert record["kill_in_burst"]  # the kill landed while the burst's turns were running
    assert [g.finish_reason for g in record["killed_burst"]].count("error") == 0
    assert all(len(g.token_ids) > 0 for g in record["killed_burst"])
    first = record["first"]
    assert first["restarts"] == 1 and first["incarnation"] == 1
    assert first["moved"] >= 1  # turns the dead actor held finished elsewhere
    assert first["greedy"] == record["pushed"]  # the new actor has the pushed weights
    assert record["dropped"] == []


def test_a_hung_engine_is_killed_by_the_deadline_and_comes_back(record):
    assert [g.finish_reason for g in record["hung_burst"]].count("error") == 0
    assert record["hung_state"] in ("", "Z")  # the stopped process was killed
    assert record["hung_burst_s"] >= HEALTH_TIMEOUT_S * 0.5  # noticed by the health check
    second = record["second"]
    assert second["restarts"] == 1 and second["incarnation"] == 1 and second["moved"] >= 1
    assert second["greedy"] == record["pushed"]
    counts = record["counts"]
    assert counts["engine_restarts"] == 2
    assert counts["turns_moved"] == first_and_second_moved(record)


def first_and_second_moved(record: dict[str, Any]) -> int:
    return record["first"]["moved"] + record["second"]["moved"]
