"""The vLLM engine's LoRA adapters: the base served with LoRA enabled, a new adapter per push.

`AdapterUpdates` is the half of `VLLMEngine` that loads adapters (the `AdapterEngine`
capability); an engine built with `max_lora_rank` has vLLM's LoRA enabled (`_args.lora_args`:
two adapters on the device at once, more in host memory). `load_adapter(adapter)` runs on the
engine thread between two steps, without draining: it writes the adapter as a PEFT folder in a
private temporary directory (`/dev/shm` where there is one), registers it with vLLM
(`LLMEngine.add_lora`, a new adapter id per version) and makes it the current one; the requests
submitted from then on run with it and carry the new `weights_version`. Requests already running
keep the adapter they started with and report that version; an adapter no running request uses
any more is removed (`remove_lora`) and its folder deleted. With `at_push: abort` the running
requests are aborted first and answered "interrupted" (the caller resumes them on the new
adapter). The base weights never change, so nothing is reloaded; the prefix cache needs no
reset, since vLLM's block hashes include the adapter's name and path.

`_begin_request(request_id)` (when a request is added: its version and its `LoRARequest`) and
`_end_request(request_id)` (when it finishes or is aborted: its version) are what `VLLMEngine`
calls. Not covered: adapters under tensor parallelism were not run (vLLM loads them on every
worker from the same folder, so they need one filesystem; here that is the engine's own).
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
from pathlib import Path
from typing import Any

from rstar2_rollout.adapter import Adapter, write_adapter


class AdapterUpdates:
    """LoRA adapter versions of `VLLMEngine` (which supplies the attributes declared here)."""

    name: str
    config: Any  # VLLMEngineConfig
    weights_version: int
    _engine: Any
    _weight_dtype: Any

    async def _call(self, fn: Any, *, drain: bool = True) -> Any:
        raise NotImplementedError  # VLLMEngine's

    def _interrupt(self) -> None:
        raise NotImplementedError  # VLLMEngine's

    def _init_adapters(self) -> None:
        self._lora: Any = None  # the current LoRARequest; None: the base alone
        self._lora_uses: dict[int, int] = {}  # adapter id -> requests running with it
        self._lora_folders: dict[int, Path] = {}
        self._lora_ids = itertools.count(1)
        self._started: dict[str, tuple[int, int | None]] = {}  # request -> (version, adapter id)
        self._lora_root: Path | None = None

    @property
    def adapter_dtype(self) -> Any:
        return self._weight_dtype  # vLLM's lora_dtype "auto": the model's

    @property
    def max_lora_rank(self) -> int | None:
        return self.config.max_lora_rank

    async def load_adapter(self, adapter: Adapter) -> None:
        """Make `adapter` the policy of the requests submitted next (module docstring)."""
        if self.config.max_lora_rank is None:
            raise RuntimeError(
                f"engine {self.name} serves no adapters: build it with max_lora_rank set"
            )
        if adapter.rank > self.config.max_lora_rank:
            raise ValueError(
                f"engine {self.name}: adapter rank {adapter.rank} is above its max_lora_rank "
                f"{self.config.max_lora_rank}"
            )
        abort = self.config.at_push == "abort"

        def load() -> None:
            from vllm.lora.request import LoRARequest

            if abort:
                self._interrupt()
            version = self.weights_version + 1
            adapter_id = next(self._lora_ids)
            folder = write_adapter(adapter, self._root(adapter.nbytes) / f"v{version}-{adapter_id}")
            request = LoRARequest(f"{self.name}-v{version}", adapter_id, str(folder))
            if not self._engine.add_lora(request):
                shutil.rmtree(folder, ignore_errors=True)
                raise RuntimeError(f"engine {self.name}: vLLM did not take adapter v{version}")
            self._lora_folders[adapter_id] = folder
            self._lora_uses.setdefault(adapter_id, 0)
            self._lora = request
            self.weights_version = version
            self._drop_unused()

        await self._call(load, drain=False)

    def _root(self, adapter_bytes: int) -> Path:
        """Where adapter versions are written for vLLM to load: /dev/shm (memory) when it can
        hold three of them (two versions live and one being written), else the temporary
        directory. A container's /dev/shm is often 64 MB, and a 14B adapter at rank 32 is
        about 257 MB in bf16."""
        if self._lora_root is None:
            base = adapter_dir_base(Path("/dev/shm"), adapter_bytes)
            self._lora_root = Path(tempfile.mkdtemp(prefix=f"rstar2-lora-{self.name}-", dir=base))
        return self._lora_root

    def _begin_request(self, request_id: str) -> Any:
        """A request is added: record its version and adapter; the `LoRARequest` it runs with."""
        adapter_id = self._lora.lora_int_id if self._lora is not None else None
        self._started[request_id] = (self.weights_version, adapter_id)
        if adapter_id is not None:
            self._lora_uses[adapter_id] = self._lora_uses.get(adapter_id, 0) + 1
        return self._lora

    def _end_request(self, request_id: str) -> int:
        """A request has finished or was aborted: the version it ran on."""
        version, adapter_id = self._started.pop(request_id, (self.weights_version, None))
        if adapter_id is not None:
            self._lora_uses[adapter_id] -= 1
            self._drop_unused()
        return version

    def _drop_unused(self) -> None:
        """Remove every adapter but the current one that no running request uses."""
        current = self._lora.lora_int_id if self._lora is not None else None
        for adapter_id, uses in list(self._lora_uses.items()):
            if adapter_id == current or uses > 0:
                continue
            del self._lora_uses[adapter_id]
            self._engine.remove_lora(adapter_id)
            shutil.rmtree(self._lora_folders.pop(adapter_id), ignore_errors=True)

    def _close_adapters(self) -> None:
        if self._lora_root is not None:
            shutil.rmtree(self._lora_root, ignore_errors=True)


def adapter_dir_base(shm: Path, adapter_bytes: int) -> str | None:
    """`shm` when it is a folder with room for three adapters of `adapter_bytes`, else None
    (`tempfile`'s default directory)."""
    if not shm.is_dir():
        return None
    return str(shm) if shutil.disk_usage(shm).free > 3 * adapter_bytes else None
