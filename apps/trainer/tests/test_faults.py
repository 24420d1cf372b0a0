"""Which failures the run restarts itself from (faults.py), on the exceptions the parts raise:
Ray's for dead actors and lost nodes (also wrapped in a task error, as a rank's own exception
arrives), torch's for collectives and memory, the services' and the engines' own."""

from __future__ import annotations

import grpc
import pytest
import torch

from rstar2_trainer.faults import restart_reason
from rstar2_trainer.placement.engines import EngineError
from rstar2_trainer.placement.servers import ServerError
from rstar2_trainer.rundir.manifest import CheckpointError


def _rpc_error(code: grpc.StatusCode) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), "details")


def test_what_the_run_restarts_from_and_what_it_does_not():
    assert restart_reason(torch.OutOfMemoryError("CUDA out of memory")) == "out of memory"
    assert restart_reason(torch.distributed.DistBackendError("gloo timed out")) == (
        "collective timeout"
    )
    assert restart_reason(ServerError("died for good", restartable=True)) == "service down"
    assert restart_reason(EngineError("every engine is gone")) == "engines lost"
    assert restart_reason(_rpc_error(grpc.StatusCode.UNAVAILABLE)) == "service down"
    # a restart would repeat these
    assert restart_reason(ServerError("port 1 is already in use")) is None
    assert restart_reason(CheckpointError("No space left on device")) is None
    assert restart_reason(_rpc_error(grpc.StatusCode.INVALID_ARGUMENT)) is None
    assert restart_reason(ValueError("a bug")) is None
    assert restart_reason(KeyboardInterrupt()) is None


def test_ray_failures_of_actors_and_nodes_even_wrapped_in_a_task_error():
    exceptions = pytest.importorskip("ray.exceptions", reason="needs the cluster extra")
    assert restart_reason(exceptions.ActorDiedError()) == "dead rank"
    assert restart_reason(exceptions.NodeDiedError("node gone")) == "lost node"
    assert restart_reason(exceptions.OutOfMemoryError("killed")) == "out of memory"
    oom = torch.OutOfMemoryError("CUDA out of memory")
    wrapped = exceptions.RayTaskError("update", "traceback", oom)
    assert restart_reason(wrapped) == "out of memory"
    assert restart_reason(exceptions.RayTaskError("update", "traceback", ValueError())) is None
