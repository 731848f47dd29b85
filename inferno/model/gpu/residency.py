"""The residency plan: where every tensor the GPU executor touches lives, and how much it needs.

One plan per executor, built before any device call (so it is CPU-testable): the weights the
dense decode path reads (all device-resident for now; the FFN host offload will add a pinned-host
placement here), the sequence state (KV pages and GDN state slots) and the per-step workspace.
`require_fits` turns a plan that does not fit the GPU into one error naming what did not fit
and which flag helps.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from inferno.artifact.identities import ExpectedTensor
from inferno.cuda.errors import OutOfMemoryError
from inferno.cuda.memory import fmt_bytes
from inferno.errors import NotBuiltError, UsageError
from inferno.kernels.sample_variants import scratch_bytes
from inferno.model.config import ModelConfig

DEVICE = "device"
ALIGN = 256  # arena reservation alignment (cuMemAlloc granularity)
PAGE_TOKENS = 64  # tokens per KV page
HEADROOM = 256 * 2**20  # device memory left free for the driver, cubins and graphs
BF16, FP32, I32 = 2, 4, 4
MAX_PREFILL_CHUNK = 65535  # tokens per prefill chunk (the row kernels' grid limit)
STEP_HEADER = 4  # int32 words before the page table in the step buffer: token, position, slot, length

# How a weight is stored on the device:
PAYLOAD = "payload"  # the artifact bytes as they are (quantized GEMV payloads, BF16/FP32 vectors)
DEQUANT_BF16 = "bf16"  # dequantized to bf16 at load (the embedding table: the gather kernel reads bf16)
CONCAT = "concat"  # BF16 sources concatenated by rows (GDN a | b projections: one GEMM)
ROWS = "rows"  # a row range of one fused source, re-packed as its own matrix (fusion plan "nvfp4")
TILED = "tile16"  # a groupwise-int payload moved into tile16-v1 at load (inferno/kernels/tiled.py)
# Tiling policy: which groupwise-int GEMV matrices are kept in tile16-v1 for the tensor-core GEMV
# (and dequantized from it by prefill's `dequant_<fmt>_tiled`); the rest stay row-split for the
# CUDA-core GEMV. "head": only the output head (H200, 2026-11-29: the Q6 head 319.7 us vs 418.7; the
# per-layer Q4/Q5 shapes were 0.7-1.05x); "all": every matrix a decode GEMV reads.
TILING_MODES = ("head", "all")
TILING = "all"  # the default (H200, 2026-11-30: 27B decode 157.1 vs 121.3 tok/s); INFERNO_TILED overrides it
TILING_ENV = "INFERNO_TILED"
TILED_HEAD = frozenset({"text/output_head"})  # the matrices mode "head" tiles
# formats "all" leaves row-split: W8's CUDA-core GEMV streams 512-byte row runs at 70-80 % of copy at
# T = 1, ahead of its tensor-core GEMV (0.79-0.94x, docs/kernels-gemv-mma.md)
ROW_SPLIT_FORMATS = frozenset({"W8G32_F16S"})
FUSIONS = ("split", "nvfp4")  # fusion plans the GPU executor runs
# Merged input projections: fusion plan "split" stores a layer's input projections as two matrices (GDN
# query_key | value_z, attention query_key | gate_value); where both are tiled Q4-Q6 they are stacked
# by rows at load into one matrix in the wider format (inferno/model/gpu/merge.py), one GEMV per layer; a Q4 half
# of whole tiles over a Q5 one stays Q4 (a mixed stack: `Placement.q4_rows`).
# INFERNO_MERGE_PROJ=0 keeps them separate (read once, at plan time).
MERGE_ENV = "INFERNO_MERGE_PROJ"
MERGED_INPUTS = {"gdn": ("gdn/query_key_value_z", ("gdn/query_key", "gdn/value_z")),
                 "attention": ("attention/query_key_gate_value", ("attention/query_key", "attention/gate_value"))}
# GEMV formats besides the groupwise-int ones (gemv_nvfp4_variants, gemv_bf16_variants)
GEMV_FORMATS_EXTRA = ("NVFP4", "BF16")


# GEMV epilogue of each quantized matrix the decode path multiplies by, by device-name suffix
GEMV_EPILOGUES = {
    "gdn/query_key": "plain", "gdn/value_z": "plain", "attention/query_key": "plain",
    "attention/gate_value": "plain", "gdn/query_key_value_z": "plain", "attention/query_key_gate_value": "plain",
    "text/output_head": "plain", "gdn/output": "residual",
    "attention/output": "residual", "mlp/down": "residual", "mlp/gate_up": "swiglu",
}


def gemv_epilogue(name: str) -> str | None:
    """The GEMV epilogue of the weight called `name`, or None when no GEMV reads it."""
    return next((e for suffix, e in GEMV_EPILOGUES.items() if name.endswith(suffix)), None)


def gemv_kinds(placements, accumulating: frozenset[str] = frozenset()) -> set[tuple[str, str, bool]]:
    """(format, epilogue, tiled) of every GEMV the decode path launches for these placements; the weights in
    `accumulating` run the "accumulate" epilogue (deferred residuals: layers.DecodeProgram.accumulating)."""
    return {(p.fmt, "accumulate" if p.name in accumulating else gemv_epilogue(p.name), p.stored == TILED)
            for p in placements if gemv_epilogue(p.name) is not None}


def tiling_mode(mode: str | None = None) -> str:
    """The tiling policy in force: `mode` when given, else $INFERNO_TILED, else TILING."""
    value = mode if mode is not None else (os.environ.get(TILING_ENV, "").strip() or TILING)
    if value not in TILING_MODES:
        raise UsageError(f"unknown tiling policy {value!r}; set {TILING_ENV} to "
                         f"{' or '.join(repr(m) for m in TILING_MODES)}")
    return value


def merge_mode(merge: bool | None = None) -> bool:
    """Whether the input projections are merged: `merge` when given, else $INFERNO_MERGE_PROJ (default 1)."""
    if merge is not None:
        return merge
    value = os.environ.get(MERGE_ENV, "").strip() or "1"
    if value not in ("0", "1"):
        raise UsageError(f"{MERGE_ENV} must be 0 (separate input projections) or 1 (merged), got {value!r}")
    return value == "1"


def tiled_storage(name: str, fmt: str, mode: str) -> bool:
    """Whether policy `mode` keeps matrix `name` of format `fmt` in the tensor-core GEMV's layout
    (tile16-v1; NVFP4: tile16-nvfp4-v1): a matrix a decode GEMV reads: every Q4-Q6 and NVFP4 one and the
    head ("all"), or the output head only ("head")."""
    from inferno.kernels.gemv_variants import FORMATS

    if (fmt not in FORMATS and fmt != "NVFP4") or gemv_epilogue(name) is None:
        return False
    return name in TILED_HEAD or (mode == "all" and fmt not in ROW_SPLIT_FORMATS)


def align_up(n: int, a: int = ALIGN) -> int:
    return -(-n // a) * a


@dataclass(frozen=True)
class Placement:
    """One device weight: built from artifact tensors `sources`, `nbytes` on the device."""

    name: str
    sources: tuple[str, ...]
    fmt: str  # format on the device (a groupwise scheme, BF16 or FP32)
    shape: tuple[int, ...]
    stored: str
    nbytes: int
    where: str = DEVICE
    rows: tuple[int, int] | None = None  # ROWS: the source's row range [r0, r1)
    q4_rows: int = 0  # a mixed stack (merge.py): rows [0, q4_rows) held as a Q4 tile16-v1 image ahead of the rest

    @property
    def merged(self) -> bool:
        """Several groupwise-int sources stacked by rows (merged input projections) into one tiled matrix."""
        return self.stored == TILED and len(self.sources) > 1


@dataclass(frozen=True)
class KvSizing:
    """KV cache: per attention layer a pool of `n_pages` pages, each [2, Hkv, PAGE_TOKENS, head_dim] bf16."""

    layers: int
    n_kv_heads: int
    head_dim: int
    max_seqs: int
    max_context: int
    page_tokens: int = PAGE_TOKENS

    @property
    def pages_per_seq(self) -> int:
        return -(-self.max_context // self.page_tokens)

    @property
    def n_pages(self) -> int:
        return self.max_seqs * self.pages_per_seq

    @property
    def page_bytes(self) -> int:
        return 2 * self.n_kv_heads * self.page_tokens * self.head_dim * BF16

    @property
    def layer_bytes(self) -> int:
        return self.n_pages * self.page_bytes

    @property
    def bytes(self) -> int:
        return self.layers * align_up(self.layer_bytes)

    @property
    def bytes_per_token(self) -> int:
        """KV bytes one token of one sequence takes over all attention layers."""
        return self.layers * 2 * self.n_kv_heads * self.head_dim * BF16


@dataclass(frozen=True)
class GdnSizing:
    """GDN state slots: per GDN layer conv [slots, K-1, conv_dim] bf16 and recurrent [slots, Hv, dk, dv] fp32."""

    layers: int
    slots: int
    conv_dim: int
    conv_taps: int  # K - 1
    v_heads: int
    k_dim: int
    v_dim: int

    @property
    def conv_slot_bytes(self) -> int:
        return self.conv_taps * self.conv_dim * BF16

    @property
    def recurrent_slot_bytes(self) -> int:
        return self.v_heads * self.k_dim * self.v_dim * FP32

    @property
    def bytes(self) -> int:
        return self.layers * (align_up(self.slots * self.conv_slot_bytes) + align_up(self.slots * self.recurrent_slot_bytes))


def workspace_buffers(config: ModelConfig, pages_per_seq: int, splits: int, seqs: int = 1,
                      merged_attention: int = 0) -> dict[str, int]:
    """The per-step activation buffers of the decode path (one sequence), name -> bytes; and the
    device sampler's token counts of `seqs` sequences (int32 [seqs, vocab], a row per GDN slot).
    `merged_attention`: attention layers whose input projections are one matrix (one GEMV writes
    q | k | gate | v into mix_in); the others write q | k to mix_in and gate | v to gate_value."""
    c = config
    q_width = c.n_heads * c.head_dim
    kv_width = c.n_kv_heads * c.head_dim
    mix_in = c.conv_dim + c.gdn_value_width if c.gdn_layers else 0  # GDN: q | k | v | z
    separate = len(c.attention_layers) - merged_attention  # attention layers with a gate_value GEMV
    attn_in = (2 if merged_attention else 1) * (q_width + kv_width) if c.attention_layers else 0
    return {
        "step": (STEP_HEADER + pages_per_seq) * I32,  # token, position, slot, length, page table
        "x": c.hidden * BF16,  # residual stream (layer input and output)
        "x_mid": c.hidden * BF16,  # residual stream after the mixer
        "res_sums": 6 * c.hidden * FP32,  # deferred residual sums: mixer outputs, downs (layers.py: 2-3 each)
        "normed": c.hidden * BF16,
        "mix_in": max(mix_in, attn_in) * BF16,  # GDN q|k|v|z; attention q|k (merged: q|k|gate|v)
        # merged input projections' fp32 sums (accumulating input GEMVs): GDN q|k|v|z, attention q|k|gate|v
        "mix_sums": max(mix_in, attn_in if merged_attention else 0) * FP32 or ALIGN,
        "gate_value": (q_width + kv_width) * BF16 if separate else ALIGN,  # attention gate | v (separate)
        "ab": 2 * c.gdn_v_heads * BF16 if c.gdn_layers else ALIGN,
        "gdn_sync": c.gdn_k_heads * I32 if c.gdn_layers else ALIGN,  # the fused conv+step's q/k window counters
        "mix_out": max(c.gdn_value_width if c.gdn_layers else 0, q_width if c.attention_layers else 0) * BF16,
        "act": c.intermediate * BF16,
        "logits": c.vocab * BF16,
        "argmax": I32,  # greedy pick (device argmax of the logits)
        "sampled": seqs * I32,  # the device sampler's last token per sequence (row = GDN slot)
        "sample_scratch": scratch_bytes(c.vocab),  # the device sampler's per-slice candidates
        "sample_counts": seqs * c.vocab * I32,  # tokens generated per sequence (penalties), row = GDN slot
        # attention: q after norm + RoPE, split-K partials (q and gate are read where the GEMVs wrote them)
        "q": q_width * FP32 if c.attention_layers else ALIGN,
        "part_o": q_width * splits * FP32 if c.attention_layers else ALIGN,
        "part_lse": c.n_heads * splits * FP32 if c.attention_layers else ALIGN,
    }


PREFILL_DEQUANT = ("gdn/query_key", "gdn/value_z", "gdn/output", "attention/query_key", "attention/gate_value",
                   "gdn/query_key_value_z", "attention/query_key_gate_value", "attention/output", "mlp/gate_up",
                   "mlp/down")  # matrices prefill multiplies as bf16 GEMMs


def prefill_buffers(config: ModelConfig, chunk: int, placements: tuple[Placement, ...],
                    pages_per_seq: int) -> dict[str, int]:
    """The activation buffers of one prefill chunk of `chunk` tokens (inferno/model/gpu/prefill.py),
    name -> bytes; 'weight' is the bf16 scratch a quantized matrix is dequantized into before its
    GEMM (the largest one; a GDN layer's query_key and value_z, when not merged, share it as one
    [q|k|v|z] matrix)."""
    c, t = config, chunk
    q_width, kv_width = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
    shape = {p.name: p.shape for p in placements}
    sizes = [p.shape[0] * p.shape[1] for p in placements if p.fmt != "BF16" and p.name.endswith(PREFILL_DEQUANT)]
    for i in c.gdn_layers:  # both halves go to the scratch, whatever their format
        halves = [shape.get(f"text/layers/{i}/gdn/{n}") for n in ("query_key", "value_z")]
        if None not in halves:
            sizes.append((halves[0][0] + halves[1][0]) * halves[0][1])
    attn = bool(c.attention_layers)
    return {
        "inputs": (4 * t + pages_per_seq) * I32,  # ids, positions, KV rows, KV pages of the chunk; page table
        "x": t * c.hidden * BF16,
        "x_mid": t * c.hidden * BF16,
        "normed": t * c.hidden * BF16,
        "proj": t * c.hidden * BF16,  # output projection / down GEMM result before the residual add
        "mix_in": t * (c.conv_dim + c.gdn_value_width) * BF16 if c.gdn_layers else ALIGN,  # GDN q|k|v|z
        "ab": t * 2 * c.gdn_v_heads * BF16 if c.gdn_layers else ALIGN,
        "conv_out": t * c.conv_dim * BF16 if c.gdn_layers else ALIGN,
        "mix_out": t * max(c.gdn_value_width if c.gdn_layers else 0, q_width if attn else 0) * BF16,
        "q": t * q_width * BF16 if attn else ALIGN,  # attention: q, k, gate, v projections
        "k": t * kv_width * BF16 if attn else ALIGN,
        "gate": t * q_width * BF16 if attn else ALIGN,
        "v": t * kv_width * BF16 if attn else ALIGN,
        "qg": t * 2 * q_width * BF16 if attn else ALIGN,  # q per head in the prep kernel's [q | gate] layout
        "q32": t * q_width * FP32 if attn else ALIGN,  # q after norm + RoPE (fp32)
        "gate_up": t * 2 * c.intermediate * BF16,
        "act": t * c.intermediate * BF16,
        "weight": max(sizes, default=0) * BF16 or ALIGN,
    }


def attn_splits(max_context: int, n_kv_heads: int) -> int:
    """Split-K partitions of decode attention: fixed for the executor's life (one captured graph
    serves every length; unused splits exit at once), by the attention kernels' own rule."""
    from inferno.kernels.attn_variants import default_splits

    return default_splits(max_context, 1, n_kv_heads)


@dataclass(frozen=True)
class ResidencyPlan:
    """Everything the executor reserves on the device, with the sizes that decide whether it fits."""

    config: ModelConfig
    placements: tuple[Placement, ...]
    kv: KvSizing
    gdn: GdnSizing
    workspace: dict[str, int]
    attn_splits: int  # split-K partitions of decode attention
    prefill_chunk: int = 0  # tokens per prefill chunk (0: no prefill buffers)
    prefill: dict[str, int] = field(default_factory=dict)  # prefill activation buffers (prefill_buffers)
    tiling: str = TILING  # the tiling policy the placements follow (tiling_mode)
    merge: bool = True  # the merged-input-projections switch in force (merge_mode; `merged_layers` says where)

    @property
    def weight_bytes(self) -> int:
        return sum(align_up(p.nbytes) for p in self.placements if p.where == DEVICE)

    @property
    def state_bytes(self) -> int:
        return self.kv.bytes + self.gdn.bytes

    @property
    def workspace_bytes(self) -> int:
        return sum(align_up(n) for n in self.workspace.values())

    @property
    def prefill_bytes(self) -> int:
        return sum(align_up(n) for n in self.prefill.values())

    @property
    def arena_bytes(self) -> int:
        """The device arena's capacity: every reservation rounded up to ALIGN."""
        return self.weight_bytes + self.state_bytes + self.workspace_bytes + self.prefill_bytes

    def summary(self) -> str:
        merged = sum(p.merged for p in self.placements)
        return (f"weights {fmt_bytes(self.weight_bytes)} (tile16-v1: {self.tiling}; merged input projections: "
                f"{merged} of {self.config.n_layers} layers), KV cache {fmt_bytes(self.kv.bytes)} "
                f"({self.kv.max_seqs} sequences x {self.kv.max_context} tokens), GDN state "
                f"{fmt_bytes(self.gdn.bytes)} ({self.gdn.slots} slots), workspace {fmt_bytes(self.workspace_bytes)}, "
                f"prefill buffers {fmt_bytes(self.prefill_bytes)} ({self.prefill_chunk}-token chunks)")

    def require_fits(self, free: int) -> None:
        """Raise OutOfMemoryError naming what does not fit in `free` device bytes and what to change."""
        if self.arena_bytes + HEADROOM > free:
            raise self.oom_error(free)

    def oom_error(self, free: int) -> OutOfMemoryError:
        """The error for a plan that did not fit in `free` device bytes: what it needs, and which flag helps."""
        need = self.arena_bytes + HEADROOM
        fixed = self.weight_bytes + self.workspace_bytes + self.prefill_bytes + HEADROOM
        if self.weight_bytes + self.workspace_bytes + HEADROOM > free:
            hint = (f"the weights alone need {fmt_bytes(self.weight_bytes)}; FFN host offload is not built yet, "
                    "so use a GPU with more free memory")
        elif fixed > free:
            hint = (f"the prefill buffers for {self.prefill_chunk}-token chunks need "
                    f"{fmt_bytes(self.prefill_bytes)}; lower --prefill-chunk")
        else:
            per_seq = self.kv.bytes_per_token * self.kv.max_context + self.gdn.bytes // max(self.gdn.slots, 1)
            room = free - fixed
            seqs = room // per_seq if per_seq else 0
            ctx = ((room - self.gdn.bytes) // (self.kv.max_seqs * self.kv.bytes_per_token)
                   if self.kv.bytes_per_token else 0)
            hint = (f"the KV cache and GDN state need {fmt_bytes(self.state_bytes)}; lower --max-context "
                    f"(at most about {max(ctx, 0)} tokens fit for {self.kv.max_seqs} sequences) or "
                    f"--max-concurrency (about {seqs} sequences fit at {self.kv.max_context} tokens)")
        return OutOfMemoryError(
            f"the model does not fit on the GPU: it needs {fmt_bytes(need)} ({self.summary()}, plus "
            f"{fmt_bytes(HEADROOM)} headroom) but {fmt_bytes(free)} is free; {hint}",
            name="gpu executor", requested=need, used=0, capacity=self.arena_bytes, free=free)


# fusion plan "nvfp4": device matrix -> (fused artifact tensor, index of its row range in split_rows)
_FUSED_NVFP4 = {"attention/query_key": ("attention/query_key_gate_value", 0),
                "attention/gate_value": ("attention/query_key_gate_value", 1),
                "gdn/query_key": ("gdn/query_key_value_z", 0), "gdn/value_z": ("gdn/query_key_value_z", 1)}


def _second_half(stack_name: str) -> str:
    """The second matrix of a merged input projection (`MERGED_INPUTS`), e.g. 'gdn/value_z'."""
    return next(halves[1] for stack, halves in MERGED_INPUTS.values() if stack_name.endswith(stack))


def split_rows(config: ModelConfig, name: str) -> tuple[int, int]:
    """Row range [r0, r1) of device matrix `name` (a ROWS placement) in its fused source:
    attention [q, k | gate, v], GDN [q, k | v, z]."""
    c = config
    if "/attention/" in name:
        first, total = c.n_heads * c.head_dim + c.n_kv_heads * c.head_dim, 2 * (c.n_heads + c.n_kv_heads) * c.head_dim
    else:
        first, total = 2 * c.gdn_key_width, 2 * c.gdn_key_width + 2 * c.gdn_value_width
    half = _FUSED_NVFP4[name.split("/", 3)[3]][1]
    return (0, first) if half == 0 else (first, total)


def decode_weights(config: ModelConfig, fusion: str = "split", merged: frozenset[int] = frozenset(),
                   merge: bool = False) -> list[tuple[str, tuple[str, ...], str]]:
    """(device name, artifact sources, storage) of every weight the dense decode path reads, for the
    identity's fusion plan `fusion` ("nvfp4": the artifact's fused input projections kept as they are
    when `merge`, else split by rows); the input projections of layers `merged` (plan "split") are one
    TILED matrix of two sources (`MERGED_INPUTS`)."""
    out: list[tuple[str, tuple[str, ...], str]] = [("text/token_embedding", ("text/token_embedding",), DEQUANT_BF16)]
    for i, kind in enumerate(config.layer_types):
        p = f"text/layers/{i}/"
        names = ["input_norm", "post_attention_norm", "mlp/gate_up", "mlp/down"]
        stack, halves = MERGED_INPUTS["attention" if kind == "full_attention" else "gdn"]
        if kind == "full_attention":
            names += ["attention/query_key", "attention/gate_value", "attention/query_norm",
                      "attention/key_norm", "attention/output"]
        else:
            names += ["gdn/a_log", "gdn/dt_bias", "gdn/convolution", "gdn/query_key", "gdn/value_z",
                      "gdn/norm", "gdn/output"]
            out.append((p + "gdn/a_b_projection", (p + "gdn/a_projection", p + "gdn/b_projection"), CONCAT))
        for n in names:
            if i in merged and n in halves:
                if n == halves[0]:
                    out.append((p + stack, tuple(p + h for h in halves), TILED))
            elif fusion == "nvfp4" and n in _FUSED_NVFP4 and merge:
                if n == halves[0]:  # the fused tensor is the merged matrix (same name, same row order)
                    out.append((p + stack, (p + _FUSED_NVFP4[n][0],), PAYLOAD))
            elif fusion == "nvfp4" and n in _FUSED_NVFP4:
                out.append((p + n, (p + _FUSED_NVFP4[n][0],), ROWS))
            else:
                out.append((p + n, (p + n,), PAYLOAD))
    out += [("text/final_norm", ("text/final_norm",), PAYLOAD), ("text/output_head", ("text/output_head",), PAYLOAD)]
    return out


def merged_layers(config: ModelConfig, expected: dict[str, ExpectedTensor], fusion: str, tiling: str,
                  merge: bool) -> frozenset[int]:
    """The layers whose input projections are merged (`MERGED_INPUTS`): with `merge` on, in fusion plan
    "split", where both halves are Q4-Q6 matrices of one width that the tiling policy `tiling` tiles."""
    from inferno.model.gpu.merge import MERGEABLE

    if not merge or fusion != "split":
        return frozenset()
    out = set()
    for i, kind in enumerate(config.layer_types):
        halves = [expected.get(f"text/layers/{i}/{h}")
                  for h in MERGED_INPUTS["attention" if kind == "full_attention" else "gdn"][1]]
        if (None not in halves and all(e.format in MERGEABLE and tiled_storage(e.name, e.format, tiling) for e in halves)
                and len({e.shape[1] for e in halves}) == 1):
            out.add(i)
    return frozenset(out)


def check_supported(config: ModelConfig) -> None:
    """Refuse configs the first GPU executor does not run (NotBuiltError names the missing piece)."""
    if config.is_moe:
        raise NotBuiltError("the GPU executor runs dense Qwen3.5 models only for now (MoE is not built yet); "
                            "use --device cpu")
    if config.gdn_layers and (config.gdn_k_dim, config.gdn_v_dim) != (128, 128):
        raise NotBuiltError(f"the GPU GDN kernels need head dims 128/128, this model has "
                            f"{config.gdn_k_dim}/{config.gdn_v_dim}; use --device cpu")
    if config.attention_layers:
        from inferno.kernels.attn_variants import HEAD_DIM, PREP

        if (config.head_dim, config.rotary_dim) != (HEAD_DIM, PREP.config["rotary"]):
            raise NotBuiltError(f"the GPU attention kernels are built for head dim {HEAD_DIM} with "
                                f"{PREP.config['rotary']} rotary dims, this model has {config.head_dim} / "
                                f"{config.rotary_dim}; use --device cpu")
    if config.conv_kernel != 4:
        raise NotBuiltError(f"the GPU GDN conv kernel is built for kernel size 4, not {config.conv_kernel}; "
                            "use --device cpu")


def plan_residency(config: ModelConfig, expected: dict[str, ExpectedTensor], max_seqs: int,
                   max_context: int, fusion: str = "split", prefill_chunk: int = 1024,
                   tiling: str | None = None, merge: bool | None = None) -> ResidencyPlan:
    """The plan for `config` whose artifact tensors are `expected` (name -> inventory entry) in the
    identity's fusion plan `fusion`, with buffers for prefill chunks of `prefill_chunk` tokens,
    groupwise-int GEMV matrices stored by the tiling policy `tiling` (None: `tiling_mode()`) and the
    input projections merged where they can be when `merge` (None: `merge_mode()`)."""
    from inferno.artifact import formats
    from inferno.errors import ArtifactError
    from inferno.kernels.gemv_variants import FORMATS
    from inferno.kernels.tiled import mixed_nbytes, tiled_geometry
    from inferno.model.gpu.merge import merged_format, mixed_q4_rows

    check_supported(config)
    tiling, merge = tiling_mode(tiling), merge_mode(merge)
    if fusion not in FUSIONS:
        raise NotBuiltError(f"the GPU executor runs dense artifacts of fusion plans {', '.join(FUSIONS)} only "
                            f"for now; this artifact uses plan {fusion!r}; use --device cpu")
    if max_seqs < 1 or max_context < 1:
        raise UsageError(f"max_seqs and max_context must be >= 1, got {max_seqs} and {max_context}")
    if not 1 <= prefill_chunk <= MAX_PREFILL_CHUNK:
        raise UsageError(f"--prefill-chunk must be 1..{MAX_PREFILL_CHUNK} tokens, got {prefill_chunk}")
    placements = []
    merged = merged_layers(config, expected, fusion, tiling, merge)
    for name, sources, stored in decode_weights(config, fusion, merged, merge):
        missing = [s for s in sources if s not in expected]
        if missing:
            raise ArtifactError(f"the artifact has no tensor {missing[0]}; it is not a dense Qwen3.5 "
                                "artifact this executor can run")
        src = [expected[s] for s in sources]
        rows, q4_rows = None, 0
        if stored == DEQUANT_BF16:
            fmt, shape = "BF16", src[0].shape
            nbytes = int(shape[0]) * int(shape[1]) * BF16
        elif stored == CONCAT:
            if any(e.format != "BF16" for e in src):
                raise ArtifactError(f"{name}: expected BF16 sources, got {[e.format for e in src]}")
            fmt, shape = "BF16", (sum(e.shape[0] for e in src), src[0].shape[1])
            nbytes = shape[0] * shape[1] * BF16
        elif stored == TILED:  # merged input projections: the halves stacked by rows, in the wider format
            fmt, shape = merged_format([e.format for e in src]), (sum(e.shape[0] for e in src), src[0].shape[1])
            q4_rows = mixed_q4_rows([e.format for e in src], [e.shape for e in src])  # its Q4 rows kept as Q4
            nbytes = mixed_nbytes(*shape, q4_rows) if q4_rows else tiled_geometry(fmt, *shape).nbytes
        else:
            e = src[0]
            fmt, shape = e.format, e.shape
            rows = split_rows(config, name) if stored == ROWS else None
            if rows is not None:
                shape = (rows[1] - rows[0], e.shape[1])
                if rows[1] > e.shape[0] or (fmt == "NVFP4" and (rows[0] % 128 or rows[1] % 128)):
                    raise NotBuiltError(f"{name}: rows {rows[0]}..{rows[1]} of the fused {e.name} {list(e.shape)} "
                                        f"({fmt}) cannot be split off on load; use --device cpu")
            elif name.endswith(tuple(stack for stack, _ in MERGED_INPUTS.values())):  # a fused tensor as it is
                want = split_rows(config, name.rsplit("/", 2)[0] + "/" + _second_half(name))[1]
                if e.shape[0] != want:
                    raise NotBuiltError(f"{name}: the fused {e.name} has {e.shape[0]} rows, the model's input "
                                        f"projections need {want}; use --device cpu")
            if gemv_epilogue(name) is not None and fmt not in FORMATS and fmt not in GEMV_FORMATS_EXTRA:
                raise NotBuiltError(f"the GPU executor has no GEMV kernel for {fmt} weights ({name}) yet; "
                                    "use --device cpu")
            nbytes = formats.packed_nbytes(fmt, e.layout, tuple(shape))
            if stored == PAYLOAD and tiled_storage(name, fmt, tiling):
                stored, nbytes = TILED, tiled_geometry(fmt, *shape).nbytes
        placements.append(Placement(name, sources, fmt, tuple(int(d) for d in shape), stored, int(nbytes),
                                    rows=rows, q4_rows=q4_rows))
    kv = KvSizing(len(config.attention_layers), config.n_kv_heads, config.head_dim, max_seqs, max_context)
    gdn = GdnSizing(len(config.gdn_layers), max_seqs, config.conv_dim, config.conv_kernel - 1,
                    config.gdn_v_heads, config.gdn_k_dim, config.gdn_v_dim)
    splits = attn_splits(max_context, config.n_kv_heads) if config.attention_layers else 1
    placements_t = tuple(placements)
    one_matrix = {p.name for p in placements_t}  # attention layers whose input projections are one matrix
    merged_attention = sum(f"text/layers/{i}/{MERGED_INPUTS['attention'][0]}" in one_matrix
                           for i in config.attention_layers)
    workspace = workspace_buffers(config, kv.pages_per_seq, splits, max_seqs, merged_attention)
    return ResidencyPlan(config, placements_t, kv, gdn, workspace, splits, prefill_chunk,
                         prefill_buffers(config, prefill_chunk, placements_t, kv.pages_per_seq), tiling, merge)
