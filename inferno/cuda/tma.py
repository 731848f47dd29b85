"""TMA descriptors (CUtensorMap) for tiled bulk copies, validated before cuTensorMapEncodeTiled."""

from __future__ import annotations

import ctypes
from typing import Any, Sequence

from inferno.cuda.driver import driver
from inferno.cuda.errors import LaunchError, check

# dtype name -> (CUtensorMapDataType member, element bytes; 0 = packed sub-byte formats counted per 16 elements)
_DTYPES = {
    "u8": ("CU_TENSOR_MAP_DATA_TYPE_UINT8", 1), "u16": ("CU_TENSOR_MAP_DATA_TYPE_UINT16", 2),
    "u32": ("CU_TENSOR_MAP_DATA_TYPE_UINT32", 4), "i32": ("CU_TENSOR_MAP_DATA_TYPE_INT32", 4),
    "u64": ("CU_TENSOR_MAP_DATA_TYPE_UINT64", 8), "i64": ("CU_TENSOR_MAP_DATA_TYPE_INT64", 8),
    "f16": ("CU_TENSOR_MAP_DATA_TYPE_FLOAT16", 2), "f32": ("CU_TENSOR_MAP_DATA_TYPE_FLOAT32", 4),
    "f64": ("CU_TENSOR_MAP_DATA_TYPE_FLOAT64", 8), "bf16": ("CU_TENSOR_MAP_DATA_TYPE_BFLOAT16", 2),
    "f32_ftz": ("CU_TENSOR_MAP_DATA_TYPE_FLOAT32_FTZ", 4), "tf32": ("CU_TENSOR_MAP_DATA_TYPE_TFLOAT32", 4),
    "tf32_ftz": ("CU_TENSOR_MAP_DATA_TYPE_TFLOAT32_FTZ", 4),
}
_SWIZZLE = {0: "CU_TENSOR_MAP_SWIZZLE_NONE", 32: "CU_TENSOR_MAP_SWIZZLE_32B",
            64: "CU_TENSOR_MAP_SWIZZLE_64B", 128: "CU_TENSOR_MAP_SWIZZLE_128B"}
_L2 = {0: "CU_TENSOR_MAP_L2_PROMOTION_NONE", 64: "CU_TENSOR_MAP_L2_PROMOTION_L2_64B",
       128: "CU_TENSOR_MAP_L2_PROMOTION_L2_128B", 256: "CU_TENSOR_MAP_L2_PROMOTION_L2_256B"}
_OOB = {"none": "CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE", "nan": "CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA"}
TMA_BYTES = 128


def _ints(v: Any, what: str) -> list[int]:
    try:
        out = [int(x.__index__()) for x in v]
    except (TypeError, AttributeError):
        raise LaunchError(f"TMA descriptor: {what} must be a sequence of ints, got {v!r}") from None
    return out


def validate_tiled(dtype: str, ptr: int, dims: Sequence[int], strides_bytes: Sequence[int], box: Sequence[int],
                   swizzle: int, elem_strides: Sequence[int] | None, l2_promo: int, oob_fill: str) -> int:
    """Check a tiled TMA request against the driver's documented rules; returns the element size."""
    if dtype not in _DTYPES:
        raise LaunchError(f"TMA descriptor: unknown dtype {dtype!r}; use one of {', '.join(_DTYPES)}")
    esize = _DTYPES[dtype][1]
    dims, strides, box = _ints(dims, "dims"), _ints(strides_bytes, "strides_bytes"), _ints(box, "box")
    rank = len(dims)
    if not 1 <= rank <= 5:
        raise LaunchError(f"TMA descriptor: rank must be 1..5, got {rank} dims")
    if len(strides) != rank - 1:
        raise LaunchError(f"TMA descriptor: give {rank - 1} byte strides (dims 1..{rank - 1}; dim 0 is contiguous), "
                          f"got {len(strides)}")
    if len(box) != rank:
        raise LaunchError(f"TMA descriptor: box must have {rank} entries, got {len(box)}")
    es = [1] * rank if elem_strides is None else _ints(elem_strides, "elem_strides")
    if len(es) != rank or not all(1 <= e <= 8 for e in es):
        raise LaunchError(f"TMA descriptor: elem_strides must be {rank} ints in 1..8, got {es}")
    if not isinstance(ptr, int) or ptr <= 0 or ptr % 16:
        raise LaunchError(f"TMA descriptor: global address must be 16-byte aligned and non-zero, got {ptr!r}")
    if any(not 1 <= d <= 2**32 for d in dims):
        raise LaunchError(f"TMA descriptor: each dim must be in 1..2^32, got {dims}")
    if any(s <= 0 or s % 16 or s >= 2**40 for s in strides):
        raise LaunchError(f"TMA descriptor: byte strides must be positive multiples of 16 below 2^40, got {strides}")
    if any(not 1 <= b <= 256 for b in box):
        raise LaunchError(f"TMA descriptor: box sizes must be in 1..256, got {box}")
    inner = box[0] * esize
    if inner % 16:
        raise LaunchError(f"TMA descriptor: inner box {box[0]} x {esize} B = {inner} B must be a multiple of 16 bytes")
    if swizzle not in _SWIZZLE:
        raise LaunchError(f"TMA descriptor: swizzle must be one of 0, 32, 64, 128 (bytes), got {swizzle!r}")
    if swizzle and inner > swizzle:
        raise LaunchError(f"TMA descriptor: inner box of {inner} B exceeds the {swizzle}B swizzle span; "
                          f"use a box[0] of at most {swizzle // esize} elements")
    if l2_promo not in _L2:
        raise LaunchError(f"TMA descriptor: l2_promo must be one of 0, 64, 128, 256, got {l2_promo!r}")
    if oob_fill not in _OOB:
        raise LaunchError(f"TMA descriptor: oob_fill must be 'none' or 'nan', got {oob_fill!r}")
    return esize


def encode_tiled(dtype: str, ptr: int, dims: Sequence[int], strides_bytes: Sequence[int], box: Sequence[int],
                 swizzle: int = 0, elem_strides: Sequence[int] | None = None, l2_promo: int = 128,
                 oob_fill: str = "none") -> bytes:
    """A 128-byte CUtensorMap for a tiled view of `dims` (innermost first) at device address `ptr`.

    `strides_bytes` are the byte strides of dims 1..rank-1; dim 0 is contiguous. `box` is the tile
    copied per TMA operation, innermost first. The result is the `tma` kernel parameter value.
    """
    ptr = int(getattr(ptr, "ptr", ptr))
    validate_tiled(dtype, ptr, dims, strides_bytes, box, swizzle, elem_strides, l2_promo, oob_fill)
    cu = driver()
    u64, u32 = cu.cuuint64_t, cu.cuuint32_t
    rank = len(dims)
    es = [1] * rank if elem_strides is None else list(elem_strides)
    tmap = check(cu.cuTensorMapEncodeTiled(
        getattr(cu.CUtensorMapDataType, _DTYPES[dtype][0]), rank, ptr,
        [u64(int(d)) for d in dims], [u64(int(s)) for s in strides_bytes], [u32(int(b)) for b in box],
        [u32(int(e)) for e in es], cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        getattr(cu.CUtensorMapSwizzle, _SWIZZLE[swizzle]), getattr(cu.CUtensorMapL2promotion, _L2[l2_promo]),
        getattr(cu.CUtensorMapFloatOOBfill, _OOB[oob_fill])), "cuTensorMapEncodeTiled",
        f"{dtype} dims {list(dims)} box {list(box)} swizzle {swizzle}")
    return ctypes.string_at(tmap.getPtr(), TMA_BYTES)
