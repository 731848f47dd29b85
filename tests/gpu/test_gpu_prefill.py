"""GpuExecutor chunked prefill on the tiny dense artifact vs the numpy reference executor (needs a GPU).

Self-diagnosing: a failing comparison prints the first mismatching step, then every layer's mixer
and residual-stream error at the last prompt token (its chunk traced by `trace_prefill`) vs the
reference, for the GPU and for the numpy emulation of the same launch sequence (GPU bad but
emulation good: a prefill kernel's numerics; both bad: the wiring in prefill.py).
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from inferno.artifact import model_source
from inferno.artifact.convert import convert
from inferno.checkpoint.synth import synthesize
from inferno.model.gpu import GpuExecutor
from inferno.model.gpu.diagnose import reference_trace, rms_rel
from inferno.model.reference import ReferenceExecutor

LOGITS_RMS_REL = 0.03  # as tests/gpu/test_gpu_executor.py: bf16 activations vs the fp32 reference
LAYER_RMS_REL = 0.03
MIXER_RMS_REL = 0.04
NEAR_TIE = 0.1  # a greedy pick may differ from the reference's only where its logits are this close
STEPS = 16
MAX_CONTEXT = 2048
CHUNKS = (64, 1024)


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu-prefill")
    return convert(synthesize("tiny-dense", root / "ckpt"), root / "tiny.ninfer", "groupwise-int", progress=False)


@pytest.fixture(scope="module")
def reference(artifact):
    src = model_source(artifact)
    return ReferenceExecutor(src.config, src.weights)


@pytest.fixture(scope="module")
def executors(artifact):
    made = {chunk: GpuExecutor(artifact, max_seqs=2, max_context=MAX_CONTEXT, cuda_graph=True, prefill_chunk=chunk)
            for chunk in CHUNKS}
    yield made
    for ex in made.values():
        ex.close()


def prompt_of(length: int, vocab: int) -> list[int]:
    return [(5 + 7 * i) % vocab for i in range(length)]


def layer_report(ex: GpuExecutor, ref: ReferenceExecutor, tokens: list[int]) -> tuple[str, bool]:
    """Per-layer errors at the last of `tokens`: the earlier chunks prefilled, the last chunk traced.
    Returns the report and whether every error is within its bound."""
    chunk = ex.plan.prefill_chunk
    split = (len(tokens) - 1) // chunk * chunk
    gs, rs = ex.new_state(), ref.new_state()
    try:
        if split:
            ex.prefill(tokens[:split], gs)
        g = ex.trace_prefill(tokens[split:], gs)
    finally:
        ex.release(gs)
    if len(tokens) > 1:
        ref.prefill(tokens[:-1], rs)
    r = reference_trace(ref, tokens[-1], rs)
    lines, ok = [], True
    for i, (gm, rm, gx, rx) in enumerate(zip(g.mixer, r.mixer, g.residual, r.residual)):
        w = ref.model.layers[i].mixer
        mixer = rms_rel(gm @ (w.o_proj if hasattr(w, "o_proj") else w.out_proj), rm)
        residual = rms_rel(gx, rx)
        ok &= mixer <= MIXER_RMS_REL and residual <= LAYER_RMS_REL
        lines.append(f"  layer {i:>2} ({ref.config.layer_types[i]}): mixer {mixer:.4f}, residual {residual:.4f} "
                     f"(max abs {np.abs(gx - rx).max():.4f})")
    logits = rms_rel(g.logits, r.logits)
    ok &= logits <= LOGITS_RMS_REL
    lines.append(f"  logits: {logits:.4f} (rms relative errors vs the reference; prompt tokens {split}.."
                 f"{len(tokens) - 1} in the traced chunk)")
    return "\n".join(lines), ok


def diagnose(artifact, ref: ReferenceExecutor, ex: GpuExecutor, tokens: list[int]) -> str:
    emu = GpuExecutor(artifact, max_seqs=1, max_context=len(tokens) + 1, emulate=True, progress=False,
                      prefill_chunk=ex.plan.prefill_chunk)
    gpu, _ = layer_report(ex, ref, tokens)
    emulated, _ = layer_report(emu, ref, tokens)
    return (f"GPU vs reference at prompt position {len(tokens) - 1} (chunk {ex.plan.prefill_chunk}):\n{gpu}\n"
            f"emulation vs reference:\n{emulated}")


@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("length", [10, 100, 1100])  # one page; across pages; more than one 1024-token chunk
def test_prefill_then_greedy_decode_match_reference(artifact, reference, executors, chunk, length):
    """Chunked prefill, then greedy decode steps: every pick the reference's argmax (or a near-tie
    there), the logits within the bf16 bound."""
    ex, ref = executors[chunk], reference
    tokens = prompt_of(length, ex.config.vocab)
    prompt = list(tokens)
    rs, gs = ref.new_state(), ex.new_state()
    problems: list[str] = []
    exact = 0
    try:
        t0 = time.perf_counter()
        lg = ex.prefill(tokens, gs)
        took = time.perf_counter() - t0
        lr = ref.prefill(tokens, rs)
        for step in range(STEPS):
            err = rms_rel(lg, lr)
            got, want = int(lg.argmax()), int(lr.argmax())
            exact += got == want
            what = "prefill" if step == 0 else f"decode step {step}"
            if err > LOGITS_RMS_REL:
                problems.append(f"{what}: logits rms rel error {err:.4f} > {LOGITS_RMS_REL} "
                                f"(max abs {np.abs(lg - lr).max():.4f})")
            if got != want and lr[want] - lr[got] > NEAR_TIE:
                problems.append(f"{what}: GPU picked {got}, reference {want} (margin {lr[want] - lr[got]:.3f})")
            if problems:
                break
            tokens.append(got)
            lr, lg = ref.step(got, rs), ex.step(got, gs)
    finally:
        ex.release(gs)
    print(f"prompt {length}, chunk {chunk}: prefill {length / took:.0f} tok/s (incl. logits copy), "
          f"{exact}/{STEPS} greedy picks identical to the reference's")
    if problems:
        pytest.fail(f"first mismatch: {problems[0]}\n" + diagnose(artifact, ref, ex, prompt))


@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("length", [1, 70, 130])
def test_prefill_layers_within_tolerance(artifact, reference, executors, chunk, length):
    """Every layer's mixer output and residual stream at the last prompt token within the bf16 bound."""
    ex = executors[chunk]
    tokens = prompt_of(length, ex.config.vocab)
    text, ok = layer_report(ex, reference, tokens)
    print(text)
    assert ok, text + "\n" + diagnose(artifact, reference, ex, tokens)


def test_chunk_sizes_agree(executors):
    """The same 300-token prompt in 64-token chunks and in one chunk: the same logits up to bf16 rounding."""
    out = {}
    for chunk, ex in executors.items():
        s = ex.new_state()
        try:
            out[chunk] = ex.prefill(prompt_of(300, ex.config.vocab), s)
        finally:
            ex.release(s)
    err = rms_rel(out[64], out[1024])
    assert err < 0.02, f"64-token chunks vs one chunk: logits rms rel {err:.4f}"


@pytest.mark.parametrize("chunk", CHUNKS)
def test_prefill_greedy_equals_logits_argmax(executors, chunk):
    ex = executors[chunk]
    tokens = prompt_of(150, ex.config.vocab)
    s1, s2 = ex.new_state(), ex.new_state()
    try:
        t1, t2 = int(ex.prefill(tokens, s1).argmax()), ex.prefill_greedy(tokens, s2)
        for step in range(8):
            assert t1 == t2, f"step {step}: logits argmax {t1}, device argmax {t2}"
            t1, t2 = int(ex.step(t1, s1).argmax()), ex.step_greedy(t2, s2)
    finally:
        ex.release(s1)
        ex.release(s2)


def test_prefill_is_deterministic_and_does_not_allocate(executors):
    ex = executors[64]
    tokens = prompt_of(200, ex.config.vocab)

    def run() -> np.ndarray:
        s = ex.new_state()
        try:
            return ex.prefill(tokens, s)
        finally:
            ex.release(s)

    first = run()
    ex.device.synchronize()
    free = ex.device.free_mem()
    for _ in range(5):
        np.testing.assert_array_equal(run(), first)
    ex.device.synchronize()
    assert ex.device.free_mem() == free, f"device free memory changed by {free - ex.device.free_mem()} bytes"


def test_interleaved_prefill_of_two_sequences(executors):
    """Chunks of two sequences alternate (separate GDN slots and KV pages): each gets its solo logits."""
    ex = executors[64]
    a_tokens, b_tokens = prompt_of(150, ex.config.vocab), prompt_of(90, ex.config.vocab)[::-1]
    solo = {}
    for name, toks in (("a", a_tokens), ("b", b_tokens)):
        s = ex.new_state()
        solo[name] = ex.prefill(toks, s)
        ex.release(s)
    a, b = ex.new_state(), ex.new_state()
    try:
        ex.prefill(a_tokens[:64], a)  # chunk boundaries as in the solo runs: bit-identical results
        ex.prefill(b_tokens[:64], b)
        got_a = ex.prefill(a_tokens[64:], a)
        got_b = ex.prefill(b_tokens[64:], b)
    finally:
        ex.release(a)
        ex.release(b)
    np.testing.assert_array_equal(got_a, solo["a"])
    np.testing.assert_array_equal(got_b, solo["b"])
