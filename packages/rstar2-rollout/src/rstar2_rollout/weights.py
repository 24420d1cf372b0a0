"""Weights on the wire: safetensors bytes, checked against the model's names and shapes.

A weight update travels as one safetensors file (an 8-byte header length, a JSON header with each
tensor's dtype, shape and byte range, then the raw data), cut into pieces for the stream.

- `to_safetensors(named_tensors)` (sender, needs torch) serialises tensors from any device.
- `read_header(data)` parses the header without torch and checks its byte ranges.
- `WeightSpec.from_model_dir(dir)` reads the names and shapes a model folder declares (from its
  `*.safetensors` headers: nothing is loaded); `spec.check(header)` raises `InvalidWeights`
  naming the first unknown tensor or the first wrong shape, before any engine is touched.
- `load_tensors(data)` (receiver, needs torch) turns the bytes into (name, tensor) pairs.
- `spec.max_payload_bytes()` is the largest update a worker accepts: the model's own size with
  every tensor at least float32 wide (a float32 trainer may feed bfloat16 engines), plus room
  for the header; a stream beyond it is refused before it is held in memory.

A subset of the model's tensors is a valid update; dtypes may differ from the model's (engines
cast on load, e.g. a float32 trainer feeding bfloat16 engines). Not covered: quantised weights,
names that differ from the Hugging Face checkpoint's (vLLM maps those itself).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_DTYPE_BYTES = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
    "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1,
}  # fmt: skip


class InvalidWeights(ValueError):
    """The payload cannot be loaded into this model (INVALID_ARGUMENT); nothing was changed."""


@dataclass(frozen=True)
class TensorInfo:
    dtype: str  # safetensors dtype name: F32, BF16, ...
    shape: tuple[int, ...]


def read_header(data: bytes | bytearray | memoryview) -> dict[str, TensorInfo]:
    """The tensors a safetensors payload holds; InvalidWeights when it is not one."""
    if len(data) < 8:
        raise InvalidWeights(f"not a safetensors payload: {len(data)} bytes, no header")
    (size,) = struct.unpack("<Q", bytes(data[:8]))
    if size > len(data) - 8:
        raise InvalidWeights(f"not a safetensors payload: header of {size} bytes is cut off")
    return _entries(bytes(data[8 : 8 + size]), body=len(data) - 8 - size)


def _entries(head: bytes, body: int) -> dict[str, TensorInfo]:
    """Parse a header and check each tensor's byte range fits a `body`-byte data section."""
    try:
        header = json.loads(head)
    except ValueError as exc:
        raise InvalidWeights(f"not a safetensors payload: bad header ({exc})") from None
    if not isinstance(header, dict):
        raise InvalidWeights("not a safetensors payload: the header is not an object")
    out: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = (
                entry["dtype"],
                tuple(entry["shape"]),
                entry["data_offsets"],
            )
        except (KeyError, TypeError, ValueError):
            raise InvalidWeights(f"tensor {name!r}: malformed header entry {entry!r}") from None
        count = 1
        for d in shape:
            count *= d
        if dtype not in _DTYPE_BYTES:
            raise InvalidWeights(f"tensor {name!r}: unsupported dtype {dtype}")
        if not 0 <= begin <= end <= body or end - begin != count * _DTYPE_BYTES[dtype]:
            raise InvalidWeights(
                f"tensor {name!r}: bytes {begin}..{end} do not hold a {dtype} tensor of shape"
                f" {list(shape)} in a {body}-byte body"
            )
        out[name] = TensorInfo(dtype, shape)
    if not out:
        raise InvalidWeights("the payload holds no tensor")
    return out


@dataclass(frozen=True)
class WeightSpec:
    """The names and shapes of a model's weights, as its checkpoint declares them."""

    tensors: Mapping[str, TensorInfo]

    @classmethod
    def from_model_dir(cls, model_dir: str | Path) -> WeightSpec | None:
        """From the folder's `*.safetensors` headers; None when it has none."""
        tensors: dict[str, TensorInfo] = {}
        for path in sorted(Path(model_dir).glob("*.safetensors")):
            with path.open("rb") as f:
                (size,) = struct.unpack("<Q", f.read(8))
                head = f.read(size)
            tensors.update(_entries(head, body=path.stat().st_size - 8 - size))
        return cls(tensors) if tensors else None

    def max_payload_bytes(self) -> int:
        """The model's size with each tensor at least 4 bytes per element, plus header room
        (64 KiB and 1 KiB per tensor): no valid update of these tensors is larger."""
        body = 0
        for info in self.tensors.values():
            count = 1
            for d in info.shape:
                count *= d
            body += count * max(4, _DTYPE_BYTES.get(info.dtype, 4))
        return 8 + (64 << 10) + (1 << 10) * len(self.tensors) + body

    def check(self, payload: Mapping[str, TensorInfo]) -> None:
        """Raise InvalidWeights naming the first unknown tensor or wrong shape."""
        for name, info in payload.items():
            want = self.tensors.get(name)
            if want is None:
                close = [n for n in self.tensors if n.rsplit(".", 1)[-1] == name.rsplit(".", 1)[-1]]
                hint = f" (the model has e.g. {close[0]!r})" if close else ""
                raise InvalidWeights(f"unknown weight {name!r}: the model has no such tensor{hint}")
            if want.shape != info.shape:
                raise InvalidWeights(
                    f"weight {name!r} has shape {list(info.shape)}; the model's is"
                    f" {list(want.shape)}"
                )


def to_safetensors(named_tensors: Iterable[tuple[str, Any]]) -> bytes:
    """Serialise (name, torch tensor) pairs, from any device, as one safetensors payload."""
    try:
        from safetensors.torch import save
    except ImportError as exc:
        raise ImportError(
            'sending weights needs torch and safetensors: pip install "rstar2-rollout[hf]"'
        ) from exc
    seen: set[int] = set()
    tensors = {}
    for name, t in named_tensors:
        cpu = t.detach().to("cpu").contiguous()
        if cpu.data_ptr() in seen:  # tied or shared storage: safetensors wants distinct buffers
            cpu = cpu.clone()
        seen.add(cpu.data_ptr())
        tensors[name] = cpu
    return save(tensors)


def load_tensors(data: bytes) -> list[tuple[str, Any]]:
    """The (name, CPU tensor) pairs of a safetensors payload (needs torch)."""
    try:
        from safetensors.torch import load
    except ImportError as exc:
        raise ImportError(
            'loading weights needs torch and safetensors: pip install "rstar2-rollout[hf]"'
        ) from exc
    return list(load(data).items())


def pieces(data: bytes, size: int) -> Iterator[bytes]:
    """`data` cut into pieces of at most `size` bytes, for a gRPC stream."""
    view = memoryview(data)
    for start in range(0, len(data), size):
        yield bytes(view[start : start + size])
