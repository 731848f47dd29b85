"""Gated DeltaNet prefill kernels: registry variants and their typed launchers.

`GDN_PREFILL_VARIANTS` (the lead adds them to the registry):
  gdn_conv_prefill  causal depthwise conv1d (kernel 4) + SiLU over T tokens, continuing from and
                    updating the sequence's conv state
  gdn_chunk         chunked gated delta rule (chunks of 64, tensor cores) over T tokens, fused with
                    the gates, q/k l2norm and the gated RMSNorm; continues from and updates the
                    sequence's fp32 state; DEFAULT_VSPLIT CTAs (one cluster) per value head

`GDN_CHUNK_VSPLIT_VARIANTS`: the same op with the other value splits (`gdn_chunk_vs<n>`, n in
VSPLITS), for tests and tools/bench_gdn_prefill.py; `chunk_variant(n)` picks one by its split.

One sequence per call (`slot` picks its state). Layouts are the decode kernels' (docs/kernels-gdn.md):
conv state [slots, K-1, conv_dim] bf16 tap-major, conv weight [K, conv_dim] bf16 tap-major,
recurrent state [slots, Hv, dk, dv] fp32. Design, FLOPs and bytes: docs/kernels-gdn-prefill.md.
The launchers check every argument before the driver is called and pack the parameters by the
symbol names in the manifest. No DSL import here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from inferno.cuda.errors import LaunchError
from inferno.cuda.memory import DeviceBuffer
from inferno.cuda.params import TensorArg
from inferno.kernels import launchers
from inferno.kernels.launchers import Launcher, _buf, _int
from inferno.kernels.registry import Scalar, Tensor, Variant

if TYPE_CHECKING:
    from inferno.cuda.device import Device

BF16, F32 = 2, 4
CONV_WIDTH = 4
CONV_THREADS = 128
CONV_TOKENS = 16  # tokens per conv thread (one window slide in registers)
HEAD_DIM = 128  # dk = dv for every Qwen3.5 GDN layer
CHUNK = 64
MAX_TOKENS = 65535 * CONV_TOKENS  # conv grid.y limit
VSPLITS = (1, 2, 4)  # CTAs per value head of gdn_chunk (each owns dv / vsplit columns of the state)
DEFAULT_VSPLIT = 2  # the executor's gdn_chunk


def _chunk_variant(name: str, vsplit: int) -> Variant:
    return Variant(
        name=name, op="gdn_chunk", source="cute_kernels.gdn_prefill", cls="GdnChunk",
        config=dict(head_k=HEAD_DIM, head_v=HEAD_DIM, chunk=CHUNK, warps=8, vsplit=vsplit),
        args=(Tensor("qkv", "bf16", ("T", "Cq"), ("qkv_stride", 1)),
              Tensor("z", "bf16", ("T", "Z"), ("z_stride", 1)),
              Tensor("a", "bf16", ("T", "Hv"), ("a_stride", 1), align=2),
              Tensor("b", "bf16", ("T", "Hv"), ("b_stride", 1), align=2),
              Tensor("a_log", "f32", ("Hv",), (1,), align=4),
              Tensor("dt_bias", "f32", ("Hv",), (1,), align=4),
              Tensor("norm_w", "bf16", (HEAD_DIM,), (1,)),
              Tensor("state", "f32", ("SH", HEAD_DIM, HEAD_DIM), (HEAD_DIM * HEAD_DIM, HEAD_DIM, 1)),
              Tensor("out", "bf16", ("T", "Z"), ("out_stride", 1)),
              Scalar("slot", "i32"),
              Scalar("eps", "f32")),
        grid=("Hv" if vsplit == 1 else f"Hv * {vsplit}", "1", "1"),
        divisibility={"Cq": 8, "Z": 8, "qkv_stride": 8, "z_stride": 8, "out_stride": 8},
        summary="GDN chunked prefill (C=64, mma.sync): gates + q/k l2norm + delta rule on the fp32 state "
                + ("+ gated RMSNorm, one CTA per value head" if vsplit == 1 else
                   f"+ gated RMSNorm, {vsplit} CTAs (a cluster) per value head, {HEAD_DIM // vsplit} "
                   f"state columns each"),
    )


GDN_PREFILL_VARIANTS: tuple[Variant, ...] = (
    Variant(
        name="gdn_conv_prefill", op="gdn_conv_prefill", source="cute_kernels.gdn_conv_prefill",
        cls="GdnConvPrefill", config=dict(threads=CONV_THREADS, width=CONV_WIDTH, tokens=CONV_TOKENS),
        args=(Tensor("x", "bf16", ("T", "C"), ("x_stride", 1)),
              Tensor("conv_state", "bf16", ("NS", CONV_WIDTH - 1, "C"), ("st_slot_stride", "st_tap_stride", 1)),
              Tensor("conv_w", "bf16", (CONV_WIDTH, "C"), ("w_stride", 1)),
              Tensor("out", "bf16", ("T", "C"), ("out_stride", 1)),
              Scalar("slot", "i32")),
        grid=(f"cdiv(C, {8 * CONV_THREADS})", f"cdiv(T, {CONV_TOKENS})", "1"),
        divisibility={"C": 8, "x_stride": 8, "st_slot_stride": 8, "st_tap_stride": 8, "w_stride": 8,
                      "out_stride": 8},
        summary=f"GDN prefill conv1d (K=4) + SiLU over T tokens with the conv state, "
                f"8 channels x {CONV_TOKENS} tokens per thread",
    ),
    _chunk_variant("gdn_chunk", DEFAULT_VSPLIT),
)
GDN_CHUNK_VSPLIT_VARIANTS: tuple[Variant, ...] = tuple(
    _chunk_variant(f"gdn_chunk_vs{n}", n) for n in VSPLITS if n != DEFAULT_VSPLIT)
_BY_OP = {v.op: v for v in GDN_PREFILL_VARIANTS}
_BY_NAME = {v.name: v for v in (*GDN_PREFILL_VARIANTS, *GDN_CHUNK_VSPLIT_VARIANTS)}


def chunk_variant(vsplit: int) -> Variant:
    """The gdn_chunk variant with `vsplit` CTAs per value head."""
    if vsplit not in VSPLITS:
        raise LaunchError(f"gdn_chunk: vsplit = {vsplit!r} is not one of {VSPLITS}")
    return _BY_OP["gdn_chunk"] if vsplit == DEFAULT_VSPLIT else _BY_NAME[f"gdn_chunk_vs{vsplit}"]


class _PrefillLauncher(Launcher):
    @classmethod
    def for_device(cls, device: "Device | None" = None, variant: str | None = None) -> "_PrefillLauncher":
        """The launcher for this op's default variant (or `variant`, by name) on `device` (default GPU 0),
        loaded from the kernel cache; works before the registry lists the GDN prefill variants."""
        from inferno.cuda.device import Device
        from inferno.kernels.cache import load

        v = _BY_OP[cls.op] if variant is None else _BY_NAME.get(variant)
        if v is None or v.op != cls.op:
            names = sorted(n for n, x in _BY_NAME.items() if x.op == cls.op)
            raise LaunchError(f"{cls.__name__}: no variant {variant!r}; the {cls.op} variants are {names}")
        return cls(load(v, device or Device.open()))

    def _stride(self, stride: int | None, width: int, what: str) -> int:
        s = width if stride is None else _int(stride, what, self.name)
        if s < width:
            raise LaunchError(f"kernel {self.name}: {what} {s} is less than the row width {width}")
        self._divisible(what, s, what)
        return s

    def _tokens(self, tokens: int) -> int:
        t = _int(tokens, "tokens", self.name)
        if t > MAX_TOKENS:
            raise LaunchError(f"kernel {self.name}: tokens = {t} exceeds {MAX_TOKENS}; split the prompt")
        return t

    def _slot(self, slot: int, n_slots: int) -> tuple[int, int]:
        n = _int(n_slots, "n_slots", self.name)
        s = _int(slot, "slot", self.name, lo=0)
        if s >= n:
            raise LaunchError(f"kernel {self.name}: slot = {s} is outside the {n} state slots")
        return s, n

    def _pack(self, ptrs: dict[str, int], scalars: dict[str, float | int], symbols: dict[str, int],
              stream: Any) -> None:
        args: list = []
        for p in self.loaded.manifest.params:
            if p.kind == "tensor":
                args.append(TensorArg(ptrs[p.name], tuple(symbols[s] for s in p.dyn_shape),
                                      tuple(symbols[s] for s in p.dyn_stride)))
            else:
                args.append(scalars[p.name])
        self._launch(args, symbols, stream)


class GdnConvPrefill(_PrefillLauncher):
    """out = silu(causal_conv(x)) over `tokens` tokens of one sequence, continuing from the conv state of
    `slot`, which then holds the last K-1 raw inputs."""

    op = "gdn_conv_prefill"

    def __call__(self, x: DeviceBuffer, conv_state: DeviceBuffer, conv_w: DeviceBuffer, out: DeviceBuffer,
                 tokens: int, channels: int, n_slots: int, slot: int, *, x_stride: int | None = None,
                 out_stride: int | None = None, stream: Any = None) -> None:
        """x, out: [tokens, channels] bf16 rows (strides in elements; must not overlap); conv_state
        [n_slots, K-1, channels] bf16; conv_w [K, channels] bf16."""
        t = self._tokens(tokens)
        ch = _int(channels, "channels", self.name)
        self._divisible("channels", ch, "C")
        s, ns = self._slot(slot, n_slots)
        width = self.config["width"]
        xs = self._stride(x_stride, ch, "x_stride")
        os_ = self._stride(out_stride, ch, "out_stride")
        ptrs = {
            "x": _buf(x, "x", self.name, ((t - 1) * xs + ch) * BF16),
            "conv_state": _buf(conv_state, "conv_state", self.name, ns * (width - 1) * ch * BF16),
            "conv_w": _buf(conv_w, "conv_w", self.name, width * ch * BF16),
            "out": _buf(out, "out", self.name, ((t - 1) * os_ + ch) * BF16),
        }
        x_end, o_end = ptrs["x"] + ((t - 1) * xs + ch) * BF16, ptrs["out"] + ((t - 1) * os_ + ch) * BF16
        if ptrs["x"] < o_end and ptrs["out"] < x_end:
            raise LaunchError(f"kernel {self.name}: x and out overlap; give the conv output its own buffer")
        symbols = {"T": t, "C": ch, "NS": ns, "x_stride": xs, "out_stride": os_,
                   "st_slot_stride": (width - 1) * ch, "st_tap_stride": ch, "w_stride": ch}
        self._pack(ptrs, {"slot": s}, symbols, stream)


class GdnChunk(_PrefillLauncher):
    """The gated delta rule over `tokens` tokens of one sequence for every value head (chunks of 64),
    fused with its gates, q/k l2norm and the gated RMSNorm; updates the fp32 state of `slot`.
    Variants with vsplit > 1 launch clusters of vsplit CTAs (one cluster per value head)."""

    op = "gdn_chunk"

    def _launch(self, args: list, symbols: dict[str, int], stream: Any) -> None:
        m = self.loaded.manifest
        if self._params is None:
            self._params = self.loaded.layout.pack(args)
        else:
            self._params.update(args)
        grid = self._grid({"SMS": self.loaded.sm_count, **symbols})
        cluster = (self.config.get("vsplit", 1), 1, 1)
        launchers.launch(self.loaded.kernel, grid, m.block, self._params, m.smem, stream, cluster=cluster)

    def __call__(self, qkv: DeviceBuffer, z: DeviceBuffer, a: DeviceBuffer, b: DeviceBuffer,
                 a_log: DeviceBuffer, dt_bias: DeviceBuffer, norm_w: DeviceBuffer, state: DeviceBuffer,
                 out: DeviceBuffer, tokens: int, k_heads: int, v_heads: int, n_slots: int, slot: int,
                 eps: float = 1e-6, *, qkv_stride: int | None = None, z_stride: int | None = None,
                 a_stride: int | None = None, b_stride: int | None = None, out_stride: int | None = None,
                 stream: Any = None) -> None:
        """qkv [tokens, 2*Hk*dk + Hv*dv] bf16 (the conv output); z, out [tokens, Hv*dv] bf16; a, b
        [tokens, Hv] bf16; a_log, dt_bias [Hv] fp32; norm_w [dv] bf16; state [n_slots, Hv, dk, dv] fp32.
        Strides are row strides in elements."""
        t = self._tokens(tokens)
        hk = _int(k_heads, "k_heads", self.name)
        hv = _int(v_heads, "v_heads", self.name)
        s, ns = self._slot(slot, n_slots)
        dk, dv = self.config["head_k"], self.config["head_v"]
        if hv % hk:
            raise LaunchError(f"kernel {self.name}: v_heads = {hv} must be a multiple of k_heads = {hk}")
        if hv > 65535:
            raise LaunchError(f"kernel {self.name}: v_heads = {hv} exceeds 65535")
        cq, zw = 2 * hk * dk + hv * dv, hv * dv
        qs = self._stride(qkv_stride, cq, "qkv_stride")
        zs = self._stride(z_stride, zw, "z_stride")
        os_ = self._stride(out_stride, zw, "out_stride")
        as_ = self._stride(a_stride, hv, "a_stride")
        bs = self._stride(b_stride, hv, "b_stride")
        ptrs = {
            "qkv": _buf(qkv, "qkv", self.name, ((t - 1) * qs + cq) * BF16),
            "z": _buf(z, "z", self.name, ((t - 1) * zs + zw) * BF16),
            "a": _buf(a, "a", self.name, ((t - 1) * as_ + hv) * BF16, align=2),
            "b": _buf(b, "b", self.name, ((t - 1) * bs + hv) * BF16, align=2),
            "a_log": _buf(a_log, "a_log", self.name, hv * F32, align=4),
            "dt_bias": _buf(dt_bias, "dt_bias", self.name, hv * F32, align=4),
            "norm_w": _buf(norm_w, "norm_w", self.name, dv * BF16),
            "state": _buf(state, "state", self.name, ns * hv * dk * dv * F32),
            "out": _buf(out, "out", self.name, ((t - 1) * os_ + zw) * BF16),
        }
        symbols = {"T": t, "Cq": cq, "Z": zw, "Hv": hv, "SH": ns * hv, "qkv_stride": qs, "z_stride": zs,
                   "a_stride": as_, "b_stride": bs, "out_stride": os_}
        self._pack(ptrs, {"slot": s, "eps": eps}, symbols, stream)


GDN_PREFILL_LAUNCHERS = {cls.op: cls for cls in (GdnConvPrefill, GdnChunk)}
