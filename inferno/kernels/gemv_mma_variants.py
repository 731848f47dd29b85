"""Kernel variants of the tensor-core decode GEMV (`cute_kernels/gemv_mma.py`) and their launcher.

The weights are the `tile16-v1` image of the matrix (`inferno.kernels.tiled.tile`), not the
row-split payload. Host arguments as the CUDA-core GEMV (`inferno.kernels.gemv_variants`): w int32
tile16-v1 image, x bf16 [T, K], r bf16 [T, M] (`_res` only), y bf16 [T, M].

A family per (format, epilogue, T): `gemv_mma_<q4|q5|q6|w8>_t<T>[_res|_swiglu]`, T in 1, 8 (a
variant accepts any 1 <= T <= its T). Its members `<family>_k<kw>` differ in how many warps split
K (kw = 2, 4, 8 of the CTA's 8 warps); the launcher picks the member per call from the shape
(`k_split`, a rule fitted to H200 measurements):

    from inferno.kernels.gemv_mma_variants import GemvMma, variant_name
    k = GemvMma.load(variant_name("Q4G64_F16S", "swiglu", cols=1))    # loads the family
    k(w_tiled, x, y, n=34816, k=5120, cols=1)                          # same call as GemvQ
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any


from inferno.cuda.errors import LaunchError
from inferno.cuda.launch import launch
from inferno.cuda.memory import DeviceBuffer
from inferno.cuda.params import TensorArg
from inferno.kernels.gemv_variants import EPILOGUES, FORMATS, gemv_args, gemv_tensors
from inferno.kernels.launchers import _buf
from inferno.kernels.registry import Scalar, Tensor, Variant
from inferno.kernels.tiled import LAYOUT, mixed_nbytes, tiled_geometry

if TYPE_CHECKING:
    from inferno.cuda.device import Device
    from inferno.kernels.cache import LoadedKernel

COLS = (1, 8)
KW = (2, 4, 8)  # members of a family: warps splitting K
WARPS, TILES = 8, 1  # warps per CTA, output units (16 outputs) per warp row
XPRE = True  # x one group pair ahead in registers (else loaded when its pair is computed)
# register stages of group pairs per warp (stages - 1 pairs of weights in flight; swiglu streams 2
# tiles at once): about as many as fit 128 registers (2 CTAs of 8 warps per SM) without spilling
STAGES = {("q4", False): 4, ("q5", False): 3, ("q6", False): 3, ("w8", False): 4,
          ("q4", True): 3, ("q5", True): 2, ("q6", True): 2, ("w8", True): 3}
STAGES_XJ = 1  # stages x loaded when needed affords beyond STAGES (its x registers are not held ahead)
# x staged in shared memory (`xs`: Q4-Q6, T <= 2, K <= KMAX): no x registers, so deeper weight stages
STAGES_XS = {("q4", False): 4, ("q5", False): 3, ("q6", False): 3,
             ("q4", True): 3, ("q5", True): 2, ("q6", True): 2}
XS_KW = (2, 4)  # registered x-in-shared-memory members (T = 1, Q4-Q6)
# stream-K from mid-size problems on (H200, 2026-11-30: the 27B gate_up / down, 43,520 blocks, 1.2-1.4x the
# xs members); fewer blocks leave each warp too short a run. The output head (620,800 blocks) went to xs kw 2 until
# 2026-12-03, when the same-run decode read +0.3-1.1 % of roofline with it on stream-K
XS_KW2_UNITS = 512  # xs: 2 warps per K range from 512 units (the head's rule before stream-K took it), else 4


def sk_wins(blocks: int, epilogue: str) -> bool:
    """Whether stream-K beats the xs members for a problem of `blocks` (unit, group pair) blocks (H200, PDL on):
    from 20,000 blocks (the 27B value_z, gate_up, down, the output head), residual from 12,000 (the GDN and
    attention outputs)."""
    return (20000 if epilogue != "residual" else 12000) <= blocks
KMAX = 18432  # cute_kernels/gemv_mma.py KMAX: the longest K an xs kernel takes
NORM_KMAX = 8192  # the `_n` members (K = hidden size): fewer staging registers per thread


def kmax_for(norm: bool) -> int:
    """The longest K a member with x in shared memory takes."""
    return NORM_KMAX if norm else KMAX


def stages_for(fmt: str, epilogue: str, xpre: bool = XPRE, xs: bool = False) -> int:
    if xs:
        return STAGES_XS[(FORMATS[fmt][0], epilogue == "swiglu")]
    return STAGES[(FORMATS[fmt][0], epilogue == "swiglu")] + (0 if xpre else STAGES_XJ)


# K split rule (measured on the H200, tools/bench_gemv.py --mma --mma-tune, docs/kernels-gemv-mma.md)
RUN_PAIRS = 10  # a warp should stream >= 10 (tile, group pair) blocks: its register pipeline is 2-4 deep
MIN_WARPS, MAX_WARPS = 1536, 32768  # but keep >= ~12 and <= ~250 warps of work per SM


def k_split(m: int, k: int, epilogue: str = "plain", kws: tuple[int, ...] = KW) -> int:
    """The kw (of `kws`) for m outputs and K = k: the largest split whose warps still stream >= RUN_PAIRS
    blocks, then doubled while fewer than MIN_WARPS warps, halved while more than MAX_WARPS."""
    units, pairs = -(-m // 16), -(-k // 128)
    blocks = pairs * (2 if epilogue == "swiglu" else 1)  # swiglu streams a gate and an up tile
    ks = sorted(kws)
    i = max([j for j, kw in enumerate(ks) if blocks >= RUN_PAIRS * kw] or [0])
    while i + 1 < len(ks) and units * ks[i] < MIN_WARPS:
        i += 1
    while i > 0 and units * ks[i] > MAX_WARPS:
        i -= 1
    return ks[i]


ACCUMULATE = "accumulate"  # y fp32 [1, M] += W x (stream-K only): a residual deferred to the next GEMV's staging


def variant_name(fmt: str, epilogue: str = "plain", cols: int = 1, norm: bool = False, add: bool = False) -> str:
    """The family for `fmt` with `epilogue` that takes `cols` columns (T = 1, else 8); `norm`: the
    family that applies the zero-centred RMSNorm to x while staging it (`_n`, T = 1); `add` (with norm):
    the one whose x is bf16(x + s), s the sums of an `accumulate` GEMV (`_na`, stream-K only)."""
    if fmt not in FORMATS:
        raise LaunchError(f"no GEMV kernel for weight format {fmt!r}; formats: {', '.join(FORMATS)}")
    epilogues = {**EPILOGUES, ACCUMULATE: "_acc"}
    if epilogue not in epilogues:
        raise LaunchError(f"unknown GEMV epilogue {epilogue!r}; epilogues: {', '.join(epilogues)}")
    t = next((c for c in COLS if c >= cols), None)
    if t is None or cols < 1:
        raise LaunchError(f"GEMV takes 1..{COLS[-1]} columns, got {cols}; split the batch")
    if norm and (t != 1 or epilogue == "residual" or FORMATS[fmt][1] == 8):
        raise LaunchError("the GEMV with the RMSNorm folded in is Q4-Q6, T = 1, plain, swiglu or accumulate")
    if (epilogue == ACCUMULATE or add) and (t != 1 or FORMATS[fmt][1] == 8):
        raise LaunchError("the accumulating GEMV and the one adding its sums are Q4-Q6, T = 1")
    if add and not norm:
        raise LaunchError("the GEMV adding an accumulated residual also folds the RMSNorm (norm=True)")
    return f"gemv_mma_{FORMATS[fmt][0]}_t{t}{epilogues[epilogue]}{'_na' if add else '_n' if norm else ''}"


def norm_tensors(norm: bool) -> tuple[Tensor | None, Scalar | None]:
    """The norm arguments (weight bf16 [K], eps) of a `_n` member, else (None, None)."""
    if not norm:
        return None, None
    return Tensor("nw", "bf16", ("K",), (1,)), Scalar("eps", "f32")


def outs_per_cta(warps: int, kw: int, tiles: int) -> int:
    return 16 * tiles * (warps // kw)


def make_variant(fmt: str, epilogue: str, cols: int, kw: int = 8, warps: int = WARPS, tiles: int = TILES,
                 stages: int | None = None, xpre: bool = XPRE, xs: bool = False, norm: bool = False) -> Variant:
    """Member `<family>_k<kw>`; a non-default warps/tiles/stages/xpre adds `_w<warps>_r<tiles>_p<stages>`
    (and `_xj`: x loaded when needed); x in shared memory adds `_xs_w<warps>_r<tiles>_p<stages>`."""
    _, bits, group = FORMATS[fmt]
    stages = stages or stages_for(fmt, epilogue, xpre, xs)
    if warps % kw:
        raise LaunchError(f"kw = {kw} must divide warps = {warps}")
    if norm and not xs:
        raise LaunchError("the RMSNorm folds into the x-in-shared-memory members only")
    name = f"{variant_name(fmt, epilogue, cols, norm)}_k{kw}"
    if xs:
        name += "_xs" + ("" if (warps, tiles, stages) == (WARPS, TILES, stages_for(fmt, epilogue, xs=True))
                         else f"_w{warps}_r{tiles}_p{stages}")
    elif (warps, tiles, stages, xpre) != (WARPS, TILES, stages_for(fmt, epilogue), XPRE):
        name += f"_w{warps}_r{tiles}_p{stages}" + ("" if xpre else "_xj")
    w, x, r, y = gemv_tensors(epilogue)
    what = {"plain": "y = W x", "residual": "y = r + W x",
            "swiglu": "out = silu(W[:I] x) * (W[I:] x)"}[epilogue] + (" (x RMS-normed)" if norm else "")
    return Variant(
        name=name, op="gemv_mma", source="cute_kernels.gemv_mma", cls="GemvMma",
        config=dict(bits=bits, group=group, cols=cols, epilogue=epilogue, warps=warps, kw=kw, tiles=tiles,
                    stages=stages, xpre=xpre, **({"xs": True, "kmax": kmax_for(norm)} if xs else {}),
                    **({"norm": True} if norm else {})),
        archs=("sm_90a", "sm_120a"),
        args=(w, x, r, y, *norm_tensors(norm)), grid=(f"cdiv(M, {outs_per_cta(warps, kw, tiles)})", "1", "1"),
        divisibility={"K": 8, "x_stride": 8},
        pdl=True,
        summary=f"{what}, W {fmt} {LAYOUT}, x bf16 [T<={cols}, K], mma.sync bf16, fp32 accumulate, "
                f"{kw} warps split K",
    )


def alternatives(fmt: str, epilogue: str, cols: int) -> list[Variant]:
    """Other kernel shapes at kw = 8 (benchmarked and GPU-tested, not registered): x loaded when
    needed with more weight stages; two tiles per warp sharing x (plain and residual)."""
    out = [make_variant(fmt, epilogue, cols, 8, xpre=False)]
    if epilogue != "swiglu":
        out.append(make_variant(fmt, epilogue, cols, 8, tiles=2, stages=STAGES[(FORMATS[fmt][0], True)]))
    return out


# Stream-K (cute_kernels/gemv_mma_sk.py). The registered member streams the weights through a ring of
# shared-memory stages filled by cp.async (`cpa`); the register-stage form is a benchmark alternative.
# H200, 2026-11-30, PDL on: the ring at 1 CTA x 16 warps per SM beat register stages by 3-14 %, and
# 2-3 ring stages beat deeper rings (tools/bench_gemv.py --xs --pdl; docs/kernels-gemv-mma.md). Swiglu 3
# stages since 2026-12-03: with the prologue split around x's loads (cute_kernels/gemv_mma_sk.py PRE_WAIT)
# its second block no longer delays x (27B decode +0.85 % against 2 stages, same run). The other members 5
# stages since 2026-12-03 with PRE_WAIT 2 (2 slots before the wait): +0.35 % against 4 stages and 1 slot, where 5
# stages with 1 slot lost 0.8 % and swiglu at 4 stages lost 0.5 % (docs/performance.md "Session 25").
SK_STAGES = {("q4", False): 5, ("q5", False): 5, ("q6", False): 5, ("q4", True): 3, ("q5", True): 3, ("q6", True): 3}
REG_SK_STAGES = {("q4", False): 4, ("q5", False): 3, ("q6", False): 3, ("q4", True): 3, ("q5", True): 2,
                 ("q6", True): 2}
SK_CTAS, SK_WARPS = 1, 16  # the stream-K grid: CTAs per SM, warps per CTA
SK_MIN_BLOCKS = 4  # blocks per warp at least (small problems use fewer CTAs)
COUNTER_ALIGN = 32  # cute_kernels/gemv_mma_sk.py: counters padded before the fp32 sums
TIMELINE = 7 + 32  # cute_kernels/gemv_mma_sk.py TIMELINE (7 + TRACE): u64 words per warp of the "timeline" probe
SMEM_BLOCK = 227 * 1024  # shared memory one CTA may use (sm_90)


def make_sk_variant(fmt: str, epilogue: str, cols: int = 1, stages: int | None = None, ctas: int = SK_CTAS,
                    warps: int = SK_WARPS, cpa: bool = True, norm: bool = False, probe: str = "",
                    add: bool = False, lo4: bool = False) -> Variant:
    """The stream-K member `<family>_sk` (Q4-Q6, T = 1: shared-memory ring, SK_STAGES, 1 x 16 warps per
    SM); other ring shapes are `<family>_sk_p<s>_c<c>_w<w>`, register stages `<family>_sk_regs_p<s>_c<c>_w<w>`;
    `probe` (benchmark only, wrong results): `<family>_sk_probe_<probe>` (cute_kernels/gemv_mma_sk.py).
    `accumulate`: y fp32 += W x, no workspace; `add`: x is bf16(x + s) (GemvMmaSKAdd: s fp32 [K], xo bf16 [K],
    z fp32 [K] after the norm arguments); `lo4` (Q5 `_acc_n` / `_acc_na`): W a mixed stack whose first `lo` tiles
    are a Q4 image (`tiled.mixed_nbytes`), `lo` (i32) the last argument: the family `<family>_lo4`."""
    _, bits, group = FORMATS[fmt]
    if lo4 and (bits != 5 or epilogue != ACCUMULATE or not norm or not cpa or probe):
        raise LaunchError("the lo4 stream-K GEMV is the Q5 accumulating one with the RMSNorm folded (a mixed stack)")
    if bits == 8 or cols != 1:
        raise LaunchError("stream-K GEMV: Q4-Q6 at T = 1 only")
    acc = epilogue == ACCUMULATE
    key = (FORMATS[fmt][0], epilogue == "swiglu")
    default = SK_STAGES[key] if cpa else REG_SK_STAGES[key]
    stages = stages or default
    if cpa and not ring_fits(fmt, epilogue, stages, warps):
        raise LaunchError(f"stream-K GEMV {fmt} {epilogue}: a ring of {stages} stages for {warps} warps does not fit "
                          f"one CTA's {SMEM_BLOCK // 1024} KB of shared memory next to x; use fewer stages or warps")
    name = f"{variant_name(fmt, epilogue, cols, norm, add)}{'_lo4' if lo4 else ''}_sk"
    if not cpa:
        name += f"_regs_p{stages}_c{ctas}_w{warps}"
    elif (stages, ctas, warps) != (default, SK_CTAS, SK_WARPS):
        name += f"_p{stages}_c{ctas}_w{warps}"
    if probe:
        name += f"_probe_{probe}"
    w, x, r, y = gemv_tensors("plain" if acc else epilogue)
    if acc:
        y = Tensor("y", "f32", ("T", "M"), ("y_stride", 1))
    ws = None if acc else Tensor("ws", "i32", ("WS",), (1,))
    extra = (Tensor("s", "f32", ("K",), (1,)), Tensor("xo", "bf16", ("K",), (1,)),
             Tensor("z", "f32", ("K",), (1,))) if add else ()
    what = ("y += W x (fp32 sums, no flush)" if acc else f"{epilogue} GEMV") + (", x = bf16(x + s)" if add else "")
    if lo4:
        extra += (Scalar("lo", "i32"),)
        what += ", W's first lo tiles a Q4 image"
    return Variant(
        name=name, op="gemv_mma", source="cute_kernels.gemv_mma_sk",
        cls=("GemvMmaSKAdd" if add else "GemvMmaSK") + ("Lo" if lo4 else ""),
        config=dict(bits=bits, group=group, cols=cols, epilogue=epilogue, warps=warps, stages=stages, ctas=ctas,
                    kmax=kmax_for(norm), sk=True, cpa=cpa, **({"norm": True} if norm else {}),
                    **({"probe": probe} if probe else {}), **({"add": True} if add else {}),
                    **({"lo4": True} if lo4 else {})),
        archs=("sm_90a",) if cpa else ("sm_90a", "sm_120a"),  # the ring needs sm_90's 227 KB per CTA
        args=(w, x, r, y, ws, *norm_tensors(norm), *extra), grid=(f"SMS * {ctas}", "1", "1"),
        divisibility={"K": 8, "x_stride": 8},
        pdl=True,
        summary=f"stream-K {what}, W {fmt} {LAYOUT}, x bf16 [1, K <= {kmax_for(norm)}] in shared memory, "
                f"{'weights through a cp.async ring, ' if cpa else ''}mma.sync bf16, fp32 accumulate"
                + ("" if acc else ", self-cleaning workspace"),
    )


def ring_fits(fmt: str, epilogue: str, stages: int, warps: int) -> bool:
    """Whether a ring of `stages` stages for `warps` warps fits one CTA's shared memory next to x."""
    slot = 1024 + 256 * {4: 0, 5: 1, 6: 2}[FORMATS[fmt][1]] + 256
    ring = warps * stages * slot * (2 if epilogue == "swiglu" else 1)
    return ring + KMAX * 2 + KMAX // 64 * 4 + 1024 <= SMEM_BLOCK


def sk_variants(fmt: str, epilogue: str) -> list[Variant]:
    """Stream-K shapes for the benchmark: the ring at one stage less / more and 2 x 8 warps; register
    stages at 1 x 16, 2 x 8 and 2-4 x 4 warps per SM (the last leave room for the next kernel's CTAs)."""
    if FORMATS[fmt][1] == 8:
        return []
    key = (FORMATS[fmt][0], epilogue == "swiglu")
    d, r = SK_STAGES[key], REG_SK_STAGES[key]
    ring = [make_sk_variant(fmt, epilogue, stages=s) for s in (d - 1, d + 1)
            if s >= 2 and ring_fits(fmt, epilogue, s, SK_WARPS)]
    if ring_fits(fmt, epilogue, d, 8):
        ring.append(make_sk_variant(fmt, epilogue, ctas=2, warps=8))
    regs = ([make_sk_variant(fmt, epilogue, stages=r, ctas=c, warps=w, cpa=False) for c, w in ((1, 16), (2, 8))]
            + [make_sk_variant(fmt, epilogue, stages=r, ctas=c, warps=4, cpa=False) for c in (2, 3, 4)])
    return ring + regs


def probe_variants(fmt: str, epilogue: str, **ring) -> list[Variant]:
    """The stream-K member (the default, or `ring`: make_sk_variant's ring options) with its flush chain
    skipped, with no stream at all, streaming without computing, without x staging, without staging and
    flush chain (timing probes for `tools/bench_gemv.py --probe`; their outputs are wrong), and with
    per-warp %globaltimer stamps (`--timeline`)."""
    return [make_sk_variant(fmt, epilogue, probe=p, **ring)
            for p in ("nochain", "empty", "nocompute", "timeline", "nostage", "bare")]


def sk_workspace_bytes(m: int, n_w: int, cols: int) -> int:
    """Bytes of the stream-K workspace: unit counters, then fp32 sums [cols, n_w]."""
    units = -(-m // 16)
    return 4 * (-(-units // COUNTER_ALIGN) * COUNTER_ALIGN + cols * n_w)


def xs_variants(fmt: str, epilogue: str, cols: int) -> list[Variant]:
    """The x-in-shared-memory kernels for the benchmark (Q4-Q6, T = 1): every K split at the default
    stages, and one stage less and more at kw = 4."""
    if FORMATS[fmt][1] == 8 or cols != 1:
        return []
    base = stages_for(fmt, epilogue, xs=True)
    return ([make_variant(fmt, epilogue, cols, kw, xs=True) for kw in KW]
            + [make_variant(fmt, epilogue, cols, 4, stages=s, xs=True) for s in (base - 1, base + 1) if s >= 2])


def t1_fast_members(fmt: str, epilogue: str, norm: bool = False) -> list[Variant]:
    """The T = 1 family's x-in-shared-memory and stream-K members (Q4-Q6; none for W8); `norm`: those of
    the family with the RMSNorm folded in (plain and swiglu: the GEMVs that read a norm's output)."""
    if FORMATS[fmt][1] == 8 or (norm and epilogue == "residual"):
        return []
    return ([make_variant(fmt, epilogue, 1, kw, xs=True, norm=norm) for kw in XS_KW]
            + [make_sk_variant(fmt, epilogue, norm=norm)])


def deferred_members(fmt: str) -> list[Variant]:
    """The deferred-epilogue members of a Q4-Q6 format (none for W8), stream-K only: the accumulating GEMV (a
    residual left to its readers), the `_na` plain / swiglu GEMVs whose staging adds such sums, and the
    accumulating GEMV with the RMSNorm folded (`_acc_n`) or the sums added too (`_acc_na`: the GDN input
    projection, whose sums the conv + step kernel reads)."""
    if FORMATS[fmt][1] == 8:
        return []
    return ([make_sk_variant(fmt, ACCUMULATE)]
            + [make_sk_variant(fmt, e, norm=True, add=True) for e in ("plain", "swiglu")]
            + [make_sk_variant(fmt, ACCUMULATE, norm=True, add=add) for add in (False, True)]
            + [make_sk_variant(fmt, ACCUMULATE, norm=True, add=add, lo4=True) for add in (False, True)
               if FORMATS[fmt][1] == 5])


GEMV_MMA_VARIANTS: tuple[Variant, ...] = tuple(
    [make_variant(fmt, epi, cols, kw) for fmt in FORMATS for epi in EPILOGUES for cols in COLS for kw in KW]
    + [v for norm in (False, True) for fmt in FORMATS for epi in EPILOGUES for v in t1_fast_members(fmt, epi, norm)]
    + [v for fmt in FORMATS for v in deferred_members(fmt)])
_BY_NAME = {v.name: v for v in GEMV_MMA_VARIANTS}


def gemv_mma_variant(name: str) -> Variant:
    """The tensor-core GEMV variant called `name` (a family member)."""
    v = _BY_NAME.get(name)
    if v is None:
        raise LaunchError(f"no tensor-core GEMV variant {name!r}; names look like {GEMV_MMA_VARIANTS[0].name}")
    return v


@lru_cache(maxsize=1024)
def _tiled_bytes(fmt: str, n: int, k: int) -> int:
    return tiled_geometry(fmt, n, k).nbytes


class GemvMma:
    """Typed launcher over one or more members of a family: y[t] = epilogue(W x[t]) for t < cols,
    W the `tile16-v1` image of [n, k] (n = 2I for swiglu). Each call runs the member `member` picks:
    stream-K where `sk_wins`, else x in shared memory (`k_split` among its kw), else (K past
    KMAX, or no such member) x in registers."""

    sk_cls: "type[GemvMmaSK]"  # the stream-K member's launcher (set below, after GemvMmaSK)

    def __init__(self, *loaded: "LoadedKernel"):
        if not loaded:
            raise LaunchError("GemvMma needs at least one loaded kernel")
        self.by_kw: dict[int, tuple[Any, int]] = {}  # x in registers
        self.xs_by_kw: dict[int, tuple[Any, int]] = {}  # x in shared memory
        self.sk: GemvMmaSK | None = None
        for lk in loaded:
            c = lk.manifest.config
            if c.get("sk"):
                self.sk = self.sk_cls(lk)
                continue
            outs = outs_per_cta(c["warps"], c["kw"], c["tiles"])
            if lk.manifest.grid != [f"cdiv(M, {outs})", "1", "1"]:
                raise LaunchError(f"kernel {lk.variant.name}: manifest grid {lk.manifest.grid} is not this launcher's")
            (self.xs_by_kw if c.get("xs") else self.by_kw)[c["kw"]] = (lk, outs)
        c = loaded[0].manifest.config
        self.bits, self.group, self.cols, self.epilogue = c["bits"], c["group"], c["cols"], c["epilogue"]
        self.norm, self.add = bool(c.get("norm")), bool(c.get("add"))
        if any(lk.manifest.config.get(f) != c.get(f) for lk in loaded
               for f in ("bits", "group", "cols", "epilogue", "norm", "add")):
            raise LaunchError("GemvMma: the kernels are not members of one family")
        self.fmt = self._format(c)
        self.name = self._family_name()

    @staticmethod
    def _format(config: dict) -> str:
        """The weight format of a member's config."""
        return next(f for f, (_, b, g) in FORMATS.items() if (b, g) == (config["bits"], config["group"]))

    def _family_name(self) -> str:
        return variant_name(self.fmt, self.epilogue, self.cols, self.norm, self.add)

    def _weight_bytes(self, n: int, k: int) -> int:
        """Bytes of the weight image of [n, k]."""
        return _tiled_bytes(self.fmt, n, k)

    @classmethod
    def load(cls, name: str, device: "Device | None" = None) -> "GemvMma":
        """A family name loads all its members built for the device's arch; a member name only that one."""
        from inferno.cuda.device import Device
        from inferno.kernels.cache import load

        device = device or Device.open()
        names = family_members(name)
        if name not in _BY_NAME:
            names = [nm for nm in names if device.arch in gemv_mma_variant(nm).archs]
        return cls(*(load(gemv_mma_variant(nm), device) for nm in names))

    def member(self, m: int, k: int) -> "tuple[Any, int] | GemvMmaSK":
        """The stream-K launcher, or (loaded kernel, outputs per CTA), for m outputs and K = k."""
        blocks = -(-m // 16) * (-(-k // 128))
        kmax = kmax_for(self.norm)
        if k <= kmax and self.sk is not None and (sk_wins(blocks, self.epilogue) or not (self.xs_by_kw or self.by_kw)):
            return self.sk
        if k <= kmax and self.xs_by_kw:
            return self.xs_by_kw[2 if -(-m // 16) >= XS_KW2_UNITS and 2 in self.xs_by_kw else max(self.xs_by_kw)]
        if not self.by_kw:
            raise LaunchError(f"{self.name}: no loaded member takes K = {k} (x in shared memory holds K <= {kmax})")
        return self.by_kw[k_split(m, k, self.epilogue, tuple(self.by_kw))]

    def free(self) -> None:
        """Release the stream-K member's workspaces."""
        if self.sk is not None:
            self.sk.free()

    def __call__(self, w: DeviceBuffer, x: DeviceBuffer, y: DeviceBuffer, n: int, k: int, cols: int, *,
                 r: DeviceBuffer | None = None, norm: "tuple[DeviceBuffer, float] | None" = None,
                 add: "Addend | None" = None, lo: int | None = None, stream: Any = None) -> None:
        """W is [n, k] in tile16-v1 (n = 2I for swiglu); x [cols, k], y (and r) [cols, n or I], contiguous bf16
        (`accumulate`: y fp32 [n], added to); `norm` = (weight bf16 [k], eps) for a `_n` family: x is RMS-normed
        while it is staged; `add` for a `_na` family (see Addend); `lo` for a `_lo4` family: W is a mixed stack
        whose first lo tiles are a Q4 image (`tiled.mixed_nbytes`)."""
        if self.sk is not None and not (self.xs_by_kw or self.by_kw):  # accumulate / _na: stream-K only
            self.sk(w, x, y, n, k, cols, r=r, norm=norm, add=add, lo=lo, stream=stream)
            return
        if lo is not None:
            raise LaunchError(f"{self.name}: lo= is for the stream-K `_lo4` families")
        m, args = gemv_args(self.name, self.cols, self.epilogue, self._weight_bytes, w, x, y, n, k, cols, r)
        pick = self.member(m, k)
        if isinstance(pick, GemvMmaSK):
            pick(w, x, y, n, k, cols, r=r, norm=norm, stream=stream)
            return
        args += norm_args(self.name, self.norm, norm, k)
        lk, outs = pick
        mf = lk.manifest
        if mf.config.get("xs") and k > mf.config["kmax"]:
            raise LaunchError(f"{lk.variant.name} takes K <= {mf.config['kmax']}, got {k}; use the family's "
                              "register-x members")
        launch(lk.kernel, (-(-m // outs), 1, 1), mf.block, lk.layout.pack(args), mf.smem, stream)


class GemvMmaSK:
    """Typed launcher of one stream-K member (same call as GemvMma). It owns one zeroed workspace per
    output buffer (the kernel leaves it zeroed), made on the first call for that buffer: make that
    call outside CUDA graph capture (the executor's eager warm-up step does)."""

    def __init__(self, loaded: "LoadedKernel"):
        c = loaded.manifest.config
        if not c.get("sk"):
            raise LaunchError(f"kernel {loaded.variant.name} is not a stream-K GEMV")
        self.loaded = loaded
        self.name = loaded.variant.name
        self.bits, self.group, self.cols, self.epilogue = c["bits"], c["group"], c["cols"], c["epilogue"]
        self.fmt = self._format(c)
        self.warps, self.ctas, self.kmax = c["warps"], c["ctas"], c["kmax"]
        self.norm, self.add, self.lo4 = bool(c.get("norm")), bool(c.get("add")), bool(c.get("lo4"))
        self.accumulate = self.epilogue == ACCUMULATE
        self._ws: dict[tuple[int, int], DeviceBuffer] = {}


    @staticmethod
    def _format(config: dict) -> str:
        return GemvMma._format(config)

    def _weight_bytes(self, n: int, k: int) -> int:
        """Bytes of the weight image of [n, k]."""
        return _tiled_bytes(self.fmt, n, k)

    def workspace(self, y: DeviceBuffer, nbytes: int) -> DeviceBuffer:
        from inferno.cuda.copy import memset_d8
        from inferno.cuda.memory import device_alloc

        key = (int(y.ptr), nbytes)
        ws = self._ws.get(key)
        if ws is None:
            ws = self._ws[key] = device_alloc(nbytes, f"{self.name} workspace")
            memset_d8(ws, 0)
        return ws

    def free(self) -> None:
        for ws in self._ws.values():
            ws.free()
        self._ws.clear()

    def grid(self, m: int, k: int) -> int:
        """CTAs of a launch for m outputs and K = k."""
        blocks = -(-m // 16) * (-(-k // 128))
        return max(1, min(self.loaded.sm_count * self.ctas, -(-blocks // (self.warps * SK_MIN_BLOCKS))))

    def __call__(self, w: DeviceBuffer, x: DeviceBuffer, y: DeviceBuffer, n: int, k: int, cols: int, *,
                 r: DeviceBuffer | None = None, norm: "tuple[DeviceBuffer, float] | None" = None,
                 add: "Addend | None" = None, lo: int | None = None, stream: Any = None) -> None:
        if k > self.kmax:
            raise LaunchError(f"{self.name} takes K <= {self.kmax}, got {k}; use the register-x family")
        if (add is not None) != self.add:
            raise LaunchError(f"kernel {self.name}: pass add= exactly for a `_na` family")
        if (lo is not None) != self.lo4:
            raise LaunchError(f"kernel {self.name}: pass lo= (the mixed stack's Q4 tiles) exactly for a `_lo4` family")
        epilogue = "plain" if self.accumulate else self.epilogue
        wbytes = self._weight_bytes if lo is None else (lambda n_, k_: mixed_nbytes(n_, k_, 16 * lo))
        m, args = gemv_args(self.name, self.cols, epilogue, wbytes, w, x, y, n, k, cols, r)
        if self.accumulate:  # y fp32: the sums go straight there, no workspace
            args[-1] = TensorArg(_buf(y, "y", self.name, cols * m * 4), (cols, m), (m,))
        else:
            nbytes = sk_workspace_bytes(m, n, self.cols)
            if self.loaded.manifest.config.get("probe") == "timeline":  # its stamps after the words (benchmark)
                nbytes += 8 + 8 * TIMELINE * self.grid(m, k) * self.warps
            args.append(TensorArg(self.workspace(y, nbytes).ptr, (nbytes // 4,)))
        args += norm_args(self.name, self.norm, norm, k)
        if add is not None:
            args += [TensorArg(_buf(add.s, "s", self.name, k * 4), (k,)),
                     TensorArg(_buf(add.xo, "xo", self.name, k * 2), (k,)),
                     TensorArg(_buf(add.z, "z", self.name, k * 4), (k,))]
        if lo is not None:
            args.append(int(lo))
        mf = self.loaded.manifest
        launch(self.loaded.kernel, (self.grid(m, k), 1, 1), mf.block, self.loaded.layout.pack(args), mf.smem, stream)


GemvMma.sk_cls = GemvMmaSK


@dataclass(frozen=True)
class Addend:
    """A residual deferred into a `_na` GEMV's x staging: x is bf16(x + s) (s fp32 [K], the sums an `accumulate`
    GEMV added); the launch writes that x to xo (bf16 [K]) and zeroes z (fp32 [K], the next sums), once."""

    s: DeviceBuffer
    xo: DeviceBuffer
    z: DeviceBuffer


def norm_args(name: str, has_norm: bool, norm: "tuple[DeviceBuffer, float] | None", k: int) -> list:
    """The checked (weight, eps) arguments of a `_n` member, [] otherwise."""
    if has_norm != (norm is not None):
        raise LaunchError(f"kernel {name}: pass norm=(weight, eps) exactly for a `_n` (RMSNorm folded) family")
    if norm is None:
        return []
    nw, eps = norm
    return [TensorArg(_buf(nw, "nw", name, k * 2), (k,)), float(eps)]


def family_members(name: str) -> list[str]:
    """Member names of a family name (its register-x K splits, and for T = 1 Q4-Q6 the xs and stream-K
    members; a `_n` family has only the latter, `_na` and `_acc` only stream-K), or [name] for a member name."""
    if name in _BY_NAME:
        return [name]
    fast = [v.name for v in GEMV_MMA_VARIANTS if v.name.startswith(name + "_") and
            (v.config.get("xs") or v.config.get("sk")) and _family_of(v) == name]
    regs = [] if name.endswith(("_n", "_na", "_acc", "_lo4")) else [f"{name}_k{kw}" for kw in KW]
    return regs + fast


def _family_of(v: Variant) -> str:
    c = v.config
    fmt = next(f for f, (_, b, g) in FORMATS.items() if (b, g) == (c["bits"], c["group"]))
    return variant_name(fmt, c["epilogue"], c["cols"], bool(c.get("norm")), bool(c.get("add"))) + (
        "_lo4" if c.get("lo4") else "")


def build(out_dir: str, archs: tuple[str, ...] = ("sm_90a",), names: tuple[str, ...] | None = None) -> None:
    """Compile the variants (all, or `names`: members or families) into out_dir/<arch>/; progress to stderr."""
    from pathlib import Path

    from inferno.kernels.build import build_all

    want = None if names is None else {nm for n in names for nm in family_members(n)}
    build_all([v for v in GEMV_MMA_VARIANTS if want is None or v.name in want], list(archs), Path(out_dir))


if __name__ == "__main__":
    import sys

    build(sys.argv[1], tuple(sys.argv[2].split(",")) if len(sys.argv) > 2 else ("sm_90a",),
          tuple(sys.argv[3].split(",")) if len(sys.argv) > 3 else None)
