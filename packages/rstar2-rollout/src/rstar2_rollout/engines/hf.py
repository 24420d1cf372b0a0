"""transformers `generate` behind the `Engine` Protocol: the reference engine and the fallback.

`HFEngine` runs one request at a time on a worker thread (a lock orders requests and weight
updates), so the event loop stays free while it computes. It is slow next to vLLM and has no
paged KV cache (`kv_capacity()` is None), but it is the reference other engines are tested
against: greedy output of vLLM after a weight sync must equal this engine's on the same weights.

It samples exactly what `SamplingParams` says: temperature and top_p, and no top_k (transformers
otherwise applies its default top_k of 50, or a checkpoint's `generation_config` choices such as
Qwen3's top_k 20 and top_p 0.95; the engine clears the model's sampling defaults when it is
built and passes top_k 0). Logprobs are of the distribution each token was drawn from:
log_softmax of the scores `generate` sampled from (the logits after every processor and warper),
i.e. log_softmax(logits / temperature) with top_p 1, renormalised over the nucleus with top_p < 1
as vLLM's are, and the raw logits' own at temperature 0. This is what the trainer scores when
top_p is 1.
`weights_version` counts the weight updates loaded (each `Generation` carries the one it ran on).
LoRA (the `AdapterEngine` capability): `load_adapter` wraps the model with PEFT the first time
(the adapter's own config) and loads each version's tensors into it (PEFT's
`set_peft_model_state_dict`); any rank, in the model's dtype, under the same lock as requests.
A request's `seed` seeds torch's global generator under the lock, so seeded sampling is
reproducible. Needs the `hf` extra (torch, transformers).
Not covered: batching concurrent requests together; top_k (`SamplingParams` has none).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable, Sequence
from typing import Any

from rstar2_rollout.config import HFEngineConfig
from rstar2_rollout.engine import Generation, KVCapacity, SamplingParams

MAX_LORA_RANK = 512  # PEFT takes any rank; the largest vLLM takes, so both engines agree
_EXTRA_HINT = 'the transformers engine needs the hf extra: pip install "rstar2-rollout[hf]"'


class HFEngine:
    """A transformers causal LM answering one request at a time."""

    def __init__(self, model: Any, tokenizer: Any = None, name: str = "hf-0") -> None:
        self.name = name
        self.model = model.eval()
        self.model.generation_config = _plain_generation_config(model.generation_config)
        self.tokenizer = tokenizer
        self._lock = threading.Lock()
        self.weights_version = 0  # weight updates loaded since the engine started
        self._closed = False

    @classmethod
    def from_config(cls, config: HFEngineConfig, name: str = "hf-0") -> HFEngine:
        if config.model is None:
            raise ValueError(f"engine {name} has no model: fill(model=FOLDER) first")
        try:
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer
        except ImportError as exc:
            raise ImportError(_EXTRA_HINT) from exc
        dtype = getattr(torch, config.dtype)
        model = AutoModelForCausalLM.from_pretrained(config.model, dtype=dtype)
        model = model.to(config.device)  # type: ignore[arg-type]
        return cls(model, AutoTokenizer.from_pretrained(config.model), name=name)

    def kv_capacity(self) -> KVCapacity | None:
        return None

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, request_id: str
    ) -> Generation:
        if self._closed:
            return Generation([], finish_reason="error", error=f"engine {self.name} closed")
        try:
            return await asyncio.to_thread(self.generate_sync, list(prompt_ids), params)
        except Exception as exc:
            return Generation([], finish_reason="error", error=f"{type(exc).__name__}: {exc}")

    def generate_sync(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        """Blocking generation of one request (also used by test servers)."""
        import torch

        device = self.model.device
        inputs = torch.tensor([prompt_ids], device=device)  # [1, P]
        stop_ids = list(params.stop_token_ids) or _as_list(
            self.model.generation_config.eos_token_id
        )
        kwargs: dict[str, Any] = {
            "max_new_tokens": params.max_tokens,
            "eos_token_id": stop_ids,
            "pad_token_id": self.model.generation_config.pad_token_id or stop_ids[0],
            "return_dict_in_generate": True,
            "output_scores": True,
        }
        if params.temperature > 0:
            kwargs.update(
                do_sample=True, temperature=params.temperature, top_p=params.top_p, top_k=0
            )
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        if params.stop:
            kwargs.update(stop_strings=list(params.stop), tokenizer=self.tokenizer)
        with self._lock, torch.inference_mode():
            if params.seed is not None:
                torch.manual_seed(params.seed)
            out = self.model.generate(inputs, attention_mask=torch.ones_like(inputs), **kwargs)
            version = self.weights_version
        new = out.sequences[0, len(prompt_ids) :]  # [N]
        logprobs: list[float] = []
        if params.logprobs and len(new):
            scores = torch.stack(out.scores)[:, 0, :].float()  # [N, V], what was sampled from
            picked = torch.log_softmax(scores, dim=-1).gather(1, new[:, None])  # [N, 1]
            logprobs = picked[:, 0].tolist()
        token_ids = new.tolist()
        stopped = bool(token_ids) and token_ids[-1] in stop_ids
        if params.stop and self.tokenizer is not None:
            text = self.tokenizer.decode(token_ids, skip_special_tokens=False)
            stopped = stopped or any(text.endswith(s) for s in params.stop)
        finish = "stop" if stopped or len(token_ids) < params.max_tokens else "length"
        return Generation(token_ids, logprobs, finish, weights_version=version)

    async def update_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        await asyncio.to_thread(self._load, named_tensors)

    def _load(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        import torch

        state = self.model.state_dict()
        with self._lock, torch.no_grad():
            try:
                for name, tensor in named_tensors:
                    if name not in state:
                        raise KeyError(f"{self.name}: the model has no weight named {name!r}")
                    state[name].copy_(tensor)
            finally:
                self.weights_version += 1  # a failed update changed weights too

    @property
    def adapter_dtype(self) -> Any:
        return next(self.model.parameters()).dtype

    @property
    def max_lora_rank(self) -> int | None:
        return MAX_LORA_RANK

    async def load_adapter(self, adapter: Any) -> None:
        """The LoRA adapter (`adapter.Adapter`) into the model through PEFT (module docstring)."""
        await asyncio.to_thread(self._load_adapter, adapter)

    def _load_adapter(self, adapter: Any) -> None:
        import torch
        from peft import PeftConfig, PeftModel, get_peft_model, set_peft_model_state_dict

        with self._lock, torch.no_grad():
            try:
                if not isinstance(self.model, PeftModel):
                    settings = {k: v for k, v in adapter.config.items() if k != "peft_version"}
                    config = PeftConfig.from_peft_type(**settings)
                    self.model = get_peft_model(self.model, config).eval()  # type: ignore[arg-type]
                dtype = self.adapter_dtype
                state = {n: t.to(self.model.device, dtype) for n, t in adapter.tensors}
                result = set_peft_model_state_dict(self.model, state)
                if getattr(result, "unexpected_keys", None):
                    raise KeyError(f"{self.name}: the adapter names {result.unexpected_keys[:3]}")
            finally:
                self.weights_version += 1  # a failed load changed weights too

    async def close(self) -> None:
        self._closed = True


def _plain_generation_config(config: Any) -> Any:
    """The model's generation config with its token ids only: no sampling defaults."""
    from transformers import GenerationConfig

    keep = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")
    return GenerationConfig(**{k: getattr(config, k, None) for k in keep})


def _as_list(token_id: int | list[int] | None) -> list[int]:
    if token_id is None:
        return []
    return [token_id] if isinstance(token_id, int) else list(token_id)
