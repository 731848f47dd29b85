"""Chunked prefill: the launch sequence of T prompt tokens of one sequence (`PrefillProgram`), and its
CUDA operations (`CudaPrefillOps`).

One chunk (T <= the executor's `prefill_chunk`) runs through every layer as row-parallel work, with
X the residual stream [T, hidden] (bf16):

    X = embedding(ids); N = rmsnorm(X, input_norm[0])
    GDN:   W = bf16(Wqk ; Wvz) (dequantised into the weight scratch: the merged matrix at once, or its
           two halves, or a mixed stack's two images); [q|k|v|z] = N W^T (one GEMM);
           [a|b] = N Wab^T; conv prefill (conv state of the slot) over the chunk; chunked delta rule
           (fp32 state of the slot) + gated RMSNorm -> M
    attn:  q, k = N Wqk^T; gate, v = N Wgv^T (GEMMs over row ranges of the dequantised merged
           [Wqk; Wgv], or of each half); q copied per head into the prep kernel's [q | gate]
           rows; q/k norm + RoPE + K/V append for T tokens; causal flash attention over the cached
           prefix and the chunk, times sigmoid(gate) -> M
    P = M Wo^T;  X_mid = X + P, N = rmsnorm(X_mid, post_attention_norm)   (add_rmsnorm)
    G = N Wgu^T; A = silu(G[:, :I]) * G[:, I:]; P = A Wdown^T
    X = X_mid + P, N = rmsnorm(X, next layer's input_norm)              (add_rmsnorm)

A quantized matrix is dequantised into one bf16 scratch (sized for the largest) right before its
GEMM, by the dequant kernel of its device storage (the artifact payload, or the tile16-v1 image of a
groupwise-int matrix the tiling policy tiles: `DeviceTensor.tiled`). After the mixer of the last
layer only the last token is carried on: its FFN and the final norm run on one row, writing the
decode workspace's `normed`, so the decode head (GEMV, argmax) turns it into logits. Launches are
eager (no CUDA graph): a chunk's shapes vary.

The attention prep kernel appends K/V at row `lens[b] - 1` of page `page_table[b, (lens[b]-1) // 64]`
for each batch lane b; prefill gives each token its own lane with a one-entry page table (the page
of its position) and lens = position % 64 + 1, so T tokens of one sequence are one prep launch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from inferno.cuda.memory import DeviceBuffer
from inferno.errors import NotBuiltError
from inferno.model.config import ModelConfig
from inferno.model.gpu.ops import AttnGeometry, CudaOps, Ops
from inferno.model.gpu.residency import BF16, I32, MERGED_INPUTS, PAGE_TOKENS, PREFILL_DEQUANT, TILED, ResidencyPlan
from inferno.model.gpu.state import DeviceStates, GpuState
from inferno.model.gpu.weights import DeviceTensor


class PrefillOps(Protocol):
    """The row-parallel kernels of a prefill chunk (one sequence); queued on the decode ops' stream."""

    def embed_rows(self, ids: DeviceBuffer, table: DeviceBuffer, out: DeviceBuffer, tokens: int, vocab: int,
                   hidden: int) -> None: ...
    def rmsnorm_rows(self, x: DeviceBuffer, w: DeviceBuffer, y: DeviceBuffer, rows: int, n: int,
                     eps: float) -> None: ...
    def add_rmsnorm_rows(self, x: DeviceBuffer, r: DeviceBuffer, w: DeviceBuffer, y: DeviceBuffer, h: DeviceBuffer,
                         rows: int, n: int, eps: float) -> None: ...  # h = x + r; y = rmsnorm(h)
    def dequant(self, fmt: str, w: DeviceBuffer, out: DeviceBuffer, n: int, k: int,
                tiled: bool = False) -> None: ...  # tiled: w is a groupwise-int matrix's tile16-v1 image
    def gemm(self, a: DeviceBuffer, b: DeviceBuffer, c: DeviceBuffer, m: int, n: int, k: int) -> None: ...
    def silu_mul(self, gu: DeviceBuffer, out: DeviceBuffer, rows: int, inter: int) -> None: ...
    def gdn_conv_rows(self, x: DeviceBuffer, conv_state: DeviceBuffer, conv_w: DeviceBuffer, out: DeviceBuffer,
                      tokens: int, channels: int, n_slots: int, slot: int, x_stride: int) -> None: ...
    def gdn_chunk(self, qkv: DeviceBuffer, z: DeviceBuffer, a: DeviceBuffer, b: DeviceBuffer, a_log: DeviceBuffer,
                  dt_bias: DeviceBuffer, norm_w: DeviceBuffer, state: DeviceBuffer, out: DeviceBuffer, tokens: int,
                  k_heads: int, v_heads: int, n_slots: int, slot: int, eps: float, z_stride: int,
                  ab_stride: int) -> None: ...
    def attn_prep_rows(self, qg: DeviceBuffer, k: DeviceBuffer, v: DeviceBuffer, q_norm: DeviceBuffer,
                       k_norm: DeviceBuffer, positions: DeviceBuffer, lens: DeviceBuffer, tables: DeviceBuffer,
                       kv: DeviceBuffer, q: DeviceBuffer, g: AttnGeometry, tokens: int) -> None: ...
    def attn_prefill(self, q: DeviceBuffer, gate: DeviceBuffer, kv: DeviceBuffer, pages: DeviceBuffer,
                     out: DeviceBuffer, tokens: int, prefix: int, g: AttnGeometry) -> None: ...


def prefill_formats(plan: ResidencyPlan) -> set[tuple[str, bool]]:
    """(format, tiled) of the weights prefill dequantises (one dequant kernel each; a mixed stack: both of its
    images' formats)."""
    from inferno.kernels.tiled import MIXED_HIGH, MIXED_LOW

    out: set[tuple[str, bool]] = set()
    for p in plan.placements:
        if p.fmt != "BF16" and p.name.endswith(PREFILL_DEQUANT):
            out |= {(MIXED_LOW, True), (MIXED_HIGH, True)} if p.q4_rows else {(p.fmt, p.stored == TILED)}
    return out


class CudaPrefillOps:
    """`PrefillOps` on the GPU of `ops` (its stream): E's row kernels, dequant + GEMM, GDN and attention
    prefill kernels, all loaded here so a missing one fails at start-up."""

    def __init__(self, ops: CudaOps, config: ModelConfig, formats: set[tuple[str, bool]]):
        from inferno.kernels import launchers as L
        from inferno.kernels.cache import load
        from inferno.kernels.prefill_variants import (
            DEQUANT_FORMATS, DEQUANT_TILED, AttnPrefill, Dequant, prefill_variant,
        )
        from inferno.kernels.registry import get, variants

        self.ops, dev = ops, ops.device
        norms = {op: sorted((v for v in variants(dev.arch) if v.op == op),
                            key=lambda v: v.config["threads_per_row"] * v.config["chunks"])
                 for op in ("rmsnorm", "add_rmsnorm")}
        fits = {op: [v for v in vs if v.config["threads_per_row"] * v.config["chunks"] * 8 >= config.hidden]
                for op, vs in norms.items()}
        for op, vs in fits.items():
            if not vs:
                raise _missing(f"{op} for width {config.hidden}", "inferno/kernels/registry.py",
                               "has no variant that wide")
        self._rmsnorm = L.RMSNorm(load(fits["rmsnorm"][0], dev))
        self._add_rmsnorm = L.AddRMSNorm(load(fits["add_rmsnorm"][0], dev))
        self._embedding = L.Embedding(load(get("embedding"), dev))
        self._silu_mul = L.SiluMul(load(get("silu_mul"), dev))
        self._gemm_simt = L.Gemm(load(get("gemm_simt"), dev))
        wgmma = get("gemm_wgmma")
        self._gemm_tc = L.Gemm(load(wgmma, dev)) if dev.arch in wgmma.archs else None
        self._dequant: dict[tuple[str, bool], Dequant] = {}
        for fmt, tiled in sorted(formats):
            names = DEQUANT_TILED if tiled else DEQUANT_FORMATS
            if fmt not in names:
                raise _missing(f"dequant for {fmt}{' in tile16-v1' if tiled else ''}",
                               "inferno/kernels/prefill_variants.py", "does not exist")
            self._dequant[fmt, tiled] = Dequant(load(prefill_variant(names[fmt]), dev))
        if config.gdn_layers:
            from inferno.kernels.gdn_prefill_variants import GDN_PREFILL_VARIANTS, GdnChunk, GdnConvPrefill

            by_op = {v.op: v for v in GDN_PREFILL_VARIANTS}
            self._conv = GdnConvPrefill(load(by_op["gdn_conv_prefill"], dev))
            self._chunk = GdnChunk(load(by_op["gdn_chunk"], dev))
        if config.attention_layers:
            from inferno.kernels import attn_variants as A
            from inferno.kernels.prefill_variants import GQA_GROUPS

            group = config.n_heads // config.n_kv_heads
            if group not in GQA_GROUPS:
                raise _missing(f"attn_prefill_g{group}_qf32", "inferno/kernels/prefill_variants.py",
                               f"has no variant for {group} query heads per kv head (groups: {GQA_GROUPS})")
            self._prep = A.AttnQkPrep(load(A.PREP, dev))
            self._attn = AttnPrefill(load(prefill_variant(f"attn_prefill_g{group}_qf32"), dev))

    @property
    def stream(self) -> Any:
        return self.ops.stream

    def embed_rows(self, ids, table, out, tokens, vocab, hidden) -> None:
        self._embedding(ids, table, out, tokens, vocab, hidden, stream=self.stream)

    def rmsnorm_rows(self, x, w, y, rows, n, eps) -> None:
        self._rmsnorm(x, w, y, rows, n, eps, stream=self.stream)

    def add_rmsnorm_rows(self, x, r, w, y, h, rows, n, eps) -> None:
        self._add_rmsnorm(x, r, w, y, h, rows, n, eps, stream=self.stream)

    def dequant(self, fmt, w, out, n, k, tiled=False) -> None:
        self._dequant[fmt, tiled](w, out, n, k, stream=self.stream)

    def gemm(self, a, b, c, m, n, k) -> None:
        tc = self._gemm_tc is not None and n % 8 == 0 and k % 8 == 0
        (self._gemm_tc if tc else self._gemm_simt)(a, b, c, m, n, k, stream=self.stream)

    def silu_mul(self, gu, out, rows, inter) -> None:
        self._silu_mul(gu, out, rows, inter, stream=self.stream)

    def gdn_conv_rows(self, x, conv_state, conv_w, out, tokens, channels, n_slots, slot, x_stride) -> None:
        self._conv(x, conv_state, conv_w, out, tokens, channels, n_slots, slot, x_stride=x_stride, stream=self.stream)

    def gdn_chunk(self, qkv, z, a, b, a_log, dt_bias, norm_w, state, out, tokens, k_heads, v_heads, n_slots, slot,
                  eps, z_stride, ab_stride) -> None:
        self._chunk(qkv, z, a, b, a_log, dt_bias, norm_w, state, out, tokens, k_heads, v_heads, n_slots, slot, eps,
                    z_stride=z_stride, a_stride=ab_stride, b_stride=ab_stride, stream=self.stream)

    def attn_prep_rows(self, qg, k, v, q_norm, k_norm, positions, lens, tables, kv, q, g, tokens) -> None:
        self._prep(qg, k, v, q_norm, k_norm, positions, lens, tables, kv, q, batch=tokens, n_heads=g.n_heads,
                   n_kv_heads=g.n_kv_heads, table_width=1, eps=g.eps, rope_theta=g.rope_theta, stream=self.stream)

    def attn_prefill(self, q, gate, kv, pages, out, tokens, prefix, g) -> None:
        self._attn(q, gate, kv, pages, out, tokens, g.n_heads, prefix, g.n_pages, g.head_dim ** -0.5,
                   stream=self.stream)


def _missing(kernel: str, owner: str, why: str) -> NotBuiltError:
    return NotBuiltError(f"GPU prefill needs the {kernel} kernel ({owner}), which {why}; "
                         "run with --device cpu until it is built")


class PrefillProgram:
    """Buffers and launch sequence of one prefill chunk of one sequence (see the module docstring).

    `ops` is the decode ops (memory, copies), `pops` the prefill kernels (the same object when
    emulated); `ws` the decode workspace whose `normed` receives the last token's final norm."""

    def __init__(self, ops: Ops, pops: PrefillOps, config: ModelConfig, weights: dict[str, DeviceTensor],
                 states: DeviceStates, plan: ResidencyPlan, attn: AttnGeometry, ws: dict[str, DeviceBuffer]):
        self.ops, self.pops, self.c, self.w, self.states, self.attn = ops, pops, config, weights, states, attn
        self.chunk = plan.prefill_chunk
        self.decode_normed = ws["normed"]
        self.n_slots = plan.gdn.slots
        self.pages_per_seq = plan.kv.pages_per_seq
        self.buf: dict[str, DeviceBuffer] = {name: ops.alloc(f"prefill/{name}", n) for name, n in plan.prefill.items()}
        t, inputs = self.chunk, self.buf["inputs"]
        self.ids, self.positions, self.lens, self.tables = (inputs.view(j * t * I32, t * I32, f"prefill/{name}")
                                                            for j, name in enumerate(("ids", "positions", "lens",
                                                                                      "tables")))
        self.pages = inputs.view(4 * t * I32, self.pages_per_seq * I32, "prefill/pages")
        self._host: list[np.ndarray] = []  # input records queued since the last synchronize

    def run(self, tokens: np.ndarray, st: GpuState, trace: Callable[[int], None] | None = None) -> None:
        """Append `tokens` (1..chunk) to `st` (its pages already reserved); the last token's final norm
        lands in the decode workspace's `normed`. `trace(i)` after layer i (debugging): buf['x'] row
        T - 1 then holds the last token's output of the layer (every row but in the last layer) and
        buf['mix_out'] its mixer output before the output projection (every row)."""
        c, b, pops, w = self.c, self.buf, self.pops, self.w
        t = len(tokens)
        if not 1 <= t <= self.chunk:
            raise AssertionError(f"prefill chunk of {t} tokens; the program holds 1..{self.chunk}")
        self._write_inputs(tokens, st)
        pops.embed_rows(self.ids, w["text/token_embedding"].buf, b["x"], t, c.vocab, c.hidden)
        pops.rmsnorm_rows(b["x"], w["text/layers/0/input_norm"].buf, b["normed"], t, c.hidden, c.rms_eps)
        last = c.n_layers - 1
        for i, kind in enumerate(c.layer_types):
            p = f"text/layers/{i}/"
            if kind == "full_attention":
                self._attention(i, p, t, st)
            else:
                self._gdn(i, p, t, st)
            r0, rows = (t - 1, 1) if i == last else (0, t)  # the last layer carries only the last token on
            out = w[p + ("attention/output" if kind == "full_attention" else "gdn/output")]
            self._linear(out, self._rows(b["mix_out"], out.shape[1], r0, rows),
                         self._rows(b["proj"], c.hidden, 0, rows), rows)
            x, x_mid, normed = (self._rows(b[n], c.hidden, r0, rows) for n in ("x", "x_mid", "normed"))
            pops.add_rmsnorm_rows(self._rows(b["proj"], c.hidden, 0, rows), x, w[p + "post_attention_norm"].buf,
                                  normed, x_mid, rows, c.hidden, c.rms_eps)
            gu, down = w[p + "mlp/gate_up"], w[p + "mlp/down"]
            self._linear(gu, normed, b["gate_up"], rows)
            pops.silu_mul(b["gate_up"], b["act"], rows, c.intermediate)
            self._linear(down, b["act"], b["proj"], rows)
            nxt, y = ((w["text/final_norm"], self.decode_normed) if i == last
                      else (w[f"text/layers/{i + 1}/input_norm"], normed))
            pops.add_rmsnorm_rows(self._rows(b["proj"], c.hidden, 0, rows), x_mid, nxt.buf, y, x, rows, c.hidden,
                                  c.rms_eps)
            if trace is not None:
                trace(i)
        st.position += t

    def synchronized(self) -> None:
        """The host input records may be reused (the caller synchronized the stream)."""
        self._host.clear()

    # ---- pieces ------------------------------------------------------------------------------------
    @staticmethod
    def _rows(buf: DeviceBuffer, width: int, r0: int, rows: int) -> DeviceBuffer:
        """Rows [r0, r0 + rows) of a bf16 [*, width] buffer."""
        return buf.view(r0 * width * BF16, rows * width * BF16)

    def _write_inputs(self, tokens: np.ndarray, st: GpuState) -> None:
        t, chunk = len(tokens), self.chunk
        pos = st.position + np.arange(t, dtype=np.int64)
        rec = np.zeros(4 * chunk + self.pages_per_seq, np.int32)
        pages = np.asarray(st.pages, np.int32)
        rec[:t] = tokens
        rec[chunk:chunk + t] = pos
        rec[2 * chunk:2 * chunk + t] = pos % PAGE_TOKENS + 1
        rec[3 * chunk:3 * chunk + t] = pages[pos // PAGE_TOKENS]
        rec[4 * chunk:4 * chunk + len(pages)] = pages
        self._host.append(rec)  # kept until the stream is synchronized (the copy is queued)
        self.ops.write(self.buf["inputs"], rec)

    def _weight(self, wt: DeviceTensor, out: DeviceBuffer | None = None) -> DeviceBuffer:
        """`wt` as bf16 [n, k]: its own buffer when stored bf16, else dequantised into `out` (default:
        the start of the weight scratch)."""
        n, k = wt.shape
        if out is None:
            if wt.fmt == "BF16":
                return wt.buf
            out = self.buf["weight"]
        if wt.fmt == "BF16":
            self.ops.copy2d(out, k * BF16, wt.buf, k * BF16, k * BF16, n)
        elif wt.q4_rows:  # a mixed stack (merge.py): each of its two images into its rows
            from inferno.model.gpu.merge import mixed_parts

            for fmt, row0, rows, offset, size in mixed_parts(n, k, wt.q4_rows):
                self.pops.dequant(fmt, wt.buf.view(offset, size), out.view(row0 * k * BF16, rows * k * BF16), rows,
                                  k, tiled=True)
        else:
            self.pops.dequant(wt.fmt, wt.buf, out, n, k, tiled=wt.tiled)
        return out

    def _linear(self, wt: DeviceTensor, x: DeviceBuffer, y: DeviceBuffer, rows: int) -> None:
        """y [rows, n] = x [rows, k] @ W^T."""
        n, k = wt.shape
        self.pops.gemm(x, self._weight(wt), y, rows, n, k)

    def _gdn(self, i: int, p: str, t: int, st: GpuState) -> None:
        c, b, pops, w = self.c, self.buf, self.pops, self.w
        kw, vw, hv = c.gdn_key_width, c.gdn_value_width, c.gdn_v_heads
        ab, merged = w[p + "gdn/a_b_projection"], w.get(p + MERGED_INPUTS["gdn"][0])
        scratch, row = b["weight"], c.hidden * BF16
        if merged is not None:
            self._weight(merged, scratch)
        else:
            self._weight(w[p + "gdn/query_key"], scratch)
            self._weight(w[p + "gdn/value_z"], scratch.view(2 * kw * row, scratch.nbytes - 2 * kw * row))
        width = c.conv_dim + vw  # q | k | v | z
        pops.gemm(b["normed"], scratch, b["mix_in"], t, width, c.hidden)
        pops.gemm(b["normed"], self._weight(ab), b["ab"], t, 2 * hv, c.hidden)
        mix = b["mix_in"]
        pops.gdn_conv_rows(mix, self.states.conv[i], w[p + "gdn/convolution"].buf, b["conv_out"], t, c.conv_dim,
                           self.n_slots, st.slot, width)
        z = mix.view(c.conv_dim * BF16, mix.nbytes - c.conv_dim * BF16)
        pops.gdn_chunk(b["conv_out"], z, b["ab"], b["ab"].view(hv * BF16, b["ab"].nbytes - hv * BF16),
                       w[p + "gdn/a_log"].buf, w[p + "gdn/dt_bias"].buf, w[p + "gdn/norm"].buf,
                       self.states.recurrent[i], b["mix_out"], t, c.gdn_k_heads, hv, self.n_slots, st.slot, c.rms_eps,
                       width, 2 * hv)

    def _attention(self, i: int, p: str, t: int, st: GpuState) -> None:
        c, b, pops, w, g = self.c, self.buf, self.pops, self.w, self.attn
        d = c.head_dim
        qw, kvw, row = c.n_heads * d, c.n_kv_heads * d, c.hidden * BF16

        def project(m: DeviceBuffer, first: str, second: str) -> None:  # m: bf16 rows [qw | kvw] of the input
            pops.gemm(b["normed"], m, b[first], t, qw, c.hidden)
            pops.gemm(b["normed"], m.view(qw * row, kvw * row), b[second], t, kvw, c.hidden)

        merged = w.get(p + MERGED_INPUTS["attention"][0])
        if merged is not None:  # rows [q | k | gate | v] of one dequantised matrix
            m = self._weight(merged)
            project(m, "q", "k")
            project(m.view((qw + kvw) * row, (qw + kvw) * row), "gate", "v")
        else:  # each half in turn through the scratch
            project(self._weight(w[p + "attention/query_key"]), "q", "k")
            project(self._weight(w[p + "attention/gate_value"]), "gate", "v")
        # per head [q_h | gate_h] rows of 2d values: the prep kernel's layout (it reads only the q halves)
        self.ops.copy2d(b["qg"], 2 * d * BF16, b["q"], d * BF16, d * BF16, t * c.n_heads)
        kv = self.states.kv[i]
        pops.attn_prep_rows(b["qg"], b["k"], b["v"], w[p + "attention/query_norm"].buf, w[p + "attention/key_norm"].buf,
                            self.positions, self.lens, self.tables, kv, b["q32"], g, t)
        pops.attn_prefill(b["q32"], b["gate"], kv, self.pages, b["mix_out"], t, st.position, g)
