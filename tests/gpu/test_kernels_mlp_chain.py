"""GPU: the chained MLP (`cute_kernels/mlp_probe.py` in mode "chain", tools/bench_mlp_probe.py's
`probe_variant("chain")`: gate_up and down in one launch, act handed over in 128-value slices by counters)
vs the numpy model: fresh random
weights and inputs each launch, act and y poisoned before it, the ready counters back at zero after it.
Build the cubin with `python tools/bench_mlp_probe.py --build $INFERNO_KERNEL_DIR`."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from inferno.cuda.copy import from_device, memset_d8, to_device
from inferno.cuda.launch import launch
from inferno.cuda.memory import device_alloc
from inferno.kernels import gemv_mma_variants as mv
from inferno.kernels import qlayout as ql
from inferno.kernels.cache import load, stale_reason
from inferno.kernels.reference import BF16_TOL, bf16, rel_error
from inferno.kernels.tiled import tile
from gemv_check import rms_normed


def _tool():
    spec = importlib.util.spec_from_file_location("bench_mlp_probe",
                                                  Path(__file__).parents[2] / "tools" / "bench_mlp_probe.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


@pytest.mark.parametrize("h, inter", [(1024, 2048), (1024, 2000), (512, 1000), (5120, 17408)],
                         ids=["even", "ragged-pair", "ragged-unit", "27B"])
def test_chain_matches_the_model(device, rng, h, inter):
    tool = _tool()
    v = tool.probe_variant("chain")
    if stale_reason(v, device.arch) is not None and importlib.util.find_spec("cutlass") is None:
        pytest.skip("the chain's cubin is not built: python tools/bench_mlp_probe.py --build $INFERNO_KERNEL_DIR")
    chain = load(v, device)
    n_a, eps = 2 * inter, 1e-6
    ready = device_alloc(4 * (-(-inter // 128) + 1), "ready")
    wsa = device_alloc(mv.sk_workspace_bytes(inter, n_a, 1), "wsa")
    wsb = device_alloc(mv.sk_workspace_bytes(h, h, 1), "wsb")
    act, y = device_alloc(2 * inter, "act"), device_alloc(2 * h, "y")
    for b in (ready, wsa, wsb):
        memset_d8(b, 0)
    bufs = [ready, wsa, wsb, act, y]
    try:
        for launch_no in range(2):
            pa, pb = ql.random_payload("Q4G64_F16S", n_a, h, rng), ql.random_payload("Q5G64_F16S", h, inter, rng)
            x = (rng.standard_normal((1, h), np.float32) * 3 + 0.5).astype(bf16)
            nw = (0.2 * rng.standard_normal(h, np.float32)).astype(bf16)
            r = rng.standard_normal((1, h), np.float32).astype(bf16)
            dev_in = [to_device(None, tile("Q4G64_F16S", pa, n_a, h), "wa"), to_device(None, x, "x"),
                      to_device(None, nw, "nw"), to_device(None, tile("Q5G64_F16S", pb, h, inter), "wb"),
                      to_device(None, r, "r")]
            bufs += dev_in
            wa, dx, dnw, wb, dr = dev_in
            memset_d8(act, 0xFF)
            memset_d8(y, 0xFF)
            args = tool.probe_args(wa, dx, dnw, eps, act, wb, dr, y, wsa, wsb, ready, h, inter)
            launch(chain.kernel, (device.sm_count, 1, 1), chain.manifest.block, chain.layout.pack(args),
                   chain.manifest.smem, None)
            device.synchronize()
            got_act = from_device(act, bf16, (1, inter)).astype(np.float32)
            got_y = from_device(y, bf16, (1, h)).astype(np.float32)
            left = from_device(ready, np.int32, (ready.nbytes // 4,))
            want_act = ql.reference("Q4G64_F16S", pa, n_a, h, rms_normed(x, nw, eps).astype(np.float32), "swiglu")
            want_y = ql.reference("Q5G64_F16S", pb, h, inter, want_act.astype(np.float32).astype(bf16).astype(np.float32),
                                  "residual", r.astype(np.float32))
            what = f"chain [{h}, {inter}] launch {launch_no}"
            assert not np.isnan(got_act).any() and not np.isnan(got_y).any(), f"{what}: outputs unwritten"
            assert not left.any(), f"{what}: ready counters left at {left[left != 0][:8].tolist()}"
            for name, got, want in (("act", got_act, want_act), ("y", got_y, want_y)):
                err = rel_error(got, want.astype(np.float32))
                assert err <= BF16_TOL, f"{what}: {name} rel err {err:.2e}"
    finally:
        for b in bufs:
            b.free()
