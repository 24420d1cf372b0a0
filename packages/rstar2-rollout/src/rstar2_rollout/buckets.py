"""Weights in buckets of bounded size, cast lazily to the engine's dtype.

Contract
- `iter_buckets(named_tensors, dtype, bucket_bytes)` reads `(name, tensor)` pairs one at a time
  and yields lists of them whose total size in `dtype` is at most `bucket_bytes`; a tensor larger
  than a bucket travels alone. Each tensor is cast (`detach().to(dtype)`) only when its bucket is
  built, so the caller holds at most one bucket of cast copies (none for a tensor already in
  `dtype`, which is passed as is), never a whole copy of the model. Order is kept.
- `tensor_bytes(tensor, dtype)` is the size a tensor takes once cast.

This module holds no engine; it needs torch only when called.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

DEFAULT_BUCKET_BYTES = 1 << 30


def tensor_bytes(tensor: Any, dtype: Any) -> int:
    """Bytes `tensor` takes in `dtype` (a torch dtype)."""
    return tensor.numel() * dtype.itemsize


def iter_buckets(
    named_tensors: Iterable[tuple[str, Any]], dtype: Any, bucket_bytes: int = DEFAULT_BUCKET_BYTES
) -> Iterator[list[tuple[str, Any]]]:
    """Buckets of `(name, tensor in dtype)` of at most `bucket_bytes` each (or one large tensor)."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be positive, not {bucket_bytes}")
    bucket: list[tuple[str, Any]] = []
    size = 0
    for name, tensor in named_tensors:
        nbytes = tensor_bytes(tensor, dtype)
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor.detach().to(dtype)))
        size += nbytes
    if bucket:
        yield bucket
