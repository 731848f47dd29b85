"""Direct formats BF16 / FP32 / I32 in layout `contiguous-le-v1`.

C order, one little-endian word per element, no header or padding
(NInfer `storage-layouts.md` §2). Words are preserved bit for bit: a BF16 source stays its own
word (NaN payloads included); an FP32 source becomes BF16 by round-to-nearest-even.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from inferno.errors import ArtifactError

WORD_DTYPES: dict[str, np.dtype] = {
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "FP32": np.dtype("<f4"),
    "I32": np.dtype("<i4"),
}
MAX_RANK = 16


def nbytes(fmt: str, shape: tuple[int, ...]) -> int:
    """Encoded size of a direct tensor; rank 0..16."""
    if len(shape) > MAX_RANK:
        raise ArtifactError(f"{fmt} in contiguous-le-v1 allows rank 0..{MAX_RANK}, got shape {list(shape)}")
    return math.prod(shape) * WORD_DTYPES[fmt].itemsize


def to_words(fmt: str, w: np.ndarray) -> np.ndarray:
    """Convert `w` to the format's logical words (exact; BF16 from FP32 rounds to nearest even)."""
    w = np.asarray(w)
    if fmt == "I32":
        if w.dtype.kind not in "iub":
            raise ArtifactError(f"I32 tensors need integer values, got dtype {w.dtype}")
        if w.size and (w.min() < -(2**31) or w.max() > 2**31 - 1):
            raise ArtifactError("I32 tensor has values outside [-2^31, 2^31-1]")
        return w.astype("<i4")
    if w.dtype.kind != "f" and w.dtype != WORD_DTYPES["BF16"]:
        raise ArtifactError(f"{fmt} tensors need floating-point values, got dtype {w.dtype}")
    if fmt == "BF16":
        return w.astype(ml_dtypes.bfloat16)
    if w.dtype.itemsize > 4:
        with np.errstate(over="ignore"):
            out = w.astype("<f4")
        if np.any(np.isfinite(w) != np.isfinite(out)):
            raise ArtifactError("FP32 tensor has values beyond the float32 range")
        return out
    return w.astype("<f4")


def encode(fmt: str, w: np.ndarray) -> np.ndarray:
    """Logical words of `w` -> the payload bytes (uint8, C order, little-endian)."""
    words = np.ascontiguousarray(to_words(fmt, w))
    return words.reshape(-1).view(np.uint8)


def decode_words(fmt: str, data, shape: tuple[int, ...]) -> np.ndarray:
    """Payload bytes -> the logical words in `shape` (bfloat16, float32 or int32; zero-copy)."""
    buf = np.frombuffer(data, dtype=np.uint8)
    want = nbytes(fmt, shape)
    if buf.size != want:
        raise ArtifactError(f"{fmt} payload of shape {list(shape)} needs {want} bytes, got {buf.size}")
    return buf.view(WORD_DTYPES[fmt]).reshape(shape)


def decode(fmt: str, data, shape: tuple[int, ...]) -> np.ndarray:
    """Payload bytes -> float32 values (I32 stays int32: its words are exact integers)."""
    words = decode_words(fmt, data, shape)
    if fmt == "I32":
        return words.astype(np.int32)
    return words.astype(np.float32)
