"""Paged KV cache layout of the gated full-attention layers, and numpy helpers for it.

One pool per attention layer, bf16, viewed by the kernels as rows of `head_dim` (256) values:

    pool[n_pages, 2 (k, v), n_kv_heads, PAGE_TOKENS (64), head_dim]      row stride head_dim

so the K (or V) of one kv head over one page is one contiguous 32 KiB block (64 rows of 512
bytes). A sequence's token i lives in page `page_table[i // 64]` at row `i % 64`; the page
table is int32 `[batch, max_pages]` (row stride `pt_stride`), one row per sequence, and pages
may sit anywhere in the pool in any order. Row of (page, kv, head, token):
`((page * 2 + kv) * n_kv_heads + head) * 64 + token`. K is stored after the q/k norm and
RoPE; V as projected.

Sizes: 27B (4 kv heads) 256 KiB per page = 4 KiB per token per layer, 64 KiB per token over
the 16 attention layers; 35B-A3B (2 kv heads) half that.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from ml_dtypes import bfloat16

from inferno.errors import InfernoError

PAGE_TOKENS = 64
HEAD_DIM = 256


class KVLayoutError(InfernoError):
    """A page table, length or pool that does not fit the paged KV layout."""


@dataclass(frozen=True)
class KVLayout:
    """Page geometry of one attention layer's KV pool."""

    n_kv_heads: int
    head_dim: int = HEAD_DIM
    page_tokens: int = PAGE_TOKENS

    @property
    def rows_per_page(self) -> int:
        return 2 * self.n_kv_heads * self.page_tokens

    @property
    def page_bytes(self) -> int:
        return self.rows_per_page * self.head_dim * 2

    @property
    def token_bytes(self) -> int:
        """KV bytes one token adds to one layer (K and V, every kv head)."""
        return 2 * self.n_kv_heads * self.head_dim * 2

    def pool_shape(self, n_pages: int) -> tuple[int, int, int, int, int]:
        return (n_pages, 2, self.n_kv_heads, self.page_tokens, self.head_dim)

    def pages_for(self, length: int) -> int:
        """Pages a sequence of `length` tokens occupies."""
        return -(-length // self.page_tokens)

    def row(self, page: int, kv: int, head: int, token: int) -> int:
        """Row of the pool (viewed as [rows, head_dim]) holding (page, k=0/v=1, kv head, token in page)."""
        return ((page * 2 + kv) * self.n_kv_heads + head) * self.page_tokens + token

    def empty_pool(self, n_pages: int, fill: float = float("nan")) -> np.ndarray:
        """A bf16 pool `[n_pages, 2, Hkv, 64, head_dim]` filled with `fill` (NaN: poison)."""
        return np.full(self.pool_shape(n_pages), fill, dtype=bfloat16)

    def _check(self, pool: np.ndarray, pages: np.ndarray, length: int) -> None:
        if pool.shape[1:] != self.pool_shape(0)[1:]:
            raise KVLayoutError(f"KV pool shape {pool.shape} does not match {self.pool_shape(pool.shape[0])}")
        need = self.pages_for(length)
        if len(pages) < need:
            raise KVLayoutError(f"page table has {len(pages)} pages, {length} tokens need {need}; grow the table")
        used = np.asarray(pages[:need])
        if need and (used.min() < 0 or used.max() >= pool.shape[0]):
            raise KVLayoutError(f"page table points outside the pool of {pool.shape[0]} pages")

    def write(self, pool: np.ndarray, pages: np.ndarray, start: int, k: np.ndarray, v: np.ndarray) -> None:
        """Store k, v `[T, Hkv, head_dim]` as tokens start..start+T-1 of the sequence with `pages`."""
        t = k.shape[0]
        self._check(pool, pages, start + t)
        for i in range(t):
            p, r = divmod(start + i, self.page_tokens)
            pool[pages[p], 0, :, r] = k[i]
            pool[pages[p], 1, :, r] = v[i]

    def gather(self, pool: np.ndarray, pages: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
        """K, V `[length, Hkv, head_dim]` (float32) of the sequence with `pages`."""
        self._check(pool, pages, length)
        n = self.pages_for(length)
        blocks = pool[np.asarray(pages[:n], np.int64)].astype(np.float32)  # [n, 2, Hkv, 64, d]
        kv = blocks.transpose(1, 0, 3, 2, 4).reshape(2, n * self.page_tokens, self.n_kv_heads, self.head_dim)
        return kv[0, :length], kv[1, :length]


def page_table(seqs: list[list[int]], width: int | None = None, fill: int = -1) -> np.ndarray:
    """int32 `[len(seqs), width]` page table from per-sequence page lists (unused entries = fill)."""
    width = max([len(s) for s in seqs] + [1]) if width is None else width
    if any(len(s) > width for s in seqs):
        raise KVLayoutError(f"a sequence has more than {width} pages; widen the page table")
    table = np.full((len(seqs), width), fill, np.int32)
    for b, s in enumerate(seqs):
        table[b, : len(s)] = s
    return table
