"""The closed registries of `.ninfer` v2 tensor formats, tensor layouts and resource encodings.

Source: NInfer `docs/maintainer/tensor-formats.md` §1 and `storage-layouts.md` §1 (v2 revision).
Names are exact identities, never parsed into parts.
"""

from __future__ import annotations

CONTIGUOUS = "contiguous-le-v1"
ROW_SPLIT = "row-split-k128-v1"
BLOCKSCALE = "blockscale-k16-m128x4-v1"
RAW_BYTES = "raw-bytes-v1"

DIRECT_FORMATS = ("BF16", "FP32", "I32")
GROUPWISE_FORMATS = ("Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S")
NVFP4 = "NVFP4"

LAYOUTS: dict[str, tuple[str, ...]] = {
    CONTIGUOUS: DIRECT_FORMATS,
    ROW_SPLIT: GROUPWISE_FORMATS,
    BLOCKSCALE: (NVFP4,),
}
"""Every registered tensor layout -> the formats it accepts."""

FORMATS: dict[str, tuple[str, ...]] = {
    fmt: tuple(layout for layout, fmts in LAYOUTS.items() if fmt in fmts)
    for fmt in (*DIRECT_FORMATS, *GROUPWISE_FORMATS, NVFP4)
}
"""Every registered tensor format -> the layouts it may be stored in."""

RESOURCE_ENCODINGS: dict[str, int] = {RAW_BYTES: 1}
"""Every registered resource encoding -> its payload-offset alignment in bytes."""

TENSOR_ALIGNMENT = 256
"""Payload-offset alignment of every registered tensor layout (storage-layouts.md §1)."""

V1_FORMATS = (*DIRECT_FORMATS, *GROUPWISE_FORMATS)
V1_LAYOUTS = (CONTIGUOUS, ROW_SPLIT)
"""The revision-1 registries: NVFP4 and its layout arrived with revision 2."""
