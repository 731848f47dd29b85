"""Per-layer comparison of a GPU executor token with the reference executor (debugging, tests).

`layer_errors` runs one token through both (each on its own state, same history) and reports,
per layer, the relative rms error of the mixer output (the GPU's pre-projection output is
projected with the reference's fp32 output weights, so both are `[hidden]`) and of the residual
stream, then of the logits. The mixer error isolates a wrong mixer even when the residual
stream hides it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from inferno.model.executor import State
from inferno.model.gpu.executor import GpuExecutor, StepTrace
from inferno.model.reference import ReferenceExecutor
from inferno.model.reference.attention import AttentionWeights, gated_attention
from inferno.model.reference.ffn import ffn
from inferno.model.reference.gdn import gdn_layer
from inferno.model.reference.norms import rms_norm


@dataclass(frozen=True)
class LayerError:
    layer: int
    kind: str
    mixer: float  # rms(gpu - ref) / rms(ref) of the mixer output (after the output projection)
    residual: float  # same, of the residual stream after the layer
    residual_max_abs: float


def rms_rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.sqrt(np.mean((a - b) ** 2) / max(float(np.mean(b.astype(np.float64) ** 2)), 1e-30)))


def reference_trace(ref: ReferenceExecutor, token: int, state: State) -> StepTrace:
    """The reference's per-layer mixer outputs (after the output projection), residual stream and
    logits for one token; appends the token to `state`."""
    c = ref.config
    x = ref.model.embed[[token]]
    positions = np.array([state.position])
    out = StepTrace([], [], np.zeros(0, np.float32))
    for i, layer in enumerate(ref.model.layers):
        h = rms_norm(x, layer.input_norm, c.rms_eps)
        if isinstance(layer.mixer, AttentionWeights):
            a = gated_attention(h, layer.mixer, c, state.kv[i], positions)
        else:
            a = gdn_layer(h, layer.mixer, c, state.gdn[i])
        x = x + a
        x = x + ffn(rms_norm(x, layer.post_attention_norm, c.rms_eps), layer.ffn)
        out.mixer.append(a[0].copy())
        out.residual.append(x[0].copy())
    state.position += 1
    out.logits = ref.logits(rms_norm(x, ref.model.norm, c.rms_eps))[0]
    return out


def project(ref: ReferenceExecutor, layer: int, mixer: np.ndarray) -> np.ndarray:
    """A GPU mixer output (before the output projection) through the reference's output weights."""
    w = ref.model.layers[layer].mixer
    return mixer @ (w.o_proj if isinstance(w, AttentionWeights) else w.out_proj)


def layer_errors(ex: GpuExecutor, ref: ReferenceExecutor, tokens: list[int]) -> tuple[list[LayerError], float]:
    """Errors at the last of `tokens` (the others are prefilled on fresh states). Returns the
    per-layer errors and the logits' rms relative error."""
    rs, gs = ref.new_state(), ex.new_state()
    try:
        if len(tokens) > 1:
            ref.prefill(tokens[:-1], rs)
            ex.prefill(tokens[:-1], gs)
        r = reference_trace(ref, tokens[-1], rs)
        g = ex.trace_step(tokens[-1], gs)
    finally:
        ex.release(gs)
    errors = [LayerError(i, ref.config.layer_types[i], rms_rel(project(ref, i, gm), rm), rms_rel(gx, rx),
                         float(np.abs(gx - rx).max()))
              for i, (gm, rm, gx, rx) in enumerate(zip(g.mixer, r.mixer, g.residual, r.residual))]
    return errors, rms_rel(g.logits, r.logits)


def report(errors: list[LayerError], logits: float) -> str:
    lines = [f"  layer {e.layer:>2} ({e.kind}): mixer {e.mixer:.4f}, residual {e.residual:.4f} "
             f"(max abs {e.residual_max_abs:.4f})" for e in errors]
    return "\n".join(lines + [f"  logits: {logits:.4f} (rms relative errors vs the reference)"])
