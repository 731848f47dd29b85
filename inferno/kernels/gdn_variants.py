"""Gated DeltaNet decode kernels: registry variants and their typed launchers.

`GDN_VARIANTS` holds the decode kernels (the registry adds them to its table):
  gdn_conv         causal depthwise conv1d (kernel 4) update + SiLU with the conv-state shift
  gdn_step         gates + q/k l2norm + gated delta-rule step on the fp32 state + gated RMSNorm
  gdn_conv_step*   both in one launch, dv split over a cluster of `splits` CTAs per head
                   (gdn_conv_step: splits 1; _s4, _s2, _s8 the alternatives for benchmarks;
                   _v1: the first fused kernel, GdnConvStepRows, kept for A/B; _sums: x and z the
                   fp32 sums of an accumulating GEMV, zeroed once read)

Device layouts (docs/kernels-gdn.md): conv state [slots, K-1, conv_dim] bf16 tap-major (oldest
first), conv weight [K, conv_dim] bf16 tap-major, recurrent state [slots, Hv, dk, dv] fp32;
`slots` is an int32 device array [B] mapping each sequence of the batch to its state slot.

The launchers check their arguments before any driver call and pack the parameters by the
names in the manifest (each tensor's dynamic shape and stride symbols), so the packing follows
whatever the compiled kernel declared. This module imports neither the DSL nor the kernel cache
at import time (the registry imports it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from inferno.cuda.errors import LaunchError
from inferno.cuda.launch import launch
from inferno.cuda.memory import DeviceBuffer
from inferno.cuda.params import TensorArg
from inferno.kernels.manifest import eval_grid
from inferno.kernels.launchers import _buf, _int
from inferno.kernels.registry import Scalar, Tensor, Variant

if TYPE_CHECKING:
    from inferno.cuda.device import Device
    from inferno.kernels.cache import LoadedKernel

BF16, F32, I32 = 2, 4, 4
CONV_WIDTH = 4
HEAD_DIM = 128  # dk = dv for every Qwen3.5 GDN layer
STEP_WARPS = 8


def _conv_step(name: str, splits: int, threads: int, cls: str = "GdnConvStep", sums: bool = False) -> Variant:
    """The fused conv + step kernel with dv split over `splits` CTAs (one cluster) per head; `sums`: x and z
    fp32 (an accumulating GEMV's sums), zeroed once read."""
    io = "f32" if sums else "bf16"
    return Variant(
        name=name, op="gdn_conv_step", source="cute_kernels.gdn_step", cls=cls,
        config=dict(splits=splits, threads=threads, head_k=HEAD_DIM, head_v=HEAD_DIM, width=CONV_WIDTH,
                    **({"sums": True} if sums else {})),
        args=(Tensor("x", io, ("B", "C"), ("x_stride", 1)),
              Tensor("conv_state", "bf16", ("NS", CONV_WIDTH - 1, "C"), ("st_slot_stride", "st_tap_stride", 1)),
              Tensor("conv_w", "bf16", (CONV_WIDTH, "C"), ("w_stride", 1)),
              Tensor("z", io, ("B", "Z"), ("z_stride", 1)),
              Tensor("a", "bf16", ("B", "Hv"), ("a_stride", 1), align=2),
              Tensor("b", "bf16", ("B", "Hv"), ("b_stride", 1), align=2),
              Tensor("a_log", "f32", ("Hv",), (1,), align=4),
              Tensor("dt_bias", "f32", ("Hv",), (1,), align=4),
              Tensor("norm_w", "bf16", (HEAD_DIM,), (1,)),
              Tensor("state", "f32", ("SH", HEAD_DIM, HEAD_DIM), (HEAD_DIM * HEAD_DIM, HEAD_DIM, 1)),
              Tensor("slots", "i32", ("B",), (1,), align=4),
              Tensor("sync", "i32", ("SB",), (1,), align=4),
              Tensor("out", "bf16", ("B", "Z"), ("out_stride", 1)),
              Scalar("eps", "f32")),
        grid=(str(splits), "Hv", "B"),
        divisibility={"C": 8, "Z": 8, "x_stride": 8, "st_slot_stride": 8, "st_tap_stride": 8, "w_stride": 8,
                      "z_stride": 8, "out_stride": 8},
        pdl=True,
        summary=f"GDN decode conv1d + SiLU + step + gated RMSNorm in one launch, dv over {splits} CTA(s) per head"
                + (", x and z the fp32 sums of the input GEMV (zeroed once read)" if sums else ""),
    )


GDN_VARIANTS: tuple[Variant, ...] = (
    Variant(
        name="gdn_conv", op="gdn_conv", source="cute_kernels.gdn_conv", cls="GdnConv",
        config=dict(threads=128, width=CONV_WIDTH),
        args=(Tensor("x", "bf16", ("B", "C"), ("x_stride", 1)),
              Tensor("conv_state", "bf16", ("NS", CONV_WIDTH - 1, "C"), ("st_slot_stride", "st_tap_stride", 1)),
              Tensor("conv_w", "bf16", (CONV_WIDTH, "C"), ("w_stride", 1)),
              Tensor("slots", "i32", ("B",), (1,), align=4),
              Tensor("out", "bf16", ("B", "C"), ("out_stride", 1))),
        grid=("cdiv(C, 1024)", "B", "1"),
        divisibility={"C": 8, "x_stride": 8, "st_slot_stride": 8, "st_tap_stride": 8, "w_stride": 8,
                      "out_stride": 8},
        summary="GDN decode conv1d (K=4) + SiLU with conv-state shift, 8 channels per thread",
    ),
    Variant(
        name="gdn_step", op="gdn_step", source="cute_kernels.gdn_step", cls="GdnStep",
        config=dict(warps=STEP_WARPS, head_k=HEAD_DIM, head_v=HEAD_DIM),
        args=(Tensor("qkv", "bf16", ("B", "Cq"), ("qkv_stride", 1)),
              Tensor("z", "bf16", ("B", "Z"), ("z_stride", 1)),
              Tensor("a", "bf16", ("B", "Hv"), ("a_stride", 1), align=2),
              Tensor("b", "bf16", ("B", "Hv"), ("b_stride", 1), align=2),
              Tensor("a_log", "f32", ("Hv",), (1,), align=4),
              Tensor("dt_bias", "f32", ("Hv",), (1,), align=4),
              Tensor("norm_w", "bf16", (HEAD_DIM,), (1,)),
              Tensor("state", "f32", ("SH", HEAD_DIM, HEAD_DIM), (HEAD_DIM * HEAD_DIM, HEAD_DIM, 1)),
              Tensor("slots", "i32", ("B",), (1,), align=4),
              Tensor("out", "bf16", ("B", "Z"), ("out_stride", 1)),
              Scalar("eps", "f32")),
        grid=("Hv", "B", "1"),
        divisibility={"Cq": 8, "Z": 8, "qkv_stride": 8, "z_stride": 8, "out_stride": 8},
        summary="GDN decode step: gates + q/k l2norm + delta rule on the fp32 state + gated RMSNorm",
    ),
    _conv_step("gdn_conv_step", 1, 288),  # fastest on the H200 at batch 1 (3.4 us per 27B layer, 2026-11-29)
    _conv_step("gdn_conv_step_sums", 1, 288, sums=True),  # after an accumulating q|k|v|z GEMV (layers.py)
    _conv_step("gdn_conv_step_s4", 4, 160),
    _conv_step("gdn_conv_step_s2", 2, 288),
    _conv_step("gdn_conv_step_s8", 8, 96),
    _conv_step("gdn_conv_step_v1", 4, 128, "GdnConvStepRows"),
)


class _GdnLauncher:
    """A loaded GDN kernel: argument checks, packing by manifest symbol names, grid, launch."""

    op = ""

    def __init__(self, loaded: "LoadedKernel"):
        if loaded.manifest.op != self.op:
            raise LaunchError(f"{type(self).__name__} needs a {self.op!r} kernel, got {loaded.variant.name} "
                              f"({loaded.manifest.op})")
        self.loaded = loaded
        self.name = loaded.variant.name
        self.config = loaded.manifest.config

    @classmethod
    def for_device(cls, device: "Device | None" = None, variant: str | None = None) -> "_GdnLauncher":
        """The launcher for `variant` (default: the op's variant) on `device` (default: GPU 0)."""
        from inferno.kernels.cache import load

        name = variant or next(v.name for v in GDN_VARIANTS if v.op == cls.op)
        return cls(load(name, device))

    def _divisible(self, what: str, value: int, sym: str) -> None:
        d = self.loaded.manifest.divisibility.get(sym, 1)
        if value % d:
            raise LaunchError(f"kernel {self.name}: {what} = {value} must be a multiple of {d}")

    def _stride(self, stride: int | None, default: int, width: int, what: str, sym: str) -> int:
        s = default if stride is None else _int(stride, what, self.name)
        if s < width:
            raise LaunchError(f"kernel {self.name}: {what} {s} is less than the row width {width}")
        self._divisible(what, s, sym)
        return s

    def _launch(self, ptrs: dict[str, int], scalars: dict[str, float], symbols: dict[str, int],
                stream: Any, cluster: tuple[int, int, int] | None = None) -> None:
        m = self.loaded.manifest
        args: list = []
        for p in m.params:
            if p.kind == "tensor":
                args.append(TensorArg(ptrs[p.name], tuple(symbols[s] for s in p.dyn_shape),
                                      tuple(symbols[s] for s in p.dyn_stride)))
            else:
                args.append(scalars[p.name])
        params = self.loaded.layout.pack(args)
        launch(self.loaded.kernel, eval_grid(m.grid, symbols), m.block, params, m.smem, stream, cluster=cluster)


class GdnConv(_GdnLauncher):
    """out = silu(causal_conv(x, conv state)); the conv state of each sequence's slot is shifted."""

    op = "gdn_conv"

    def __call__(self, x: DeviceBuffer, conv_state: DeviceBuffer, conv_w: DeviceBuffer, slots: DeviceBuffer,
                 out: DeviceBuffer, batch: int, channels: int, n_slots: int, *, x_stride: int | None = None,
                 out_stride: int | None = None, stream: Any = None) -> None:
        """x, out: [batch, channels] bf16 rows (strides in elements); conv_state [n_slots, K-1, channels]
        bf16; conv_w [K, channels] bf16; slots [batch] int32 device array, each in [0, n_slots)."""
        batch = _int(batch, "batch", self.name)
        channels = _int(channels, "channels", self.name)
        n_slots = _int(n_slots, "n_slots", self.name)
        self._divisible("channels", channels, "C")
        if batch > 65535:
            raise LaunchError(f"kernel {self.name}: batch = {batch} exceeds 65535; split the call")
        width = self.config["width"]
        xs = self._stride(x_stride, channels, channels, "x_stride", "x_stride")
        os_ = self._stride(out_stride, channels, channels, "out_stride", "out_stride")
        ptrs = {
            "x": _buf(x, "x", self.name, ((batch - 1) * xs + channels) * BF16),
            "conv_state": _buf(conv_state, "conv_state", self.name, n_slots * (width - 1) * channels * BF16),
            "conv_w": _buf(conv_w, "conv_w", self.name, width * channels * BF16),
            "slots": _buf(slots, "slots", self.name, batch * I32, align=4),
            "out": _buf(out, "out", self.name, ((batch - 1) * os_ + channels) * BF16),
        }
        symbols = {"B": batch, "C": channels, "NS": n_slots, "x_stride": xs, "out_stride": os_,
                   "st_slot_stride": (width - 1) * channels, "st_tap_stride": channels, "w_stride": channels}
        self._launch(ptrs, {}, symbols, stream)


class GdnStep(_GdnLauncher):
    """One decode step of the gated delta rule for every (value head, sequence), fused with its
    gates, q/k l2norm and the gated RMSNorm of the output; updates the fp32 state in place."""

    op = "gdn_step"

    def __call__(self, qkv: DeviceBuffer, z: DeviceBuffer, a: DeviceBuffer, b: DeviceBuffer,
                 a_log: DeviceBuffer, dt_bias: DeviceBuffer, norm_w: DeviceBuffer, state: DeviceBuffer,
                 slots: DeviceBuffer, out: DeviceBuffer, batch: int, k_heads: int, v_heads: int,
                 n_slots: int, eps: float = 1e-6, *, qkv_stride: int | None = None,
                 z_stride: int | None = None, a_stride: int | None = None, b_stride: int | None = None,
                 out_stride: int | None = None, stream: Any = None) -> None:
        """qkv [batch, 2*Hk*dk + Hv*dv] bf16 (conv output); z, out [batch, Hv*dv] bf16; a, b [batch, Hv]
        bf16; a_log, dt_bias [Hv] fp32; norm_w [dv] bf16; state [n_slots, Hv, dk, dv] fp32; slots
        [batch] int32 device array, each in [0, n_slots). Strides are row strides in elements."""
        batch = _int(batch, "batch", self.name)
        hk = _int(k_heads, "k_heads", self.name)
        hv = _int(v_heads, "v_heads", self.name)
        n_slots = _int(n_slots, "n_slots", self.name)
        dk, dv = self.config["head_k"], self.config["head_v"]
        if hv % hk:
            raise LaunchError(f"kernel {self.name}: v_heads = {hv} must be a multiple of k_heads = {hk}")
        if batch > 65535:
            raise LaunchError(f"kernel {self.name}: batch = {batch} exceeds 65535; split the call")
        cq, zw = 2 * hk * dk + hv * dv, hv * dv
        qs = self._stride(qkv_stride, cq, cq, "qkv_stride", "qkv_stride")
        zs = self._stride(z_stride, zw, zw, "z_stride", "z_stride")
        os_ = self._stride(out_stride, zw, zw, "out_stride", "out_stride")
        as_ = self._stride(a_stride, hv, hv, "a_stride", "a_stride")
        bs = self._stride(b_stride, hv, hv, "b_stride", "b_stride")
        ptrs = {
            "qkv": _buf(qkv, "qkv", self.name, ((batch - 1) * qs + cq) * BF16),
            "z": _buf(z, "z", self.name, ((batch - 1) * zs + zw) * BF16),
            "a": _buf(a, "a", self.name, ((batch - 1) * as_ + hv) * BF16, align=2),
            "b": _buf(b, "b", self.name, ((batch - 1) * bs + hv) * BF16, align=2),
            "a_log": _buf(a_log, "a_log", self.name, hv * F32, align=4),
            "dt_bias": _buf(dt_bias, "dt_bias", self.name, hv * F32, align=4),
            "norm_w": _buf(norm_w, "norm_w", self.name, dv * BF16),
            "state": _buf(state, "state", self.name, n_slots * hv * dk * dv * F32),
            "slots": _buf(slots, "slots", self.name, batch * I32, align=4),
            "out": _buf(out, "out", self.name, ((batch - 1) * os_ + zw) * BF16),
        }
        symbols = {"B": batch, "Cq": cq, "Z": zw, "Hv": hv, "SH": n_slots * hv, "qkv_stride": qs,
                   "z_stride": zs, "a_stride": as_, "b_stride": bs, "out_stride": os_}
        self._launch(ptrs, {"eps": eps}, symbols, stream)


class GdnConvStep(_GdnLauncher):
    """gdn_conv and gdn_step in one launch: reads the raw conv input, shifts the conv window of each
    sequence's slot, updates the fp32 state in place and writes the gated-RMSNorm output."""

    op = "gdn_conv_step"

    def __call__(self, x: DeviceBuffer, conv_state: DeviceBuffer, conv_w: DeviceBuffer, z: DeviceBuffer,
                 a: DeviceBuffer, b: DeviceBuffer, a_log: DeviceBuffer, dt_bias: DeviceBuffer, norm_w: DeviceBuffer,
                 state: DeviceBuffer, slots: DeviceBuffer, sync: DeviceBuffer, out: DeviceBuffer, batch: int,
                 k_heads: int, v_heads: int, n_slots: int, eps: float = 1e-6, *, x_stride: int | None = None,
                 z_stride: int | None = None, a_stride: int | None = None, b_stride: int | None = None,
                 out_stride: int | None = None, stream: Any = None) -> None:
        """x [batch, 2*Hk*dk + Hv*dv] bf16 (the raw conv input q|k|v); conv_state [n_slots, K-1, C] bf16;
        conv_w [K, C] bf16; z, out [batch, Hv*dv] bf16 (`gdn_conv_step_sums`: x and z fp32, zeroed by the
        call); a, b [batch, Hv] bf16; a_log, dt_bias [Hv] fp32; norm_w [dv] bf16; state [n_slots, Hv, dk, dv]
        fp32; slots [batch] int32 (distinct, in [0, n_slots)); sync: int32 [>= batch * k_heads], zero before the first call (the kernel leaves
        it zero). Strides are row strides in elements."""
        batch = _int(batch, "batch", self.name)
        hk = _int(k_heads, "k_heads", self.name)
        hv = _int(v_heads, "v_heads", self.name)
        n_slots = _int(n_slots, "n_slots", self.name)
        dk, dv, width, splits = (self.config[k] for k in ("head_k", "head_v", "width", "splits"))
        if hv % hk:
            raise LaunchError(f"kernel {self.name}: v_heads = {hv} must be a multiple of k_heads = {hk}")
        if batch > 65535:
            raise LaunchError(f"kernel {self.name}: batch = {batch} exceeds 65535; split the call")
        c, zw = 2 * hk * dk + hv * dv, hv * dv
        io = F32 if self.config.get("sums") else BF16  # x and z: fp32 sums (zeroed by the call) or bf16
        xs = self._stride(x_stride, c, c, "x_stride", "x_stride")
        zs = self._stride(z_stride, zw, zw, "z_stride", "z_stride")
        os_ = self._stride(out_stride, zw, zw, "out_stride", "out_stride")
        as_ = self._stride(a_stride, hv, hv, "a_stride", "a_stride")
        bs = self._stride(b_stride, hv, hv, "b_stride", "b_stride")
        ptrs = {
            "x": _buf(x, "x", self.name, ((batch - 1) * xs + c) * io),
            "conv_state": _buf(conv_state, "conv_state", self.name, n_slots * (width - 1) * c * BF16),
            "conv_w": _buf(conv_w, "conv_w", self.name, width * c * BF16),
            "z": _buf(z, "z", self.name, ((batch - 1) * zs + zw) * io),
            "a": _buf(a, "a", self.name, ((batch - 1) * as_ + hv) * BF16, align=2),
            "b": _buf(b, "b", self.name, ((batch - 1) * bs + hv) * BF16, align=2),
            "a_log": _buf(a_log, "a_log", self.name, hv * F32, align=4),
            "dt_bias": _buf(dt_bias, "dt_bias", self.name, hv * F32, align=4),
            "norm_w": _buf(norm_w, "norm_w", self.name, dv * BF16),
            "state": _buf(state, "state", self.name, n_slots * hv * dk * dv * F32),
            "slots": _buf(slots, "slots", self.name, batch * I32, align=4),
            "sync": _buf(sync, "sync", self.name, batch * hk * I32, align=4),
            "out": _buf(out, "out", self.name, ((batch - 1) * os_ + zw) * BF16),
        }
        symbols = {"B": batch, "C": c, "NS": n_slots, "x_stride": xs, "st_slot_stride": (width - 1) * c,
                   "st_tap_stride": c, "w_stride": c, "Z": zw, "z_stride": zs, "Hv": hv, "a_stride": as_,
                   "b_stride": bs, "SH": n_slots * hv, "SB": batch * hk, "out_stride": os_}
        self._launch(ptrs, {"eps": eps}, symbols, stream, cluster=(splits, 1, 1) if splits > 1 else None)


GDN_LAUNCHERS = {cls.op: cls for cls in (GdnConv, GdnStep, GdnConvStep)}

