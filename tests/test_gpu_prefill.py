"""CPU: the GPU executor's chunked prefill (inferno/model/gpu/prefill.py).

The numpy emulation of the prefill launch sequence against the reference executor (logits, every
layer of the last prompt token, decode after prefill), and every prefill launch through the real
typed launchers and manifests (the dry-run executor of tests/test_gpu_launches.py)."""

from __future__ import annotations

import pytest
from test_gpu_launches import artifact, dry  # noqa: F401  (module fixtures: tiny artifact, dry-run executor)

from inferno.artifact import model_source, open_checked
from inferno.cuda.errors import OutOfMemoryError
from inferno.errors import UsageError
from inferno.model.gpu import GpuExecutor
from inferno.model.gpu.diagnose import reference_trace, rms_rel
from inferno.model.gpu.residency import HEADROOM, plan_residency
from inferno.model.reference import ReferenceExecutor

LOGITS_RMS_REL = 0.03  # bf16 activations vs the fp32 reference (the emulated decode path measures ~0.01)
LAYER_RMS_REL = 0.03
MIXER_RMS_REL = 0.04


@pytest.fixture(scope="module")
def reference(artifact):  # noqa: F811
    src = model_source(artifact)
    return ReferenceExecutor(src.config, src.weights)


@pytest.fixture(scope="module")
def emulated(artifact):  # noqa: F811
    return GpuExecutor(artifact, emulate=True, max_seqs=2, max_context=256, progress=False, prefill_chunk=64)


def prompt_of(length: int, vocab: int) -> list[int]:
    return [(5 + 7 * i) % vocab for i in range(length)]


@pytest.mark.parametrize("length", [40, 70, 129])  # one chunk; two (64 + 6); 64 + 64 + a lone token (decode path)
def test_emulated_prefill_matches_reference_then_decodes(emulated, reference, length):
    ex, ref = emulated, reference
    tokens = prompt_of(length, ex.config.vocab)
    gs, rs = ex.new_state(), ref.new_state()
    try:
        lg, lr = ex.prefill(tokens, gs), ref.prefill(tokens, rs)
        assert gs.position == length
        for step in range(4):
            err = rms_rel(lg, lr)
            assert err < LOGITS_RMS_REL, f"step {step} (0 = prefill): logits rms rel error {err:.4f}"
            assert int(lg.argmax()) == int(lr.argmax()), f"step {step}: greedy pick differs"
            t = int(lr.argmax())
            lg, lr = ex.step(t, gs), ref.step(t, rs)
    finally:
        ex.release(gs)


def test_emulated_prefill_equals_token_by_token_decode(emulated):
    """Chunked prefill and the decode path agree (both bf16 launch sequences) on the logits and the
    state they leave: the next step's logits too."""
    ex = emulated
    tokens = prompt_of(70, ex.config.vocab)
    a, b = ex.new_state(), ex.new_state()
    try:
        chunked = ex.prefill(tokens, a)
        for t in tokens:
            one = ex.step(t, b)
        assert rms_rel(chunked, one) < 0.02
        assert rms_rel(ex.step(9, a), ex.step(9, b)) < 0.02
    finally:
        ex.release(a)
        ex.release(b)


@pytest.mark.parametrize("prefix", [0, 30])
def test_emulated_prefill_layers_within_tolerance(emulated, reference, prefix):
    """Every layer's mixer output and residual stream at the last token of a chunk (after `prefix`
    tokens prefilled before it) within the bf16 bound."""
    ex, ref = emulated, reference
    tokens = prompt_of(prefix + 50, ex.config.vocab)
    gs, rs = ex.new_state(), ref.new_state()
    try:
        if prefix:
            ex.prefill(tokens[:prefix], gs)
        g = ex.trace_prefill(tokens[prefix:], gs)
        ref.prefill(tokens[:-1], rs)
        r = reference_trace(ref, tokens[-1], rs)
    finally:
        ex.release(gs)
    w = ref.model.layers
    lines, bad = [], False
    for i, (gm, rm, gx, rx) in enumerate(zip(g.mixer, r.mixer, g.residual, r.residual)):
        mixer = rms_rel(gm @ (w[i].mixer.o_proj if hasattr(w[i].mixer, "o_proj") else w[i].mixer.out_proj), rm)
        residual = rms_rel(gx, rx)
        bad |= mixer > MIXER_RMS_REL or residual > LAYER_RMS_REL
        lines.append(f"layer {i} ({ref.config.layer_types[i]}): mixer {mixer:.4f}, residual {residual:.4f}")
    logits = rms_rel(g.logits, r.logits)
    assert not bad and logits < LOGITS_RMS_REL, "\n".join(lines + [f"logits {logits:.4f}"])


def test_prefill_buffers_in_the_plan(artifact):  # noqa: F811
    _, spec, config, expected = open_checked(artifact)
    inventory = {e.name: e for e in expected}
    small = plan_residency(config, inventory, 1, 256, spec.plan, prefill_chunk=64)
    big = plan_residency(config, inventory, 1, 256, spec.plan, prefill_chunk=1024)
    assert 0 < small.prefill_bytes < big.prefill_bytes
    assert big.arena_bytes - small.arena_bytes == big.prefill_bytes - small.prefill_bytes
    assert "prefill buffers" in big.summary() and "1024-token chunks" in big.summary()
    free = big.weight_bytes + big.workspace_bytes + HEADROOM + big.prefill_bytes // 2
    with pytest.raises(OutOfMemoryError, match="lower --prefill-chunk"):
        big.require_fits(free)
    with pytest.raises(UsageError, match="--prefill-chunk"):
        plan_residency(config, inventory, 1, 256, spec.plan, prefill_chunk=0)


def test_27b_prefill_buffers_are_modest():
    from inferno.artifact.identities import lookup

    spec = lookup("qwen3.6-27b", "groupwise-int")
    config = spec.builtin_config()
    plan = plan_residency(config, {e.name: e for e in spec.expected(config)}, 1, 32768, prefill_chunk=1024)
    # the bf16 weight scratch (gate_up [34816, 5120]: 340 MiB) plus ~0.3 GiB of chunk activations
    assert plan.prefill["weight"] == 2 * 17408 * 5120 * 2
    assert plan.prefill_bytes < 2**30, plan.summary()


def test_every_prefill_launch_passes_the_launchers(dry, artifact):  # noqa: F811
    """Two chunks (64 + 6 tokens) on the dry-run executor: every launch packs with its real launcher
    and manifest, in the order of the prefill program."""
    _, launches = dry  # the fixture's patches are active while it lives
    ex = GpuExecutor(artifact, max_seqs=1, max_context=160, cuda_graph=False, progress=False, prefill_chunk=64)
    s = ex.new_state()
    try:
        launches.clear()
        ex.prefill(prompt_of(70, ex.config.vocab), s)
        names = [n for n, _ in launches]
        c = ex.config

        def linear(quantized: bool = True) -> list[str]:
            return ["dequant", "gemm"] if quantized else ["gemm"]

        def ffn() -> list[str]:
            return ["add_rmsnorm", *linear(), "silu_mul", *linear(), "add_rmsnorm"]

        if ex.plan.merge:  # the input projections as one matrix (INFERNO_MERGE_PROJ=1), tiny-dense's mixed stacks
            assert all(p.q4_rows for p in ex.plan.placements if p.merged)  # dequantised per image: Q4, then Q5
            gdn_in, attn_in = ["dequant", "dequant", "gemm", "gemm"], ["dequant", "dequant", *["gemm"] * 4]
        else:
            gdn_in, attn_in = ["dequant", "dequant", "gemm", "gemm"], ["dequant", "gemm", "gemm"] * 2
        gdn = [*gdn_in, "gdn_conv_prefill", "gdn_chunk", *linear(), *ffn()]
        attn = [*attn_in, "attn_qk_prep", "attn_prefill_g2_qf32", *linear(), *ffn()]
        chunk = ["embedding", "rmsnorm"]
        for kind in c.layer_types:
            chunk += attn if kind == "full_attention" else gdn
        want = chunk + chunk + ["gemv"]  # then the decode head
        got = [w if n.startswith(w) else n for n, w in zip(names, want)]
        assert got == want and len(names) == len(want), names
        assert s.position == 70
        assert ex.step_greedy(9, s) >= 0
    finally:
        ex.release(s)
        ex.close()
