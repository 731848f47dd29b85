"""`.ninfer` v2 tensor formats and layouts: sizes, encoders and decoders.

One entry point per operation, dispatching on the exact (format, layout) identity:
`packed_nbytes`, `encode`, `decode`. The per-family codecs (`plain`, `groupwise`, `nvfp4`)
also expose the logical words (codes, scales, divisors) for converters and kernel tests.
"""

from __future__ import annotations

import numpy as np

from inferno.artifact.formats import groupwise, nvfp4, plain
from inferno.artifact.formats.registry import (
    BLOCKSCALE,
    CONTIGUOUS,
    FORMATS,
    LAYOUTS,
    RAW_BYTES,
    RESOURCE_ENCODINGS,
    ROW_SPLIT,
    TENSOR_ALIGNMENT,
)
from inferno.errors import ArtifactError

__all__ = [
    "BLOCKSCALE", "CONTIGUOUS", "FORMATS", "LAYOUTS", "RAW_BYTES", "RESOURCE_ENCODINGS",
    "ROW_SPLIT", "TENSOR_ALIGNMENT", "check_combination", "decode", "encode", "packed_nbytes",
]


def check_combination(fmt: str, layout: str, shape: tuple[int, ...]) -> None:
    """Raise ArtifactError unless `layout` is registered, accepts `fmt`, and accepts `shape`'s rank.

    Rank rules (storage-layouts.md §1): contiguous-le-v1 0..16; row-split-k128-v1 and
    blockscale-k16-m128x4-v1 exactly 2 (blockscale also N % 128 == 0, K % 64 == 0).
    """
    if fmt not in FORMATS:
        raise ArtifactError(f"unknown tensor format {fmt!r} (registered: {', '.join(FORMATS)})")
    if layout not in LAYOUTS:
        raise ArtifactError(f"unknown tensor layout {layout!r} (registered: {', '.join(LAYOUTS)})")
    if fmt not in LAYOUTS[layout]:
        raise ArtifactError(f"layout {layout} does not accept format {fmt} (it accepts {', '.join(LAYOUTS[layout])})")
    if any(type(d) is not int or d <= 0 for d in shape):
        raise ArtifactError(f"shape {list(shape)} must hold positive integers")
    if layout == ROW_SPLIT and len(shape) != 2:
        raise ArtifactError(f"{layout} stores rank-2 [N, K] tensors, got shape {list(shape)}")
    if layout == BLOCKSCALE:
        nvfp4.geometry(shape)


def packed_nbytes(fmt: str, layout: str, shape: tuple[int, ...]) -> int:
    """Exact stored byte length of a tensor (the JSON `bytes` member must equal this)."""
    shape = tuple(shape)
    check_combination(fmt, layout, shape)
    if layout == CONTIGUOUS:
        return plain.nbytes(fmt, shape)
    if layout == ROW_SPLIT:
        return groupwise.geometry(fmt, shape).nbytes
    return nvfp4.geometry(shape).nbytes


def _codec_shape(fmt: str, layout: str, shape: tuple[int, ...]) -> None:
    """Like check_combination, but row-split also takes [..., K] (flattened to rows)."""
    if layout == ROW_SPLIT and len(shape) > 2:
        check_combination(fmt, layout, (int(np.prod(shape[:-1])), shape[-1]))
    else:
        check_combination(fmt, layout, shape)


def encode(fmt: str, layout: str, w: np.ndarray) -> np.ndarray:
    """Values in their logical shape -> payload bytes (uint8) of (fmt, layout).

    Direct formats keep exact words (BF16 from float32 rounds to nearest even; I32 needs
    integers); Q4/Q5/Q6/W8 use the canonical `MAXABS_F16_RECIP_RNE_V1` encoder; NVFP4 uses
    Inferno's max-abs encoder (`nvfp4.quantize`). Row-split also takes [..., K] (e.g. experts
    [E, N, K]); the bytes are those of the rank-2 [E*N, K] tensor that the artifact stores.
    """
    w = np.asarray(w)
    _codec_shape(fmt, layout, tuple(int(d) for d in w.shape))
    if layout == CONTIGUOUS:
        return plain.encode(fmt, w)
    if layout == ROW_SPLIT:
        return groupwise.encode(fmt, w)
    return nvfp4.encode(w)


def decode(fmt: str, layout: str, data, shape: tuple[int, ...]) -> np.ndarray:
    """Payload bytes -> values in `shape`: float32 (I32 -> int32, exact).

    `data` is any buffer (bytes, memoryview of an artifact, uint8 array). Layout invariants
    (length, zero padding, valid scales/divisor) are checked; violations raise ArtifactError.
    """
    shape = tuple(int(d) for d in shape)
    _codec_shape(fmt, layout, shape)
    if layout == CONTIGUOUS:
        return plain.decode(fmt, data, shape)
    if layout == ROW_SPLIT:
        return groupwise.decode(fmt, data, shape)
    return nvfp4.decode(data, shape)
