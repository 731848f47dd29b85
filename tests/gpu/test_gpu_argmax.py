"""The greedy argmax kernel vs np.argmax on the live GPU: fresh random logits, ties, poisoned output."""

import numpy as np
import pytest
from ml_dtypes import bfloat16

from inferno.cuda import Device, from_device, to_device
from inferno.kernels.sample_variants import Argmax


@pytest.fixture(scope="module")
def argmax():
    Device.open()
    return Argmax.for_device()


@pytest.mark.parametrize("n", [8, 2048, 248320, 151936])
@pytest.mark.parametrize("case", ["random", "ties", "negative", "last"])
def test_argmax(argmax, n, case):
    rng = np.random.default_rng()
    x = rng.normal(0, 3, n).astype(bfloat16)
    if case == "ties":  # the maximum appears several times: the first index wins
        idx = np.sort(rng.choice(n, size=min(n, 5), replace=False))
        x[idx] = bfloat16(40.0)
    elif case == "negative":
        x = (-np.abs(x.astype(np.float32)) - 1).astype(bfloat16)
    elif case == "last":
        x[-1] = bfloat16(50.0)
    want = int(np.argmax(x.astype(np.float32)))
    xd = to_device(None, x.view(np.uint16), "logits")
    out = to_device(None, np.array([-7], np.int32), "out")  # poison
    try:
        argmax(xd, out, n)
        got = int(from_device(out, np.int32, (1,))[0])
    finally:
        xd.free()
        out.free()
    assert got == want, f"n={n} {case}: kernel {got} (value {float(x[got]) if 0 <= got < n else None}), " \
                        f"numpy {want} (value {float(x[want])})"
