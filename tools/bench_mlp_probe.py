"""What removing the kernel boundary inside an MLP could save at most (GPU; timing only).

    python tools/bench_mlp_probe.py --build DIR      (on the dev box: the probe's cubin)
    python tools/bench_mlp_probe.py [--pdl]           (on the GPU)

On the 27B MLP shapes (gate_up Q4 [34816x5120] with the RMSNorm folded in, down Q5 [5120x17408] residual),
CUDA graphs of >= 24 MLPs over >= 512 MB of weight copies, median of 15 (tools/bench_gemv.py's method):
the two stream-K launches the executor makes (`gemv_mma_q4_t1_swiglu_n_sk`, `gemv_mma_q5_t1_res_sk`), each
alone, and `cute_kernels/mlp_probe.MlpProbe`: both GEMVs in one persistent launch with no synchronisation
between them (its down reads whatever act holds). The pair minus the probe is the most any dataflow
between the two GEMVs could save per MLP.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from inferno.kernels.registry import Scalar, Tensor, Variant  # noqa: E402

GATE_UP, DOWN = (34816, 5120), (5120, 17408)


def probe_variant() -> Variant:
    """The probe kernel as a (benchmark-only, unregistered) variant."""
    return Variant(
        name="mlp_probe_q4_q5", op="mlp_probe", source="cute_kernels.mlp_probe", cls="MlpProbe",
        config=dict(bits_a=4, bits_b=5, stages_a=2, stages_b=3, warps=16),
        archs=("sm_90a",),
        args=(Tensor("wa", "i32", ("WLA",), (1,)), Tensor("x", "bf16", ("T", "K"), ("x_stride", 1)),
              Tensor("nw", "bf16", ("K",), (1,)), Scalar("eps", "f32"),
              Tensor("act", "bf16", ("T", "I"), ("act_stride", 1)), Tensor("wb", "i32", ("WLB",), (1,)),
              Tensor("r", "bf16", ("T", "K"), ("r_stride", 1)), Tensor("y", "bf16", ("T", "K"), ("y_stride", 1)),
              Tensor("wsa", "i32", ("WSA",), (1,)), Tensor("wsb", "i32", ("WSB",), (1,))),
        grid=("SMS", "1", "1"), divisibility={"K": 8, "I": 8, "x_stride": 8, "act_stride": 8}, pdl=True,
        summary="timing probe: gate_up (norm) then down in one launch, no synchronisation (wrong results)")


def main() -> None:
    from bench_gemv import Weights, graph_ms, open_bench, probe_args

    a = probe_args(__doc__, lambda: [probe_variant()])
    from inferno.cuda.copy import memset_d8, to_device
    from inferno.cuda.launch import launch
    from inferno.cuda.memory import device_alloc
    from inferno.cuda.params import TensorArg
    from inferno.kernels import gemv_mma_variants as mv
    from inferno.kernels import qlayout as ql
    from inferno.kernels.cache import load
    from inferno.kernels.reference import bf16

    dev, stream, rng, copy = open_bench(a.pdl)
    (n_a, h), (_, inter) = GATE_UP, DOWN
    wa = Weights("Q4G64_F16S", n_a, h, ql.random_payload("Q4G64_F16S", n_a, h, rng), tiled=True)
    wb = Weights("Q5G64_F16S", h, inter, ql.random_payload("Q5G64_F16S", h, inter, rng), tiled=True)
    x = to_device(None, rng.standard_normal((1, h), np.float32).astype(bf16), "x")
    nw = to_device(None, (0.1 * rng.standard_normal(h, np.float32)).astype(bf16), "nw")
    act, y, r = device_alloc(2 * inter, "act"), device_alloc(2 * h, "y"), device_alloc(2 * h, "r")
    memset_d8(r, 0)
    gate_up = mv.GemvMmaSK(load(mv.make_sk_variant("Q4G64_F16S", "swiglu", norm=True), dev))
    down = mv.GemvMmaSK(load(mv.make_sk_variant("Q5G64_F16S", "residual"), dev))
    probe = load(probe_variant(), dev)
    wsa = device_alloc(mv.sk_workspace_bytes(inter, n_a, 1), "wsa")
    wsb = device_alloc(mv.sk_workspace_bytes(h, h, 1), "wsb")
    memset_d8(wsa, 0)
    memset_d8(wsb, 0)
    pairs = max(len(wa.bufs), len(wb.bufs), 24)

    def run_gate_up(i):
        gate_up(wa.bufs[i % len(wa.bufs)], x, act, n_a, h, 1, norm=(nw, 1e-6), stream=stream)

    def run_down(i):
        down(wb.bufs[i % len(wb.bufs)], act, y, h, inter, 1, r=r, stream=stream)

    def run_probe(i):
        args = [TensorArg(wa.bufs[i % len(wa.bufs)].ptr, (wa.nbytes // 4,)), TensorArg(x.ptr, (1, h), (h,)),
                TensorArg(nw.ptr, (h,)), 1e-6, TensorArg(act.ptr, (1, inter), (inter,)),
                TensorArg(wb.bufs[i % len(wb.bufs)].ptr, (wb.nbytes // 4,)), TensorArg(r.ptr, (1, h), (h,)),
                TensorArg(y.ptr, (1, h), (h,)), TensorArg(wsa.ptr, (wsa.nbytes // 4,)),
                TensorArg(wsb.ptr, (wsb.nbytes // 4,))]
        launch(probe.kernel, (dev.sm_count, 1, 1), probe.manifest.block, probe.layout.pack(args),
               probe.manifest.smem, stream)

    def per_mlp(*steps) -> float:
        return 1000 * graph_ms(lambda i: [s(i) for s in steps], pairs, stream) / pairs

    floor = (wa.nbytes + wb.nbytes) / copy / 1e3
    rows = [("gate_up alone", per_mlp(run_gate_up)), ("down alone", per_mlp(run_down)),
            ("gate_up + down (two launches)", per_mlp(run_gate_up, run_down)),
            ("probe: one launch, no sync", per_mlp(run_probe))]
    print(f"\ncopy {copy:.0f} GB/s; {dev.name}; PDL {'on' if a.pdl else 'off'}; weights {(wa.nbytes + wb.nbytes) / 1e6:.1f} MB,"
          f" floor {floor:.1f} us per MLP")
    print("| launches per MLP | us per MLP | % of copy |")
    print("|---|---|---|")
    for name, us in rows:
        print(f"| {name} | {us:.1f} | {100 * floor / us if 'alone' not in name else float('nan'):.0f} |")
    print(f"\nupper bound of the boundary's cost: {rows[2][1] - rows[3][1]:.1f} us per MLP")


if __name__ == "__main__":
    main()
