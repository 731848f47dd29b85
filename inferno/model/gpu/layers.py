"""The launch sequence of one decode token (batch 1), written against `Ops`.

Per layer, with x the residual stream (bf16) and `normed` the norm output (computed by the GEMVs
that read it while they stage x, when every one of them can: `Ops.folds_norm`; else one rmsnorm
launch into ws['normed']):

    normed = rmsnorm(x, input_norm)
    GDN:   [q|k|v|z] = [Wqk; Wvz] normed (one buffer: q|k|v is the conv input, z after it; one GEMV
           of the merged matrix, or two: `residency.MERGED_INPUTS`, $INFERNO_MERGE_PROJ)
           [a|b] = Wab normed (bf16 GEMV, on a side branch); conv + SiLU (conv state of the slot);
           fused GDN step (gates, l2norm, delta rule on the fp32 state of the slot, gated RMSNorm)
           -> mix_out
    attn:  [q|k|gate|v] = [Wqk; Wgv] normed (merged: one GEMV into mix_in; else q|k into mix_in and
           gate|v into gate_value); q/k norm + RoPE + K/V append to the paged cache (q, k, v read
           where the GEMVs wrote them); split-K decode attention + combine with the sigmoid gate
           -> mix_out (`Ops.attention`: on the GPU the prep runs inside the decode kernel)
    x_mid  = x + Wo mix_out                         (GEMV, residual epilogue)
    normed = rmsnorm(x_mid, post_attention_norm)
    act    = silu(Wg normed) * (Wu normed)           (GEMV, fused SwiGLU epilogue)
    x      = x_mid + Wdown act                       (GEMV, residual epilogue)

Deferred residuals (`Ops.defers_residual`, per chain: every layer, or none): the mixer output GEMV only
adds its fp32 sums into s_i (`accumulate`: no end-of-launch flush) and the gate_up GEMV stages
x_mid = bf16(x + s_i) itself: it writes x_mid (for down) and zeroes s_{i+1}, the next layer's sums. Likewise
down (layers 0 .. L-2, merged input projections) accumulates into d_i and layer i+1's input GEMV stages
x = bf16(x_mid + d_i), writes x and zeroes d_{i+1} (its a|b GEMV on the side branch reads x_mid + d_i too).
The sums of a chain cycle through 2 buffers (3 when its length is odd), so no launch zeroes what it reads.
The merged input GEMVs accumulate into ws['mix_sums'] too (`Ops.accumulates_inputs`, per mixer kind): the GDN
q|k|v|z sums are read by gdn_conv_step, the attention q|k|gate|v sums by the attention decode kernel and its
combine (rounded to bf16, as the GEMV's epilogue would), which zero them.

then `normed = rmsnorm(x, final_norm)` and the head GEMV writes bf16 logits. The per-step inputs
(token, position, GDN slot, length, page table) are read from the device `step` buffer, so the
same launches serve every step and can be captured once into a CUDA graph.
"""

from __future__ import annotations

from collections.abc import Callable

from inferno.cuda.memory import DeviceBuffer
from inferno.kernels.gemv_mma_variants import ACCUMULATE, Addend
from inferno.model.config import ModelConfig
from inferno.model.gpu.ops import AttnGeometry, Norm, Ops
from inferno.model.gpu.residency import BF16, FP32, I32, MERGED_INPUTS, STEP_HEADER, ResidencyPlan
from inferno.model.gpu.state import DeviceStates
from inferno.model.gpu.weights import DeviceTensor


class DecodeProgram:
    """Buffers and launch sequence of one decode token for one sequence."""

    def __init__(self, ops: Ops, config: ModelConfig, weights: dict[str, DeviceTensor], states: DeviceStates,
                 plan: ResidencyPlan):
        self.ops, self.c, self.w, self.states = ops, config, weights, states
        self.ws: dict[str, DeviceBuffer] = {name: ops.alloc(f"ws/{name}", n) for name, n in plan.workspace.items()}
        step = self.step_buffer = self.ws["step"]
        self.pages_per_seq = plan.kv.pages_per_seq
        self.ids = step.view(0, I32, "step/token")
        self.positions = step.view(I32, I32, "step/position")
        self.slots = step.view(2 * I32, I32, "step/slot")
        self.lens = step.view(3 * I32, I32, "step/length")
        self.page_table = step.view(STEP_HEADER * I32, self.pages_per_seq * I32, "step/page_table")
        c = config
        self.attn = AttnGeometry(c.n_heads, c.n_kv_heads, c.head_dim, c.rotary_dim, c.rope_theta, c.rms_eps,
                                 plan.kv.pages_per_seq, plan.kv.n_pages, plan.attn_splits)
        self.n_slots = plan.gdn.slots
        ops.zero(self.ws["gdn_sync"])  # the fused conv+step leaves its counters at zero after every call
        n = c.n_layers
        self.out_sums = self._chain([(self._mixer_output(i), [self._reader(f"text/layers/{i}/mlp/gate_up", "swiglu")])
                                     for i in range(n)], 0)
        self.down_sums = self._chain([(self.w[f"text/layers/{i}/mlp/down"], self._input_kinds(i + 1))
                                      for i in range(n - 1)], 3)
        ops.zero(self.ws["res_sums"])  # each reader zeroes the next sums of its chain after this
        self.gdn_sums, self.attn_sums = self._input_sums("gdn"), self._input_sums("attention")
        ops.zero(self.ws["mix_sums"])  # the conv + step kernel and the attention combine zero them after this


    @property
    def step_words(self) -> int:
        return STEP_HEADER + self.pages_per_seq

    def body(self, trace: Callable[[int], None] | None = None) -> None:
        """Embedding, every layer, final norm (into ws['normed']). `trace(i)` after layer i (eager only:
        ws['x'] then holds the layer's output and ws['mix_out'] its mixer output)."""
        c, ws = self.c, self.ws
        self.ops.embedding(self.ids, self.w["text/token_embedding"].buf, ws["x"], c.vocab, c.hidden)
        for i in range(c.n_layers):
            self.layer(i)
            if trace is not None:
                trace(i)
        self.ops.rmsnorm(ws["x"], self.w["text/final_norm"].buf, ws["normed"], c.hidden, c.rms_eps)

    def head(self) -> None:
        """Logits (bf16 [vocab]) of ws['normed'] into ws['logits']."""
        h = self.w["text/output_head"]
        self.ops.gemv(h.fmt, "plain", h.buf, self.ws["normed"], self.ws["logits"], self.c.vocab, self.c.hidden,
                      tiled=h.tiled)

    def mixer_width(self, i: int) -> int:
        """Values layer i's mixer writes to ws['mix_out'] (before its output projection)."""
        c = self.c
        return c.n_heads * c.head_dim if c.layer_types[i] == "full_attention" else c.gdn_value_width

    def greedy(self) -> None:
        """The index of the largest logit (int32) into ws['argmax']."""
        self.ops.argmax(self.ws["logits"], self.ws["argmax"], self.c.vocab)

    def _input_readers(self, i: int) -> list[str]:
        """The weights of layer i's GEMVs that read its input norm (plain GEMVs)."""
        p = f"text/layers/{i}/"
        mixer = "attention" if self.c.layer_types[i] == "full_attention" else "gdn"
        stack, halves = MERGED_INPUTS[mixer]
        readers = [p + stack] if p + stack in self.w else [p + h for h in halves]
        return readers + ([p + "gdn/a_b_projection"] if mixer == "gdn" else [])

    def _normed(self, x: str, norm: str, readers: list[str],
                epilogue: str = "plain") -> tuple[DeviceBuffer, Norm | None]:
        """(input, norm=) for the GEMVs (`epilogue`) of weights `readers` that read rmsnorm(ws[x], weight
        `norm`): ws[x] and the norm when they all fold it, else ws['normed'] after one rmsnorm launch."""
        c, ws = self.c, self.ws
        if all(self.ops.folds_norm(self.w[r].fmt, epilogue, self.w[r].tiled, c.hidden) for r in readers):
            return ws[x], (self.w[norm].buf, c.rms_eps)
        self.ops.rmsnorm(ws[x], self.w[norm].buf, ws["normed"], c.hidden, c.rms_eps)
        return ws["normed"], None

    def _mixer_output_name(self, i: int) -> str:
        mixer = "attention" if self.c.layer_types[i] == "full_attention" else "gdn"
        return f"text/layers/{i}/{mixer}/output"

    def _mixer_output(self, i: int) -> DeviceTensor:
        return self.w[self._mixer_output_name(i)]

    def _reader(self, name: str, epilogue: str) -> tuple[str, str, bool] | None:
        """(format, epilogue, tiled) of the GEMV of weight `name` when it folds the RMSNorm, else None."""
        w = self.w[name]
        return (w.fmt, epilogue, w.tiled) if self.ops.folds_norm(w.fmt, epilogue, w.tiled, self.c.hidden) else None

    def _input_kinds(self, i: int) -> list[tuple[str, str, bool] | None] | None:
        """The readers of layer i's input (merged input projections only: one GEMV writes x), else None."""
        readers = self._input_readers(i)
        if len(readers) > 1 + (self.c.layer_types[i] != "full_attention"):  # halves, not one merged stack
            return None
        return [self._reader(readers[0], "plain")] + [self._reader(r, "plain") for r in readers[1:]]

    def _chain(self, links: list, base: int) -> list[DeviceBuffer] | None:
        """The sums buffers (fp32 [hidden] views of ws['res_sums'], from buffer `base`) of a chain of deferred
        residuals, links [(writer weight, its output's readers)], when every link defers, else None: link j
        uses buffer j % 2, the last one 2 when the count is odd (each reader zeroes link j + 1's)."""
        c, n = self.c, len(links)
        if n < 2:
            return None
        for out, readers in links:
            if (readers is None or None in readers
                    or not self.ops.defers_residual(out.fmt, out.tiled, out.shape[1], readers, c.hidden)):
                return None
        size = c.hidden * FP32
        bufs = [self.ws["res_sums"].view((base + b) * size, size) for b in range(3)]
        return [bufs[2 if j == n - 1 and n % 2 else j % 2] for j in range(n)]

    @property
    def accumulating(self) -> frozenset[str]:
        """The weights whose GEMV accumulates (a residual deferred to its readers)."""
        n, outs, downs = self.c.n_layers, self.out_sums is not None, self.down_sums is not None
        return frozenset([self._mixer_output_name(i) for i in range(n) if outs]
                         + [f"text/layers/{i}/mlp/down" for i in range(n - 1) if downs]
                         + [f"text/layers/{i}/{MERGED_INPUTS['gdn'][0]}" for i in self.c.gdn_layers if self.gdn_sums]
                         + [f"text/layers/{i}/{MERGED_INPUTS['attention'][0]}" for i in self.c.attention_layers
                            if self.attn_sums])

    def _input_sums(self, mixer: str) -> bool:
        """Whether every `mixer` ("gdn" or "attention") layer's merged input GEMV accumulates fp32 sums that the
        mixer's kernels read (the norm folded; `Ops.accumulates_inputs`)."""
        c, stack = self.c, MERGED_INPUTS[mixer][0]
        names = [f"text/layers/{i}/{stack}" for i in (c.gdn_layers if mixer == "gdn" else c.attention_layers)]
        return bool(names) and all(
            n in self.w and self._reader(n, "plain") is not None
            and self.ops.accumulates_inputs(mixer, self.w[n].fmt, self.w[n].tiled, c.hidden) for n in names)

    def layer_output(self, i: int) -> tuple[DeviceBuffer, DeviceBuffer | None]:
        """Where layer i's output x is after it ran: (ws['x'], None), or deferred (ws['x_mid'], d_i): x is then
        bf16(x_mid + d_i)."""
        if self.down_sums is not None and i < self.c.n_layers - 1:
            return self.ws["x_mid"], self.down_sums[i]
        return self.ws["x"], None

    def layer(self, i: int) -> None:
        c, ws, ops = self.c, self.ws, self.ops
        p = f"text/layers/{i}/"
        w = self.w
        mixer = "attention" if c.layer_types[i] == "full_attention" else "gdn"
        out, gu, down = self._mixer_output(i), w[p + "mlp/gate_up"], w[p + "mlp/down"]
        ds, n = self.down_sums, c.n_layers
        if ds is not None and i > 0:  # the input GEMV stages x = x_mid + the last down's sums
            x, norm = ws["x_mid"], (w[p + "input_norm"].buf, c.rms_eps)
            add = Addend(ds[i - 1], ws["x"], ds[i % (n - 1)])
        else:
            x, norm = self._normed("x", p + "input_norm", self._input_readers(i))
            add = None
        (self._attention if mixer == "attention" else self._gdn)(i, p, x, norm, add)
        if self.out_sums is not None:  # gate_up stages x_mid = x + the output GEMV's sums
            s = self.out_sums[i]
            ops.gemv(out.fmt, ACCUMULATE, out.buf, ws["mix_out"], s, c.hidden, out.shape[1], tiled=out.tiled)
            ops.gemv(gu.fmt, "swiglu", gu.buf, ws["x"], ws["act"], gu.shape[0], c.hidden, tiled=gu.tiled,
                     norm=(w[p + "post_attention_norm"].buf, c.rms_eps),
                     add=Addend(s, ws["x_mid"], self.out_sums[(i + 1) % n]))
        else:
            ops.gemv(out.fmt, "residual", out.buf, ws["mix_out"], ws["x_mid"], c.hidden, out.shape[1], r=ws["x"],
                     tiled=out.tiled)
            x, norm = self._normed("x_mid", p + "post_attention_norm", [p + "mlp/gate_up"], "swiglu")
            ops.gemv(gu.fmt, "swiglu", gu.buf, x, ws["act"], gu.shape[0], c.hidden, tiled=gu.tiled, norm=norm)
        if ds is not None and i < n - 1:
            ops.gemv(down.fmt, ACCUMULATE, down.buf, ws["act"], ds[i], c.hidden, down.shape[1], tiled=down.tiled)
        else:
            ops.gemv(down.fmt, "residual", down.buf, ws["act"], ws["x"], c.hidden, down.shape[1], r=ws["x_mid"],
                     tiled=down.tiled)

    def _gdn(self, i: int, p: str, x: DeviceBuffer, norm: Norm | None, add: Addend | None) -> None:
        """`add`: x is the last layer's x_mid and its down's sums (merged input projections only)."""
        c, ws, ops, w = self.c, self.ws, self.ops, self.w
        kw, vw, hv = c.gdn_key_width, c.gdn_value_width, c.gdn_v_heads
        ab, merged = w[p + "gdn/a_b_projection"], w.get(p + MERGED_INPUTS["gdn"][0])
        mix = ws["mix_in"]
        with ops.side():  # the small projections overlap the large GEMV (merged q|k|v|z, or value_z)
            ops.linear_bf16(x, ab.buf, ws["ab"], 2 * hv, c.hidden, norm=norm, sums=None if add is None else add.s)
            if merged is None:
                qk = w[p + "gdn/query_key"]
                ops.gemv(qk.fmt, "plain", qk.buf, x, mix.view(0, 2 * kw * BF16), 2 * kw, c.hidden, tiled=qk.tiled,
                         norm=norm)
        e = FP32 if self.gdn_sums else BF16  # q|k|v|z: fp32 sums (accumulated, read and zeroed by conv + step)
        if self.gdn_sums:
            mix = ws["mix_sums"]
            ops.gemv(merged.fmt, ACCUMULATE, merged.buf, x, mix.view(0, 2 * (kw + vw) * e), 2 * (kw + vw), c.hidden,
                     tiled=merged.tiled, norm=norm, add=add, q4_rows=merged.q4_rows)
        elif merged is not None:
            ops.gemv(merged.fmt, "plain", merged.buf, x, mix.view(0, 2 * (kw + vw) * BF16), 2 * (kw + vw), c.hidden,
                     tiled=merged.tiled, norm=norm, add=add, q4_rows=merged.q4_rows)
        else:
            vz = w[p + "gdn/value_z"]
            ops.gemv(vz.fmt, "plain", vz.buf, x, mix.view(2 * kw * BF16, 2 * vw * BF16), 2 * vw, c.hidden,
                     tiled=vz.tiled, norm=norm)
        ops.join()
        ops.gdn_conv_step(mix.view(0, c.conv_dim * e), self.states.conv[i], w[p + "gdn/convolution"].buf,
                          mix.view(c.conv_dim * e, vw * e), ws["ab"].view(0, hv * BF16),
                          ws["ab"].view(hv * BF16, hv * BF16), w[p + "gdn/a_log"].buf, w[p + "gdn/dt_bias"].buf,
                          w[p + "gdn/norm"].buf, self.states.recurrent[i], self.slots, ws["gdn_sync"],
                          ws["mix_out"], c.gdn_k_heads, hv, self.n_slots, c.rms_eps, sums=self.gdn_sums)

    def _attention(self, i: int, p: str, x: DeviceBuffer, norm: Norm | None, add: Addend | None) -> None:
        """`add`: x is the last layer's x_mid and its down's sums (merged input projections only)."""
        c, ws, ops, w, g = self.c, self.ws, self.ops, self.w, self.attn
        d = c.head_dim
        qw, kvw = c.n_heads * d, c.n_kv_heads * d
        mix, merged = ws["mix_in"], w.get(p + MERGED_INPUTS["attention"][0])
        e = FP32 if self.attn_sums else BF16  # q|k|gate|v: fp32 sums (accumulated, read and zeroed by attention)
        if self.attn_sums:
            mix = ws["mix_sums"]
            ops.gemv(merged.fmt, ACCUMULATE, merged.buf, x, mix.view(0, 2 * (qw + kvw) * e), 2 * (qw + kvw), c.hidden,
                     tiled=merged.tiled, norm=norm, add=add, q4_rows=merged.q4_rows)
            gate_value = mix.view((qw + kvw) * e, (qw + kvw) * e)
        elif merged is not None:  # one GEMV: q | k | gate | v
            ops.gemv(merged.fmt, "plain", merged.buf, x, mix.view(0, 2 * (qw + kvw) * BF16), 2 * (qw + kvw),
                     c.hidden, tiled=merged.tiled, norm=norm, add=add, q4_rows=merged.q4_rows)
            gate_value = mix.view((qw + kvw) * BF16, (qw + kvw) * BF16)
        else:
            qk, gv, gate_value = w[p + "attention/query_key"], w[p + "attention/gate_value"], ws["gate_value"]
            with ops.side():
                ops.gemv(gv.fmt, "plain", gv.buf, x, gate_value, qw + kvw, c.hidden, tiled=gv.tiled, norm=norm)
            ops.gemv(qk.fmt, "plain", qk.buf, x, mix.view(0, (qw + kvw) * BF16), qw + kvw, c.hidden, tiled=qk.tiled,
                     norm=norm)
            ops.join()
        # the kernels read q, k, gate, v where the GEMVs wrote them (head h at h * d)
        q_proj, k = mix.view(0, qw * e), mix.view(qw * e, kvw * e)
        gate, v = gate_value.view(0, qw * e), gate_value.view(qw * e, kvw * e)
        ops.attention(q_proj, k, v, w[p + "attention/query_norm"].buf, w[p + "attention/key_norm"].buf,
                      self.positions, self.lens, self.page_table, self.states.kv[i], ws["q"], ws["part_o"],
                      ws["part_lse"], gate, ws["mix_out"], g, sums=self.attn_sums)
