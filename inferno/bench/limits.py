"""The hardware limits a benchmark is judged against, measured on the live GPU in the same run.

- copy: device-to-device copy rate, bytes read + written (`inferno.kernels.ceilings.copy_bandwidth`),
  the limit of memory-bound work (decode).
- gemm: a bf16 GEMM rate at 8192^3 with our own wgmma kernel (`gemm_wgmma`, sm_90a). It is the
  fastest matrix rate this product can produce, so a lower bound of the hardware's MMA peak;
  `impl` says so in the JSON. No GEMM kernel for the GPU's arch -> null, with the reason.
On the CPU (reference executor) both are None: there is no measured limit to compare with.
"""

from __future__ import annotations

from dataclasses import dataclass

GEMM_N = 8192
GEMM_VARIANT = "gemm_wgmma"
COPY_BYTES = 4 << 30


@dataclass(frozen=True)
class Limits:
    """Measured ceilings; a None field was not measured (`notes` says why)."""

    copy_gbps: float | None = None  # GB/s, read + written
    gemm_tflops: float | None = None
    gemm_impl: str | None = None
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {"copy_gbps": self.copy_gbps, "gemm_tflops": self.gemm_tflops, "gemm_impl": self.gemm_impl,
                "notes": list(self.notes)}


def cpu_limits() -> Limits:
    return Limits(notes=("CPU run: no measured copy or MMA limit, so every ratio to a limit is null",))


def measure_gpu_limits(device, log=lambda msg: None) -> Limits:
    """Copy bandwidth and bf16 GEMM rate on `device` (an open `inferno.cuda.Device`)."""
    from inferno.cuda.stream import Stream
    from inferno.kernels.ceilings import copy_bandwidth

    device.activate()
    stream = Stream.create()
    notes = []
    try:
        nbytes = min(COPY_BYTES, device.free_mem() // 4)
        log(f"measuring device copy bandwidth ({nbytes / 2**30:.1f} GiB D2D) ...")
        copy = copy_bandwidth(stream, nbytes)["gbps"]
        gemm_tflops = gemm_impl = None
        try:
            log(f"measuring the bf16 GEMM rate ({GEMM_VARIANT} {GEMM_N}^3) ...")
            gemm_tflops = gemm_rate(device, stream, GEMM_N)
            gemm_impl = f"{GEMM_VARIANT} {GEMM_N}x{GEMM_N}x{GEMM_N} bf16 (Inferno's own GEMM: a lower bound of the MMA peak)"
        except Exception as e:  # no kernel for this arch, or not built: report, do not guess
            notes.append(f"bf16 GEMM rate not measured: {e}")
    finally:
        stream.close()
    return Limits(copy, gemm_tflops, gemm_impl, tuple(notes))


def gemm_rate(device, stream, n: int) -> float:
    """TFLOP/s of C[n,n] = A[n,n] @ B[n,n]^T with the `gemm_wgmma` kernel on random bf16 inputs.

    Random data, not constants: constant or zero operands switch fewer bits and run faster than
    real weights and activations do.
    """
    import ml_dtypes
    import numpy as np

    from inferno.cuda.copy import h2d
    from inferno.cuda.memory import device_alloc
    from inferno.kernels.ceilings import time_ms
    from inferno.kernels.launchers import launcher

    gemm = launcher(GEMM_VARIANT, device)
    bufs = [device_alloc(n * n * 2, name) for name in ("gemm_a", "gemm_b", "gemm_c")]
    try:
        rng = np.random.default_rng()
        for b in bufs[:2]:
            h2d(b, rng.standard_normal((n, n), dtype=np.float32).astype(ml_dtypes.bfloat16))
        a, b, c = bufs
        ms = time_ms(lambda: gemm(a, b, c, n, n, n, stream=stream), stream, reps=10, inner=3)
    finally:
        for b in bufs:
            b.free()
    return 2 * n**3 / ms / 1e9
