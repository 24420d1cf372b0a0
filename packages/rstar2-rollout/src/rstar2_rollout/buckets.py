"""Weights in buckets of bounded size, cast lazily to the engine's dtype.

Contract
- `iter_buckets(named_tensors, dtype, bucket_bytes)` reads `(name, tensor)` pairs one at a time
  and yields `Bucket`s whose total size in `dtype` is at most `bucket_bytes` (`Bucket.nbytes`);
  a tensor larger than a bucket travels alone. Order is kept.
- A `Bucket` holds references to the source tensors, not copies. Iterating it yields
  `(name, tensor.detach().to(dtype))` one tensor at a time (a tensor already in `dtype` is passed
  as is), so a consumer in the same process (a TP=1 vLLM engine) holds one cast tensor at a time;
  `list(bucket)` makes the bucket's cast copies at once, for a consumer in another process
  (pickled to TP workers, broadcast over a channel): at most one bucket, never the whole model.
  A bucket can be read more than once (once per engine).
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


class Bucket:
    """Named source tensors of one bucket, cast to `dtype` as they are read."""

    def __init__(self, items: list[tuple[str, Any]], dtype: Any, nbytes: int) -> None:
        self.items = items
        self.dtype = dtype
        self.nbytes = nbytes  # in `dtype`

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        for name, tensor in self.items:
            yield name, tensor.detach().to(self.dtype)

    def __len__(self) -> int:
        return len(self.items)

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.items]


def iter_buckets(
    named_tensors: Iterable[tuple[str, Any]], dtype: Any, bucket_bytes: int = DEFAULT_BUCKET_BYTES
) -> Iterator[Bucket]:
    """Buckets of at most `bucket_bytes` in `dtype` (or one larger tensor), read lazily."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be positive, not {bucket_bytes}")
    items: list[tuple[str, Any]] = []
    size = 0
    for name, tensor in named_tensors:
        nbytes = tensor_bytes(tensor, dtype)
        if items and size + nbytes > bucket_bytes:
            yield Bucket(items, dtype, size)
            items, size = [], 0
        items.append((name, tensor))
        size += nbytes
    if items:
        yield Bucket(items, dtype, size)
