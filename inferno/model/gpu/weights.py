"""Upload the artifact tensors the decode path reads into the device arena, as the residency plan says.

Quantized matrices go up as their payloads byte for byte (the CUDA-core GEMV reads `row-split-k128-v1`
directly), except the groupwise-int matrices the plan's tiling policy stores TILED (`residency.tiling_mode`:
the output head, or every GEMV matrix), moved into `tile16-v1` (inferno/kernels/tiled.py: each warp of
the tensor-core GEMV reads 512-byte runs) by a few host threads ahead of the uploads; BF16 / FP32
vectors as they are; the embedding table dequantized to bf16 (the gather kernel reads bf16
rows); the GDN a and b projections concatenated into one [2 Hv, H] bf16 matrix (one GEMM);
a row range of a fused NVFP4 (or BF16) input projection re-packed as a matrix of its own; a
layer's two groupwise-int input projections stacked by rows in the wider format (merge.py) and
tiled as one matrix, or (a mixed stack: `Placement.q4_rows`) each tiled in its own format, Q4 rows first.
"""

from __future__ import annotations

import os
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from ml_dtypes import bfloat16

from inferno.artifact import formats
from inferno.artifact.container import Artifact
from inferno.artifact.identities import ExpectedTensor
from inferno.cuda.memory import DeviceBuffer
from inferno.errors import ArtifactError
from inferno.model.gpu.ops import Ops
from inferno.model.gpu.residency import CONCAT, DEQUANT_BF16, PAYLOAD, ROWS, TILED, Placement, ResidencyPlan


@dataclass(frozen=True)
class DeviceTensor:
    """A weight on the device: its buffer, device format and logical shape."""

    buf: DeviceBuffer
    fmt: str
    shape: tuple[int, ...]
    tiled: bool = False  # groupwise-int in tile16-v1 (residency.TILED), not the row-split payload
    q4_rows: int = 0  # a mixed stack (merge.py): rows [0, q4_rows) are a Q4 tile16-v1 image ahead of the rest


def host_image(p: Placement, artifact: Artifact, expected: dict[str, ExpectedTensor]) -> np.ndarray:
    """The bytes (as a numpy array) that placement `p` puts on the device."""
    if p.stored == PAYLOAD:
        data = np.frombuffer(artifact.tensor_bytes(p.sources[0]), np.uint8)
    elif p.stored == TILED and p.q4_rows:  # a mixed stack: the halves tiled in their own formats, Q4 first
        from inferno.model.gpu.merge import mixed_image

        data = mixed_image([artifact.tensor_bytes(s) for s in p.sources], *p.shape, p.q4_rows)
    elif p.stored == TILED:
        from inferno.kernels.tiled import tile

        payload = artifact.tensor_bytes(p.sources[0])
        if p.merged:  # the input projections stacked by rows in the wider format, then tiled as one
            from inferno.model.gpu.merge import stack_rows

            _, payload, _ = stack_rows([(expected[s].format, artifact.tensor_bytes(s), expected[s].shape)
                                        for s in p.sources])
        data = tile(p.fmt, payload, *p.shape)
    elif p.stored == DEQUANT_BF16:
        e = expected[p.sources[0]]
        if e.format in formats.groupwise.SCHEMES:  # the embedding table: large, decoded on every core
            data = formats.groupwise.decode_bf16(e.format, artifact.tensor_bytes(e.name), e.shape,
                                                 os.cpu_count() or 1)
        else:
            data = formats.decode(e.format, e.layout, artifact.tensor_bytes(e.name), e.shape).astype(bfloat16)
    elif p.stored == ROWS:
        data = _row_slice(expected[p.sources[0]], artifact.tensor_bytes(p.sources[0]), *p.rows)
    elif p.stored == CONCAT:
        data = np.concatenate([np.frombuffer(artifact.tensor_bytes(s), np.uint8) for s in p.sources])
    else:
        raise AssertionError(f"unknown storage {p.stored!r}")
    if data.nbytes != p.nbytes:
        raise ArtifactError(f"{artifact.path}: {p.name} holds {data.nbytes} bytes, its format needs {p.nbytes}; "
                            "the artifact is damaged")
    return data


def _row_slice(e: ExpectedTensor, payload, r0: int, r1: int) -> np.ndarray:
    """Rows [r0, r1) of the [N, K] tensor `e` as a payload of the same format (NVFP4: same divisor)."""
    if e.format == "NVFP4":
        from inferno.artifact.formats import nvfp4

        codes, scales, d = nvfp4.unpack(payload, e.shape)
        return nvfp4.pack(codes[r0:r1], scales[r0:r1], d)
    if e.format == "BF16":
        return np.frombuffer(payload, np.uint8).reshape(e.shape[0], -1)[r0:r1].reshape(-1)
    raise AssertionError(f"no row slicing for {e.format} ({e.name})")


def upload_weights(ops: Ops, artifact: Artifact, expected: dict[str, ExpectedTensor], plan: ResidencyPlan,
                   progress: bool = True) -> dict[str, DeviceTensor]:
    """Reserve and fill every placement of `plan`; returns device name -> DeviceTensor."""
    from inferno.artifact.convert import Progress

    bar = Progress("uploading weights", plan.weight_bytes, enabled=progress)
    out: dict[str, DeviceTensor] = {}
    # Host images (tiling moves every byte) are made by a few threads ahead of the uploads, in order.
    workers = max(1, min(PREPARE_AHEAD, (os.cpu_count() or 2) - 1))
    with ThreadPoolExecutor(workers) as pool:
        pending: deque = deque()
        for p in plan.placements:
            pending.append((p, pool.submit(host_image, p, artifact, expected)))
            if len(pending) > workers:
                _upload_next(ops, pending, out, bar)
        while pending:
            _upload_next(ops, pending, out, bar)
    ops.synchronize()  # the last copies land (and the upload staging is freed)
    bar.close()
    return out


PREPARE_AHEAD = 12  # host images made ahead of the upload, on as many threads (bounds host memory to a few matrices)


def _upload_next(ops: Ops, pending: deque, out: dict[str, DeviceTensor], bar) -> None:
    p, image = pending.popleft()
    buf = ops.alloc(p.name, p.nbytes)
    ops.upload(buf, image.result())
    out[p.name] = DeviceTensor(buf, p.fmt, p.shape, p.stored == TILED, p.q4_rows)
    bar.advance(p.nbytes)
