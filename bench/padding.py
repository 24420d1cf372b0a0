"""How much of a training step's attention input is padding: padded rows against packed ones.

    uv run python bench/padding.py --json bench/results/padding.json

The rows are one RL step of the paper's stage 3 as bench/capacity.py models it (its `Capacity`
defaults and its `stage3-12K-hard` stage): prompts x (1 - dropped groups) x kept rollouts, each
a prompt of `prompt_tokens` and a response drawn from capacity's truncated lognormal (mean 7,000
tokens, 12 % at the 12,288 cap). They are split over the ranks with the trainer's
`distributed.partition_indices`, grouped on each rank with the trainer's `token_budget_chunks`
under the 14B recipe's `optim.micro_batch_tokens`, and each micro-batch is built with the
trainer's `make_micro_batch`, padded (rows x the longest row, the path before packing) and
packed (the rows' own tokens, what training runs); the pad share is 1 - real tokens / tokens
of the model's input. Prints one table; `--json` writes {"pad_share_padded", "pad_share_packed",
"tokens"}. Not covered: time (scripts/gpu_check.sh's `speed` stage measures a 4B-shaped step
both ways on a GPU).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from capacity import Capacity, Stage, lognormal_for

from rstar2_trainer.training.batching import token_budget_chunks
from rstar2_trainer.training.distributed import Row, make_micro_batch, partition_indices

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "apps" / "trainer" / "configs" / "qwen3-14b-mi300x.yaml"


def stage3_lengths(rows: int | None = None, *, seed: int = 0) -> tuple[list[int], int]:
    """(response lengths of one stage-3 step's kept rows, the prompt tokens), as capacity.py
    draws them; `rows` defaults to the step's kept rows."""
    c = Capacity(seed=seed)
    stage: Stage = next(s for s in c.stages if s.name.startswith("stage3"))
    kept = round(c.prompts * (1 - c.group_drop_fraction) * c.kept_per_prompt)
    mu, sigma = lognormal_for(stage.mean_response, stage.max_len, stage.clip_fraction)
    rng = np.random.default_rng(seed)
    drawn = np.minimum(rng.lognormal(mu, sigma, rows or kept), stage.max_len)
    return [max(1, int(n)) for n in drawn], c.prompt_tokens


def measure(responses: list[int], prompt: int, ranks: int, budget: int) -> dict:
    """Input tokens of every micro-batch, padded and packed, over all ranks."""
    rows = [Row(range(prompt), range(n), range(n)) for n in responses]  # lengths are all it reads
    cpu = torch.device("cpu")
    out: dict[str, Any] = {"tokens": sum(prompt + n for n in responses)}
    for packed in (False, True):
        seen, scores, counts = 0, 0, []
        for part in partition_indices(rows, ranks):
            lengths = [prompt + responses[i] for i in part]
            chunks = list(token_budget_chunks(lengths, budget, packed=packed))
            counts.append(len(chunks))
            for chunk in chunks:
                mb = make_micro_batch([rows[part[i]] for i in chunk], 0, cpu, packed=packed)
                seen += mb.batch.input_ids.numel()
                if packed:  # each row attends to itself
                    scores += sum(lengths[i] ** 2 for i in chunk)
                else:  # every row of the micro-batch to the longest row's width
                    scores += mb.batch.input_ids.shape[0] * mb.batch.input_ids.shape[1] ** 2
        kind = "packed" if packed else "padded"
        out[f"input_{kind}"] = seen
        out[f"scores_{kind}"] = scores  # query-key pairs attention computes (before causality)
        out[f"micro_batches_{kind}"] = (min(counts), max(counts))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--json", type=Path, default=None, help="write the result here")
    p.add_argument("--ranks", type=int, default=Capacity().gpus, help="FSDP2 ranks")
    p.add_argument("--rows", type=int, default=None, help="rows (default: one step's kept rows)")
    p.add_argument("--micro-batch-tokens", type=int, default=None, help="default: the recipe's")
    args = p.parse_args(argv)
    budget = args.micro_batch_tokens or int(
        yaml.safe_load(RECIPE.read_text())["optim"]["micro_batch_tokens"]
    )
    responses, prompt = stage3_lengths(args.rows)
    if args.ranks < 1 or len(responses) < args.ranks or budget < 1:
        print("padding: need at least one row per rank and a positive budget", file=sys.stderr)
        return 2
    m = measure(responses, prompt, args.ranks, budget)
    real = m["tokens"]
    share = {k: 1 - real / m[f"input_{k}"] for k in ("padded", "packed")}
    print(f"{len(responses)} rows (stage 3, prompt {prompt} + responses up to 12,288 tokens) "
          f"over {args.ranks} ranks, {budget:,}-token micro-batches")  # fmt: skip
    print(f"{'':8} {'input tokens':>14} {'pad share':>9} {'micro-batches/rank':>19} "
          f"{'attention pairs':>16}")  # fmt: skip
    for k in ("padded", "packed"):
        lo, hi = m[f"micro_batches_{k}"]
        print(f"{k:8} {m[f'input_{k}']:>14,} {share[k]:>9.1%} {f'{lo}-{hi}':>19} "
              f"{m[f'scores_{k}']:>16.3e}")  # fmt: skip
    print(f"{'real':8} {real:>14,}")
    result = {
        "pad_share_padded": share["padded"],
        "pad_share_packed": share["packed"],
        "tokens": real,
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
