"""Kernel variants of gated full-attention decode and their typed launchers.

Three kernels per attention layer and decode step (docs/kernels-attention.md):
  attn_qk_prep        q/k norm + RoPE, k and v written into the paged KV cache (kv_layout.py)
  attn_decode_g<G>    split-K attention partials; one CTA per (split, kv head, sequence), the G
                      query heads of a kv head share its K/V reads (G = 6 for 27B, 8 for 35B-A3B),
                      K/V double-buffered through shared memory with cp.async, QK^T and PV on
                      tensor cores (mma.sync); `_pipelined` / `_regs`: the previous CUDA-core kernels
  attn_combine        merges the splits in one pass, applies the sigmoid gate, writes bf16 [B, Hq*256]
or two: attn_decode_g<G>_fused (prep folded into the decode: one launch from the projections to the
partials) and attn_combine (or attn_combine_early, which reads lens and the gate before its PDL wait).

Shapes (d = 256): q_proj and gate bf16 [B, Hq, d] with their own row and head strides (decode: the
q and gate projections where the GEMVs wrote them, head stride d), k and v bf16 [B, Hkv*d], q_norm
and k_norm bf16 [d], positions and lens int32 [B] (lens = cached tokens including this one),
page_table int32 [B, P], kv pool bf16 [rows, d], q scratch fp32 [B, Hq, d], partials fp32
o [B, Hq, S, d] and lse [B, Hq, S], out bf16 [B, Hq*d]. The lead adds ATTN_VARIANTS to the
registry; until then `AttnDecode.load(...)` loads them straight from the kernel cache.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from inferno.cuda.errors import LaunchError
from inferno.cuda.memory import DeviceBuffer
from inferno.cuda.params import TensorArg
from inferno.kernels.kv_layout import HEAD_DIM, PAGE_TOKENS
from inferno.kernels.launchers import Launcher, _buf, _int
from inferno.kernels.registry import ARCHS, Scalar, Tensor, Variant

if TYPE_CHECKING:
    from inferno.cuda.device import Device

GROUPS = (2, 6, 8)  # query heads per kv head: tiny test models 4/2, 27B 24/4, 35B-A3B 16/2
MAX_BATCH = 65535

_D = HEAD_DIM
_QP = Tensor("q_proj", "bf16", ("B", "Hq", _D), ("qp_sb", "qp_sh", 1))
_GATE = Tensor("gate", "bf16", ("B", "Hq", _D), ("gate_sb", "gate_sh", 1))
_Q = Tensor("q", "f32", ("B", "Hq", _D), ("q_sb", _D, 1))
# deferred projections (`_sums` variants): q_proj, k, v and gate as an accumulating GEMV's fp32 sums
_QP_SUMS = Tensor("q_proj", "f32", ("B", "Hq", _D), ("qp_sb", "qp_sh", 1))
_GATE_SUMS = Tensor("gate", "f32", ("B", "Hq", _D), ("gate_sb", "gate_sh", 1))
_ZEROED = (Tensor("q_sums", "f32", ("B", "QD"), ("qs_stride", 1)),
           Tensor("k_sums", "f32", ("B", "KD"), ("ks_stride", 1)),
           Tensor("v_sums", "f32", ("B", "KD"), ("vs_stride", 1)))
_LENS = Tensor("lens", "i32", ("B",), (1,), align=4)
_PT = Tensor("page_table", "i32", ("B", "P"), ("pt_stride", 1), align=4)
_KV = Tensor("kv", "bf16", ("KR", _D), ("kv_stride", 1))
_PO = Tensor("part_o", "f32", ("B", "Hq", "S", _D), ("po_sb", "po_sh", _D, 1))
_PL = Tensor("part_lse", "f32", ("B", "Hq", "S"), ("pl_sb", "pl_sh", 1), align=4)

# the prep inputs: k, v (the projections), q_norm, k_norm, positions
_PREP_IN = (Tensor("k", "bf16", ("B", "KD"), ("k_stride", 1)), Tensor("v", "bf16", ("B", "KD"), ("v_stride", 1)),
            Tensor("q_norm", "bf16", (_D,), (1,)), Tensor("k_norm", "bf16", (_D,), (1,)),
            Tensor("positions", "i32", ("B",), (1,), align=4))
_KV_SUMS = (Tensor("k", "f32", ("B", "KD"), ("k_stride", 1)), Tensor("v", "f32", ("B", "KD"), ("v_stride", 1)))

PREP = Variant(
    name="attn_qk_prep", op="attn_qk_prep", source="cute_kernels.attn_prep", cls="AttnQkPrep",
    config=dict(warps=4, rotary=64),
    args=(_QP, *_PREP_IN, _LENS, _PT, _KV, _Q, Scalar("eps", "f32"), Scalar("rope_theta", "f32")),
    grid=("cdiv(Hq + KD // 256, 4)", "B", "1"),
    divisibility={"KD": 256, "qp_sb": 8, "qp_sh": 8, "k_stride": 8, "v_stride": 8, "kv_stride": 8, "q_sb": 4},
    pdl=True, summary="q/k zero-centred RMSNorm + NeoX RoPE (64 dims) per head; k, v appended to the paged KV cache",
)


def _decode(group: int, block: int, ctas_per_sm: int, cls: str = "AttnDecodePipelined", suffix: str = "",
            stages: int = 2) -> Variant:
    how = {"AttnDecodeMma": f"QK and PV on tensor cores (mma.sync; q and P as bf16 hi + lo), {stages} K/V "
                            f"stages through smem (cp.async)",
           "AttnDecodePipelined": "K/V double-buffered through smem (cp.async), fp32 CUDA-core dots",
           "AttnDecode": "K/V through registers"}[cls]
    config = dict(group=group, block=block, ctas_per_sm=ctas_per_sm)
    if cls == "AttnDecodeMma":
        config["stages"] = stages
    return Variant(
        name=f"attn_decode_g{group}{suffix}", op="attn_decode", source="cute_kernels.attn_decode", cls=cls,
        config=config,
        args=(_Q, _LENS, _PT, _KV, _PO, _PL, Scalar("scale", "f32")),
        grid=("S", f"Hq // {group}", "B"),
        divisibility={"Hq": group, "kv_stride": 8, "q_sb": 4, "po_sb": 4, "po_sh": 4},
        pdl=True,
        # three 32 KiB K/V stages (~110 KiB) exceed sm_120a's 99 KiB per block
        archs=("sm_90a",) if stages > 2 else ARCHS,
        summary=f"split-K paged decode attention partials, {group} query heads per kv head, d = 256, "
                f"{block}-token blocks, {ctas_per_sm} CTA(s) per SM, {how}",
    )


def _combine(groups: int, unroll: int, suffix: str = "", cls: str = "AttnCombine", early: bool = False) -> Variant:
    sums = cls == "AttnCombineSums"  # the gate fp32 (an accumulating GEMV's sums), q, k, v sums zeroed
    return Variant(
        name=f"attn_combine{suffix}", op="attn_combine", source="cute_kernels.attn_decode", cls=cls,
        config=dict(groups=groups, unroll=unroll, **({"early": True} if early and not sums else {})),
        args=(_PO, _PL, _LENS, _GATE_SUMS if sums else _GATE, Tensor("out", "bf16", ("B", "OD"), ("out_stride", 1)),
              *(_ZEROED if sums else ())),
        grid=("Hq", "B", "1"),
        divisibility={"OD": 8, "gate_sb": 8, "gate_sh": 8, "out_stride": 8, "po_sb": 4, "po_sh": 4,
                      **({"QD": 256, "KD": 256, "qs_stride": 8, "ks_stride": 8, "vs_stride": 8} if sums else {})},
        pdl=True,
        summary=f"merge split-K partials (log-sum-exp, {groups} split group(s) of 64 threads, "
                f"{'max pass first' if cls == 'AttnCombine' else 'one pass'}), o *= sigmoid(gate), bf16 out"
                f"{'; lens and gate loaded before the PDL wait' if early or sums else ''}"
                f"{'; the gate from fp32 sums, which it zeroes with the q, k and v sums' if sums else ''}",
    )


def _fused(group: int, stages: int = 2, suffix: str = "", sums: bool = False) -> Variant:
    """`sums`: `attn_decode_g<G>_fused_sums`, q_proj, k and v fp32 (an accumulating GEMV's sums)."""
    prep_in = (*_KV_SUMS, *_PREP_IN[2:]) if sums else _PREP_IN
    return Variant(
        name=f"attn_decode_g{group}_fused{suffix}{'_sums' if sums else ''}", op="attn_decode_fused",
        source="cute_kernels.attn_decode", cls="AttnDecodeFused",
        config=dict(group=group, block=32, ctas_per_sm=CTAS_PER_SM, stages=stages, rotary=64,
                    **({"sums": True} if sums else {})),
        args=(_QP_SUMS if sums else _QP, *prep_in, _LENS, _PT, _KV, _Q, _PO, _PL, Scalar("scale", "f32"),
              Scalar("eps", "f32"), Scalar("rope_theta", "f32")),
        grid=("S", f"Hq // {group}", "B"),
        divisibility={"Hq": group, "KD": 256, "qp_sb": 8, "qp_sh": 8, "k_stride": 8, "v_stride": 8, "kv_stride": 8,
                      "q_sb": 4, "po_sb": 4, "po_sh": 4},
        pdl=True,
        archs=("sm_90a",) if stages > 2 else ARCHS,
        summary=f"attn_qk_prep + attn_decode_g{group}{suffix} in one launch: q/k norm + RoPE, "
                f"the new K/V row appended by the CTA that owns it, {stages} K/V stages issued before the PDL wait",
    )


CTAS_PER_SM = 2  # decode CTAs resident per SM (~73 KiB of smem and <= 128 registers each on sm_90a)

# Defaults (`attn_decode_g<G>`, `attn_combine`): the tensor-core kernel (QK and PV by mma.sync), 32-token
# blocks double-buffered (2 x 32 KiB of K/V stages), two CTAs per SM; the combine merges the splits in one
# pass with 8 groups of 64 threads. `_s3`: the same with three stages (sm_90a only; two CTAs need ~222 KiB
# of the SM's 228), a candidate for the default once measured. Fallbacks and baselines of
# tools/bench_attn_decode.py: `_pipelined` + `attn_combine_2pass` (fp32 CUDA-core dots; the max-lse
# sweep before the merge: the previous defaults), `_regs` and `attn_combine_serial` (K/V loaded straight
# into registers one block at a time; one 64-thread group walking the splits).
DECODE_VARIANTS: tuple[Variant, ...] = (
    _decode(2, 32, CTAS_PER_SM, "AttnDecodeMma"), _decode(6, 32, CTAS_PER_SM, "AttnDecodeMma"),
    _decode(8, 32, CTAS_PER_SM, "AttnDecodeMma"),
    _decode(6, 32, CTAS_PER_SM, "AttnDecodeMma", "_s3", stages=3),
    _decode(8, 32, CTAS_PER_SM, "AttnDecodeMma", "_s3", stages=3),
    _decode(2, 32, CTAS_PER_SM, "AttnDecodePipelined", "_pipelined"),
    _decode(6, 32, CTAS_PER_SM, "AttnDecodePipelined", "_pipelined"),
    _decode(8, 32, CTAS_PER_SM, "AttnDecodePipelined", "_pipelined"),
    _decode(6, 32, 2, "AttnDecode", "_regs"), _decode(8, 64, 1, "AttnDecode", "_regs"))
# Prep folded into the decode (one launch fewer per layer; the first K/V blocks issued before the PDL
# wait): `attn_decode_g<G>_fused` (+ `attn_combine_early`), the candidate default once measured.
FUSED_VARIANTS: tuple[Variant, ...] = (_fused(2), _fused(6), _fused(8), _fused(6, 3, "_s3"), _fused(8, 3, "_s3"),
                                        *(_fused(g, sums=True) for g in GROUPS))
COMBINE = _combine(8, 8, cls="AttnCombineOnline")
# `attn_combine_early`: lens and the gate loaded before the PDL wait (the executor's decode step: lens from
# the host's step buffer, the gate from the GEMV two launches back), the candidate partner of the fused decode.
COMBINE_EARLY = _combine(8, 8, "_early", cls="AttnCombineOnline", early=True)
# `attn_combine_sums`: COMBINE_EARLY after a fused decode reading an accumulating projection GEMV's sums.
COMBINE_SUMS = _combine(8, 8, "_sums", cls="AttnCombineSums")
COMBINE_VARIANTS: tuple[Variant, ...] = (COMBINE, COMBINE_EARLY, COMBINE_SUMS, _combine(8, 4, "_2pass"),
                                         _combine(1, 1, "_serial"))
ATTN_VARIANTS: tuple[Variant, ...] = (PREP, *DECODE_VARIANTS, *FUSED_VARIANTS, *COMBINE_VARIANTS)
_BY_NAME = {v.name: v for v in ATTN_VARIANTS}


def attn_variant(name: str) -> Variant:
    """The attention variant called `name`."""
    v = _BY_NAME.get(name)
    if v is None:
        raise LaunchError(f"no attention kernel variant {name!r}; variants: {', '.join(_BY_NAME)}")
    return v


def decode_variant(n_heads: int, n_kv_heads: int, fused: bool = False) -> Variant:
    """The decode variant for a head layout (query heads per kv head = its group); `fused`: the one
    with the prep folded in (`attn_decode_g<G>_fused`, launched by AttnDecodeFused)."""
    if n_kv_heads < 1 or n_heads % n_kv_heads or n_heads // n_kv_heads not in GROUPS:
        raise LaunchError(f"no decode attention kernel for {n_heads} query / {n_kv_heads} kv heads; "
                          f"query heads per kv head must be one of {GROUPS}")
    return attn_variant(f"attn_decode_g{n_heads // n_kv_heads}{'_fused' if fused else ''}")


def default_splits(max_len: int, batch: int, n_kv_heads: int, sm_count: int = 132) -> int:
    """Splits per (sequence, kv head): one full wave of the decode grid over the batch (CTAS_PER_SM
    CTAs per SM), at most one per page.

    The split count can stay fixed while lengths grow (CUDA graphs): each sequence cuts its own
    pages into at most this many splits."""
    pages = max(-(-max_len // PAGE_TOKENS), 1)
    return max(1, min(pages, -(-CTAS_PER_SM * sm_count // max(batch * n_kv_heads, 1))))


def partial_bytes(batch: int, n_heads: int, splits: int) -> tuple[int, int]:
    """Bytes of the fp32 split-K partials (part_o, part_lse)."""
    n = batch * n_heads * splits
    return n * HEAD_DIM * 4, n * 4


def _pool_rows(kv: DeviceBuffer, n_kv_heads: int, kernel: str) -> int:
    """Rows of head_dim values in the KV pool `kv` (whole pages only)."""
    page = 2 * n_kv_heads * PAGE_TOKENS * HEAD_DIM * 2
    _buf(kv, "kv", kernel, page)
    rows = kv.nbytes // page * 2 * n_kv_heads * PAGE_TOKENS
    if rows >= 2**31:
        raise LaunchError(f"kernel {kernel}: KV pool of {rows} rows exceeds 2^31 - 1; split the pool per layer")
    return rows


def _head_rows(buf: DeviceBuffer, what: str, strides: str, kernel: str, batch: int, n_heads: int,
               head_stride: int, stride: int | None, esz: int = 2) -> TensorArg:
    """The [batch, n_heads, 256] view (values of `esz` bytes: bf16, or fp32 sums) of `buf` whose head h of row
    b starts at value b * stride + h * head_stride (the arguments `strides`_stride, default
    n_heads * head_stride, and `strides`_head_stride)."""
    hs = _int(head_stride, f"{strides}_head_stride", kernel)
    span = (n_heads - 1) * hs + HEAD_DIM  # values one row reads
    rs = n_heads * hs if stride is None else _int(stride, f"{strides}_stride", kernel)
    for name, value, least in ((f"{strides}_head_stride", hs, HEAD_DIM), (f"{strides}_stride", rs, span)):
        if value < least or value % 8:
            raise LaunchError(f"kernel {kernel}: {name} = {value} must be >= {least} and a multiple of 8")
    return TensorArg(_buf(buf, what, kernel, ((batch - 1) * rs + span) * esz), (batch, n_heads), (rs, hs))


class _AttnLauncher(Launcher):
    @classmethod
    def load(cls, name: str, device: "Device | None" = None) -> "_AttnLauncher":
        """The launcher for variant `name`, loaded from the kernel cache (built first when stale)."""
        from inferno.cuda.device import Device
        from inferno.kernels.cache import load

        return cls(load(attn_variant(name), device or Device.open()))

    def _heads(self, batch: int, n_heads: int, n_kv_heads: int) -> tuple[int, int, int]:
        batch = _int(batch, "batch", self.name)
        hq = _int(n_heads, "n_heads", self.name)
        hkv = _int(n_kv_heads, "n_kv_heads", self.name)
        if batch > MAX_BATCH:
            raise LaunchError(f"kernel {self.name}: batch = {batch} exceeds {MAX_BATCH}; split the batch")
        if hq % hkv:
            raise LaunchError(f"kernel {self.name}: n_heads = {hq} is not a multiple of n_kv_heads = {hkv}")
        return batch, hq, hkv

    def _prep_in(self, q_proj: DeviceBuffer, k: DeviceBuffer, v: DeviceBuffer, q_norm: DeviceBuffer,
                 k_norm: DeviceBuffer, positions: DeviceBuffer, b: int, hq: int, hkv: int, q_head_stride: int,
                 q_stride: int | None, kv_stride: int | None) -> list[TensorArg]:
        """The prep inputs: q_proj (own row and head strides), k, v (row stride kv_stride), q_norm,
        k_norm, positions."""
        kd, esz = hkv * HEAD_DIM, 4 if self.config.get("sums") else 2  # q_proj, k, v: bf16 or fp32 sums
        q_in = _head_rows(q_proj, "q_proj", "q", self.name, b, hq, q_head_stride, q_stride, esz)
        ks = kd if kv_stride is None else _int(kv_stride, "kv_stride", self.name)
        if ks < kd or ks % 8:
            raise LaunchError(f"kernel {self.name}: kv_stride = {ks} must be >= {kd} and a multiple of 8")
        return [q_in,
                TensorArg(_buf(k, "k", self.name, ((b - 1) * ks + kd) * esz), (b, kd), (ks,)),
                TensorArg(_buf(v, "v", self.name, ((b - 1) * ks + kd) * esz), (b, kd), (ks,)),
                TensorArg(_buf(q_norm, "q_norm", self.name, HEAD_DIM * 2)),
                TensorArg(_buf(k_norm, "k_norm", self.name, HEAD_DIM * 2)),
                TensorArg(_buf(positions, "positions", self.name, b * 4, align=4), (b,))]

    def _group(self, hq: int, hkv: int) -> None:
        if hq // hkv != self.config["group"]:
            raise LaunchError(f"kernel {self.name}: {hq} query / {hkv} kv heads is group {hq // hkv}, "
                              f"the kernel's is {self.config['group']}; "
                              f"use {decode_variant(hq, hkv, fused=self.op == 'attn_decode_fused').name}")

    def _partials(self, part_o: DeviceBuffer, part_lse: DeviceBuffer, b: int, hq: int, s: int) -> list[TensorArg]:
        po_bytes, pl_bytes = partial_bytes(b, hq, s)
        return [TensorArg(_buf(part_o, "part_o", self.name, po_bytes), (b, hq, s), (hq * s * HEAD_DIM, s * HEAD_DIM)),
                TensorArg(_buf(part_lse, "part_lse", self.name, pl_bytes, align=4), (b, hq, s), (hq * s, s))]

    def _table(self, lens: DeviceBuffer, page_table: DeviceBuffer, batch: int, width: int) -> list[TensorArg]:
        width = _int(width, "table_width", self.name)
        return [TensorArg(_buf(lens, "lens", self.name, batch * 4, align=4), (batch,)),
                TensorArg(_buf(page_table, "page_table", self.name, batch * width * 4, align=4), (batch, width),
                          (width,))]


class AttnQkPrep(_AttnLauncher):
    """q/k norm + RoPE of one decode token per sequence; k, v appended to the paged KV cache."""

    op = "attn_qk_prep"

    def __call__(self, q_proj: DeviceBuffer, k: DeviceBuffer, v: DeviceBuffer, q_norm: DeviceBuffer,
                 k_norm: DeviceBuffer, positions: DeviceBuffer, lens: DeviceBuffer, page_table: DeviceBuffer,
                 kv: DeviceBuffer, q: DeviceBuffer, *, batch: int, n_heads: int, n_kv_heads: int,
                 table_width: int, eps: float = 1e-6, rope_theta: float = 1e7, q_head_stride: int = 2 * HEAD_DIM,
                 q_stride: int | None = None, kv_stride: int | None = None, stream: Any = None) -> None:
        """q_proj bf16, head h of sequence b at value b * q_stride + h * q_head_stride (256 values):
        q_head_stride 256 reads the q projection as its GEMV writes it (decode), 512 (the default) the
        q halves of per-head [q | gate] rows (prefill's qg); q_stride defaults to n_heads * q_head_stride.
        k and v [batch, kv_stride >= n_kv_heads*256] bf16; positions, lens int32 [batch]; page_table
        int32 [batch, table_width]; q fp32 [batch, n_heads, 256]."""
        b, hq, hkv = self._heads(batch, n_heads, n_kv_heads)
        args = [*self._prep_in(q_proj, k, v, q_norm, k_norm, positions, b, hq, hkv, q_head_stride, q_stride, kv_stride),
                *self._table(lens, page_table, b, table_width),
                TensorArg(kv.ptr, (_pool_rows(kv, hkv, self.name),), (HEAD_DIM,)),
                TensorArg(_buf(q, "q", self.name, b * hq * HEAD_DIM * 4), (b, hq), (hq * HEAD_DIM,)),
                eps, rope_theta]
        self._launch(args, {"B": b, "Hq": hq, "KD": hkv * HEAD_DIM}, stream)


class AttnDecode(_AttnLauncher):
    """Split-K attention partials of one query token per sequence over its paged KV cache."""

    op = "attn_decode"

    def __call__(self, q: DeviceBuffer, lens: DeviceBuffer, page_table: DeviceBuffer, kv: DeviceBuffer,
                 part_o: DeviceBuffer, part_lse: DeviceBuffer, *, batch: int, n_heads: int, n_kv_heads: int,
                 table_width: int, splits: int, scale: float = HEAD_DIM ** -0.5, stream: Any = None) -> None:
        """q fp32 [batch, n_heads, 256]; part_o fp32 [batch, n_heads, splits, 256]; part_lse [.., splits]."""
        b, hq, hkv = self._heads(batch, n_heads, n_kv_heads)
        self._group(hq, hkv)
        s = _int(splits, "splits", self.name)
        args = [TensorArg(_buf(q, "q", self.name, b * hq * HEAD_DIM * 4), (b, hq), (hq * HEAD_DIM,)),
                *self._table(lens, page_table, b, table_width),
                TensorArg(kv.ptr, (_pool_rows(kv, hkv, self.name),), (HEAD_DIM,)),
                *self._partials(part_o, part_lse, b, hq, s),
                scale]
        self._launch(args, {"B": b, "Hq": hq, "S": s}, stream)


class AttnDecodeFused(_AttnLauncher):
    """attn_qk_prep and AttnDecode in one launch: q/k norm + RoPE, k and v appended to the paged cache,
    split-K partials (combine them with AttnCombine)."""

    op = "attn_decode_fused"

    def __call__(self, q_proj: DeviceBuffer, k: DeviceBuffer, v: DeviceBuffer, q_norm: DeviceBuffer,
                 k_norm: DeviceBuffer, positions: DeviceBuffer, lens: DeviceBuffer, page_table: DeviceBuffer,
                 kv: DeviceBuffer, q: DeviceBuffer, part_o: DeviceBuffer, part_lse: DeviceBuffer, *, batch: int,
                 n_heads: int, n_kv_heads: int, table_width: int, splits: int, eps: float = 1e-6,
                 rope_theta: float = 1e7, scale: float = HEAD_DIM ** -0.5, q_head_stride: int = HEAD_DIM,
                 q_stride: int | None = None, kv_stride: int | None = None, stream: Any = None) -> None:
        """Inputs as AttnQkPrep (q_proj head h of sequence b at value b * q_stride + h * q_head_stride;
        the default head stride 256 reads the q projection where its GEMV wrote it), outputs as
        AttnDecode; q fp32 [batch, n_heads, 256] receives the normalised, RoPE'd q (written by the
        split-0 CTAs; nothing reads it back). lens, page_table and positions must not be written by
        the kernels just before this one (it reads them before its PDL wait): the step buffer the host
        fills before the graph."""
        b, hq, hkv = self._heads(batch, n_heads, n_kv_heads)
        self._group(hq, hkv)
        s = _int(splits, "splits", self.name)
        args = [*self._prep_in(q_proj, k, v, q_norm, k_norm, positions, b, hq, hkv, q_head_stride, q_stride, kv_stride),
                *self._table(lens, page_table, b, table_width),
                TensorArg(kv.ptr, (_pool_rows(kv, hkv, self.name),), (HEAD_DIM,)),
                TensorArg(_buf(q, "q", self.name, b * hq * HEAD_DIM * 4), (b, hq), (hq * HEAD_DIM,)),
                *self._partials(part_o, part_lse, b, hq, s),
                scale, eps, rope_theta]
        self._launch(args, {"B": b, "Hq": hq, "KD": hkv * HEAD_DIM, "S": s}, stream)


class AttnCombine(_AttnLauncher):
    """out[b, h] = merge of the split partials * sigmoid(gate of head h), bf16 [batch, n_heads*256]."""

    op = "attn_combine"

    def __call__(self, part_o: DeviceBuffer, part_lse: DeviceBuffer, lens: DeviceBuffer, gate: DeviceBuffer,
                 out: DeviceBuffer, *, batch: int, n_heads: int, splits: int, gate_head_stride: int = HEAD_DIM,
                 gate_stride: int | None = None, out_stride: int | None = None,
                 zero: "tuple[DeviceBuffer, DeviceBuffer, DeviceBuffer] | None" = None, n_kv_heads: int = 0,
                 stream: Any = None) -> None:
        """gate bf16, head h of sequence b at value b * gate_stride + h * gate_head_stride (256 values;
        gate_stride defaults to n_heads * gate_head_stride); out [batch, out_stride >= n_heads*256].
        `attn_combine_sums`: gate fp32 (sums), and `zero` = the q [batch, n_heads * 256], k and v
        [batch, n_kv_heads * 256] fp32 sums (contiguous rows) it zeroes with the gate."""
        b, hq, _ = self._heads(batch, n_heads, 1)
        s = _int(splits, "splits", self.name)
        od = hq * HEAD_DIM
        sums = self.loaded.variant.cls == "AttnCombineSums"
        if sums != (zero is not None):
            raise LaunchError(f"kernel {self.name}: pass zero= (the q, k, v sums) exactly for attn_combine_sums")
        gate_in = _head_rows(gate, "gate", "gate", self.name, b, hq, gate_head_stride, gate_stride, 4 if sums else 2)
        os_ = od if out_stride is None else _int(out_stride, "out_stride", self.name)
        if os_ < od or os_ % 8:
            raise LaunchError(f"kernel {self.name}: out_stride = {os_} must be >= {od} and a multiple of 8")
        args = [*self._partials(part_o, part_lse, b, hq, s),
                TensorArg(_buf(lens, "lens", self.name, b * 4, align=4), (b,)),
                gate_in,
                TensorArg(_buf(out, "out", self.name, ((b - 1) * os_ + od) * 2), (b, od), (os_,))]
        symbols = {"B": b, "Hq": hq, "S": s}
        if zero is not None:
            kd = _int(n_kv_heads, "n_kv_heads", self.name) * HEAD_DIM
            args += [TensorArg(_buf(z, what, self.name, b * n * 4), (b, n), (n,))
                     for z, what, n in zip(zero, ("q sums", "k sums", "v sums"), (od, kd, kd))]
            symbols.update(QD=od, KD=kd)
        self._launch(args, symbols, stream)


class PagedAttention:
    """One gated full-attention decode step after the projections: prep, split-K partials, combine
    (or, with a fused decode variant (`attn_decode_g<G>_fused*`), the fused kernel and the combine).

    q and gate are read where the projections wrote them (head h at h * 256 of a row); `scratch`
    holds the fp32 q and the partials; size it with `scratch_bytes`."""

    def __init__(self, n_heads: int, n_kv_heads: int, device: "Device | None" = None, decode: str | None = None,
                 combine: str | None = None):
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        name = decode or decode_variant(n_heads, n_kv_heads).name
        fused = attn_variant(name).op == FUSED_VARIANTS[0].op
        self.prep = None if fused else AttnQkPrep.load(PREP.name, device)
        self.decode = (AttnDecodeFused if fused else AttnDecode).load(name, device)
        self.combine = AttnCombine.load(combine or COMBINE.name, device)

    def scratch_bytes(self, batch: int, splits: int) -> int:
        po, pl = partial_bytes(batch, self.n_heads, splits)
        return _align(batch * self.n_heads * HEAD_DIM * 4) + _align(po) + _align(pl)

    def __call__(self, q_proj: DeviceBuffer, gate: DeviceBuffer, k: DeviceBuffer, v: DeviceBuffer,
                 q_norm: DeviceBuffer, k_norm: DeviceBuffer, positions: DeviceBuffer, lens: DeviceBuffer,
                 page_table: DeviceBuffer, kv: DeviceBuffer, scratch: DeviceBuffer, out: DeviceBuffer, *,
                 batch: int, table_width: int, splits: int, eps: float = 1e-6, rope_theta: float = 1e7,
                 q_stride: int | None = None, gate_stride: int | None = None, kv_stride: int | None = None,
                 stream: Any = None) -> None:
        """q_proj and gate bf16 [batch, n_heads*256] (row strides q_stride, gate_stride); k and v
        [batch, n_kv_heads*256] (kv_stride); lens: cached tokens per sequence including this one
        (the kernels append at lens - 1)."""
        hq, hkv = self.n_heads, self.n_kv_heads
        need = self.scratch_bytes(batch, splits)
        if not isinstance(scratch, DeviceBuffer) or scratch.nbytes < need:
            raise LaunchError(f"paged attention: scratch must be a DeviceBuffer of at least {need} bytes")
        po, pl = partial_bytes(batch, hq, splits)
        q_bytes = _align(batch * hq * HEAD_DIM * 4)
        q = scratch.view(0, q_bytes, "attn q")
        part_o = scratch.view(q_bytes, _align(po), "attn part_o")
        part_lse = scratch.view(q_bytes + _align(po), _align(pl), "attn part_lse")
        heads = dict(batch=batch, n_heads=hq, n_kv_heads=hkv, table_width=table_width, stream=stream)
        if self.prep is None:
            self.decode(q_proj, k, v, q_norm, k_norm, positions, lens, page_table, kv, q, part_o, part_lse,
                        splits=splits, eps=eps, rope_theta=rope_theta, q_stride=q_stride, kv_stride=kv_stride, **heads)
        else:
            self.prep(q_proj, k, v, q_norm, k_norm, positions, lens, page_table, kv, q, eps=eps, rope_theta=rope_theta,
                      q_head_stride=HEAD_DIM, q_stride=q_stride, kv_stride=kv_stride, **heads)
            self.decode(q, lens, page_table, kv, part_o, part_lse, splits=splits, **heads)
        self.combine(part_o, part_lse, lens, gate, out, batch=batch, n_heads=hq, gate_stride=gate_stride, splits=splits,
                     stream=stream)


def _align(n: int, to: int = 256) -> int:
    return -(-n // to) * to


def build(out_dir: str, archs: tuple[str, ...] = ("sm_90a",)) -> None:
    """Compile every attention variant into out_dir/<arch>/ (progress on stderr)."""
    from pathlib import Path

    from inferno.kernels.build import build_all

    build_all(list(ATTN_VARIANTS), list(archs), Path(out_dir))


if __name__ == "__main__":
    import sys

    if len(sys.argv) < 2:
        sys.exit("usage: python -m inferno.kernels.attn_variants OUT_DIR [sm_90a,sm_120a]")
    build(sys.argv[1], tuple(sys.argv[2].split(",")) if len(sys.argv) > 2 else ("sm_90a",))
