"""The trainer's order on one device: step, offload, DCP save, export, onload, step.

    uv run python bench/gpu_order.py --json OUT                 # the trainer's order
    uv run python bench/gpu_order.py --json OUT --order before  # save and export as before

An offloading (colocated) placement without vLLM or Ray: a Qwen3-shaped model built here
(`rstar2_rollout.tiny.build_tiny_model`), one FSDP2 rank in this process (`TrainWorker`: an NCCL
world of one on a GPU, gloo on a CPU) behind `TrainGroup.in_process`, and the colocated weight
mover (`ColocatedMover`, offloading, no engine), driven with the calls the trainer's loop makes
(train.py's `rl_step`, `save` and the export in `_train`):

    step      mover.sleep(), then a training step (`TrainGroup.step`, the SFT loss)
    offload   mover.push(weights): the optimizer state, then the parameters, to host memory
    save      mover.sleep(), the DCP checkpoint (`TrainGroup.save`), mover.push()
    export    mover.sleep(), the safetensors export (`TrainGroup.export`)
    onload    mover.sleep() (the export's already brought the state back: 0 bytes)
    step      another training step

For save and export it records the device of every parameter shard and optimizer tensor as the
collective starts (counted by device; "host copy" for a CPU rank's offloaded copies). With
`--order before` save and export run without the mover's sleep, as the trainer ran them before
its mover owned the training state: on a GPU the collectives then meet host tensors on an
NCCL-only group and fail; on a CPU rank the trainer's residency rule refuses them in one line
(gloo alone would hide it). Prints a table; `--json OUT` writes {"device", "order",
"parameters", "stages": [{"stage", "ok", "seconds", "bytes"?, "error"?}], "devices": {"save":
{device: tensors}, "export": {...}}, "ok"}; exit status 0 when every stage passed, else 1.
Measured on CPU when written; the GPU run is scripts/gpu_check.sh's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    p.add_argument("--order", choices=("trainer", "before"), default="trainer")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--rows", type=int, default=4, help="sequences in a step")
    p.add_argument("--tokens", type=int, default=256, help="tokens per sequence")
    return p


def _devices(worker: Any) -> dict[str, int]:
    """Tensors of the rank's state by where they are (a shard's device, or its host copy)."""
    from torch.distributed.tensor import DTensor

    host = set().union(*worker.residency._host_storage.values())
    where: Counter[str] = Counter()
    tensors = list(worker.model.parameters())
    for state in worker.optimizer.state.values():
        tensors += [v for v in state.values() if hasattr(v, "dim") and v.dim() > 0]
    for t in (t.to_local() if isinstance(t, DTensor) else t for t in tensors):
        ptr = t.untyped_storage().data_ptr()
        where["host copy" if ptr in host else str(t.device)] += 1
    return dict(where)


async def run(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    import torch

    from rstar2_rollout.tiny import build_tiny_model
    from rstar2_trainer.placement.engines import Engines
    from rstar2_trainer.placement.weights import ColocatedMover
    from rstar2_trainer.training.distributed import DistributedConfig, Row
    from rstar2_trainer.training.train_workers import TrainGroup, TrainWorker, sft_loss

    model_dir = build_tiny_model(
        folder / "model",
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        layers=args.layers,
        heads=args.heads,
        kv_heads=args.kv_heads,
        max_position_embeddings=max(1024, args.tokens),
    )
    cuda = torch.cuda.is_available()
    config = DistributedConfig(device="cuda" if cuda else "cpu", micro_batch_tokens=4096)
    worker = TrainWorker(0, 1)
    worker.setup(None, str(model_dir), config, lr=1e-4, betas=(0.9, 0.999))
    group = TrainGroup.in_process(worker)
    mover = ColocatedMover(Engines([]), group, offload=True, bucket_bytes=1 << 28)
    gen = torch.Generator().manual_seed(0)
    rows = []
    for _ in range(args.rows):
        ids = torch.randint(3, args.vocab - 1, (args.tokens,), generator=gen).tolist()
        rows.append(Row(ids[:16], ids[16:], [1] * (len(ids) - 16)))
    stages: list[dict[str, Any]] = []
    devices: dict[str, dict[str, int]] = {}
    params = sum(p.numel() for p in worker.model.parameters())

    async def stage(name: str, body: Any) -> None:
        start = time.perf_counter()
        record: dict[str, Any] = {"stage": name, "ok": True}
        try:
            moved = await body()
            if isinstance(moved, (int, float)):
                record["bytes"] = float(moved)
        except Exception as exc:  # a failed stage is the result, not a crash of the bench
            record.update(ok=False, error=f"{type(exc).__name__}: {str(exc).splitlines()[0]}")
        record["seconds"] = round(time.perf_counter() - start, 4)
        stages.append(record)

    async def step() -> None:
        await mover.sleep()
        await group.step(rows, sft_loss, lr=1e-4, pad_id=0, micro_batch_tokens=4096)

    async def offload() -> float:
        report = await mover.push(group)
        return report.state_bytes or 0.0

    async def save() -> None:
        trainer = args.order == "trainer"
        asleep = await mover.sleep() if trainer else None
        devices["save"] = _devices(worker)
        await group.save(folder / "ckpt", 1, keep=1)
        if asleep is not None and asleep.needs_push:
            await mover.push(group)

    async def export() -> None:
        if args.order == "trainer":
            await mover.sleep()
        devices["export"] = _devices(worker)
        out = folder / "policy"
        out.mkdir()
        await group.export(out)

    async def onload() -> float:
        return (await mover.sleep()).state_bytes or 0.0

    try:
        await stage("step", step)
        await stage("offload", offload)
        await stage("save", save)
        await stage("export", export)
        await stage("onload", onload)
        await stage("step", step)
    finally:
        await group.close()
    return {
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "order": args.order,
        "parameters": params,
        "stages": stages,
        "devices": devices,
        "ok": all(s["ok"] for s in stages),
    }


def _table(out: dict[str, Any]) -> str:
    lines = [f"{out['device']}, order {out['order']}, {out['parameters']:,} parameters"]
    lines.append(f"{'stage':<9} {'ok':<4} {'seconds':>8} {'MiB moved':>10}  error")
    for s in out["stages"]:
        mib = f"{s['bytes'] / 2**20:.1f}" if "bytes" in s else ""
        ok = "yes" if s["ok"] else "NO"
        lines.append(
            f"{s['stage']:<9} {ok:<4} {s['seconds']:>8.3f} {mib:>10}  {s.get('error', '')}"
        )
    for when, where in out["devices"].items():
        lines.append(f"devices at {when}: " + ", ".join(f"{d} {n}" for d, n in where.items()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gpu_order_") as tmp:
        out = asyncio.run(run(args, Path(tmp)))
    print(_table(out))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
