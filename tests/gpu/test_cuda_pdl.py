"""Programmatic dependent launch on the live GPU: a chain of dependent kernels, each launched early,
must still see its predecessor's output — eagerly and replayed from a CUDA graph."""

import numpy as np
import pytest

from inferno.cuda import Stream
from inferno.cuda.copy import from_device, memset_d8, to_device
from inferno.cuda.memory import device_alloc
from inferno.kernels import reference as ref
from inferno.kernels.launchers import RMSNorm
from inferno.kernels.reference import bf16
from stream_run import run_queued

N, LINKS = 5120, 48


@pytest.mark.parametrize("graph", [False, True])
def test_pdl_chain_sees_predecessor(device, graph):
    rng = np.random.default_rng()
    k = RMSNorm.for_width(N, device)
    assert k.loaded.kernel.pdl
    x = rng.standard_normal((1, N), np.float32).astype(bf16)
    w = (0.5 * rng.standard_normal(N, np.float32)).astype(bf16)
    bufs = [to_device(None, x, "x0")] + [device_alloc(N * 2, f"x{i + 1}") for i in range(LINKS)]
    dw = to_device(None, w, "w")
    stream = Stream.create()
    stream.pdl = True
    try:
        for b in bufs[1:]:
            memset_d8(b, 0xFF)  # NaN bf16: a link that ran before its input was written shows
        def chain():
            for i in range(LINKS):
                k(bufs[i], dw, bufs[i + 1], 1, N, 1e-6, stream=stream)
        run_queued(stream, chain, graph)
        want = x
        for _ in range(LINKS):
            want = ref.rmsnorm(want, w, 1e-6).astype(bf16)
        got = from_device(bufs[-1], bf16, (1, N))
        assert np.isfinite(got.astype(np.float32)).all()
        assert ref.rel_error(got, want) < 2e-2
    finally:
        for b in bufs + [dw]:
            b.free()
        stream.close()
