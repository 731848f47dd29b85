"""Gated full-attention decode kernels vs the numpy reference on the live GPU.

One decode step per sequence after the projections: attn_qk_prep (q/k norm + RoPE, k/v appended
to the paged cache), attn_decode_g<G> (split-K partials) and attn_combine (merge + sigmoid gate).
Fresh random inputs every run, NaN-poisoned cache pages / scratch / outputs, scattered pages.
q, k, gate and v are read where the projection GEMVs write them: q | k and gate | v rows of
(Hq + Hkv) * 256 values (distinct random contents, a NaN guard after the last row), so a kernel
that reads q or the gate at a wrong row or head stride gets k, v, another head or NaN.
Each case prints its errors per output (q after prep, the cache slot written, the gated output)
before asserting, so a failure says which stage went wrong.

Cubins come from the kernel cache ($INFERNO_KERNEL_DIR); without the DSL on this machine they
must be built beforehand (`python -m inferno.kernels.attn_variants DIR sm_90a`).
"""

import numpy as np
import pytest
from ml_dtypes import bfloat16

from inferno.checkpoint.presets import get_preset
from inferno.cuda.copy import from_device, h2d, memset_d8, to_device
from inferno.cuda.memory import device_alloc
from inferno.kernels import attn_variants as av
from inferno.kernels.kv_layout import KVLayout, page_table
from inferno.kernels.reference import rel_error
from inferno.model.config import ModelConfig
from inferno.model.reference.attention import causal_attention
from inferno.model.reference.norms import rms_norm, sigmoid
from inferno.model.reference.rope import apply_rope, rope_tables

MODELS = {"27b": "qwen3.6-27b", "35b": "qwen3.6-35b-a3b"}
GUARD = 256
Q_TOL = 2e-3  # fp32 q: only the fp32 RoPE angle differs from the float64 reference
K_TOL = 1e-2  # k rounded to bf16 in the cache
OUT_TOL = 1e-2  # bf16 output
# fp32 split partials, merged in numpy, vs attention of the kernel's own fp32 q: the tensor-core kernel
# carries q and P as bf16 hi + lo pairs (fp32-level error, ~1e-6); bf16 q alone would give ~2e-3.
PART_TOL = 2e-4


@pytest.fixture(scope="module")
def configs():
    return {m: ModelConfig.from_hf(get_preset(p).text) for m, p in MODELS.items()}


@pytest.fixture(scope="module")
def attention(device, configs):
    kernels = {}

    def get(model: str, decode: str | None = None, combine: str | None = None) -> av.PagedAttention:
        if (model, decode, combine) not in kernels:
            c = configs[model]
            kernels[model, decode, combine] = av.PagedAttention(c.n_heads, c.n_kv_heads, device, decode, combine)
        return kernels[model, decode, combine]

    return get


def _bf16(rng, shape, scale=1.0) -> np.ndarray:
    return (scale * rng.standard_normal(shape, np.float32)).astype(bfloat16)


def _poisoned(nbytes: int, name: str):
    buf = device_alloc(nbytes + GUARD, name)
    memset_d8(buf, 0xFF)
    return buf


def _projections(rng, b: int, hq: int, hkv: int, d: int) -> tuple[np.ndarray, np.ndarray]:
    """[q | k] and [gate | v] rows as the projection GEMVs write them (distinct random values)."""
    return _bf16(rng, (b, (hq + hkv) * d)), _bf16(rng, (b, (hq + hkv) * d))


def _upload_rows(qk: np.ndarray, gv: np.ndarray, hq: int, d: int) -> dict:
    """Both row buffers on the device with a NaN guard after them, and the four views the step reads."""
    bufs = {}
    for name, rows in (("qk", qk), ("gv", gv)):
        bufs[name] = _poisoned(rows.nbytes, name)
        h2d(bufs[name], rows)
    at = hq * d * 2  # k (v) start after the q (gate) heads of the row
    return dict(bufs, q_proj=bufs["qk"], k=bufs["qk"].view(at, qk.nbytes - at), gate=bufs["gv"],
                v=bufs["gv"].view(at, gv.nbytes - at))


def _run(attn: av.PagedAttention, rows: dict, stride: int, *args, **kw) -> None:
    """attn(...) on the views of `_upload_rows` (row stride `stride` for q, gate, k and v)."""
    attn(rows["q_proj"], rows["gate"], rows["k"], rows["v"], *args, q_stride=stride, gate_stride=stride,
         kv_stride=stride, **kw)


def _step(attn: av.PagedAttention, cfg: ModelConfig, lens: list[int], splits: int | None, rng):
    """Run one decode step on the GPU and return what it wrote plus everything the reference needs."""
    b, hq, hkv, d = len(lens), cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    lay = KVLayout(hkv)
    need = [lay.pages_for(n) for n in lens]
    n_pool = sum(need) + 3
    order = rng.permutation(n_pool).astype(np.int32)  # scattered, out-of-order pages
    seq_pages, at = [], 0
    for n in need:
        seq_pages.append(order[at:at + n].tolist())
        at += n
    width = max(need) + 2
    table = page_table(seq_pages, width)
    pool = lay.empty_pool(n_pool)  # NaN everywhere the history does not fill
    for s, n in enumerate(lens):
        if n > 1:
            lay.write(pool, table[s], 0, _bf16(rng, (n - 1, hkv, d)), _bf16(rng, (n - 1, hkv, d)))

    qk, gv = _projections(rng, b, hq, hkv, d)
    q_norm, k_norm = _bf16(rng, d, 0.5), _bf16(rng, d, 0.5)
    positions = (np.maximum(np.array(lens) - 1, 0) + rng.integers(0, 40, b)).astype(np.int32)  # M-RoPE may run ahead
    lens_a = np.array(lens, np.int32)
    splits = splits or av.default_splits(max(lens), b, hkv)

    up = {n: to_device(None, a, n) for n, a in (("q_norm", q_norm), ("k_norm", k_norm), ("positions", positions),
                                                ("lens", lens_a), ("page_table", table), ("kv", pool))}
    rows = _upload_rows(qk, gv, hq, d)
    scratch = _poisoned(attn.scratch_bytes(b, splits), "scratch")
    out_bytes = b * hq * d * 2
    out = _poisoned(out_bytes, "out")
    try:
        _run(attn, rows, (hq + hkv) * d, up["q_norm"], up["k_norm"], up["positions"], up["lens"], up["page_table"],
             up["kv"], scratch, out, batch=b, table_width=width, splits=splits, eps=cfg.rms_eps,
             rope_theta=cfg.rope_theta)
        got_scratch = from_device(scratch, np.float32, (attn.scratch_bytes(b, splits) // 4,))
        got_q = got_scratch[:b * hq * d].reshape(b, hq, d)
        po_at = av._align(b * hq * d * 4) // 4
        po_bytes, pl_bytes = av.partial_bytes(b, hq, splits)
        got_po = got_scratch[po_at:po_at + po_bytes // 4].reshape(b, hq, splits, d)
        pl_at = po_at + av._align(po_bytes) // 4
        got_pl = got_scratch[pl_at:pl_at + pl_bytes // 4].reshape(b, hq, splits)
        got_pool = from_device(up["kv"], bfloat16, pool.shape)
        raw = from_device(out, np.uint8, (out_bytes + GUARD,))
    finally:
        for buf in (*up.values(), rows["qk"], rows["gv"], scratch, out):
            buf.free()
    qw = hq * d
    return dict(lay=lay, table=table, pool=pool, q=qk[:, :qw], k=qk[:, qw:], gate=gv[:, :qw], v=gv[:, qw:],
                q_norm=q_norm, k_norm=k_norm, positions=positions, splits=splits, got_q=got_q, got_pool=got_pool, got_po=got_po, got_pl=got_pl,
                got_out=raw[:out_bytes].view(bfloat16).reshape(b, hq * d), guard=raw[out_bytes:])


def _check(cfg: ModelConfig, lens: list[int], r: dict) -> None:
    hq, hkv, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    lay, table = r["lay"], r["table"]
    f32 = np.float32
    lines, ok = [], True
    for s, n in enumerate(lens):
        if n == 0:  # an idle lane: zero output, nothing cached
            got = r["got_out"][s].astype(f32)
            lines.append(f"seq {s} idle: out {'zero' if not np.any(got) else 'NOT ZERO'}")
            ok &= not np.any(got)
            continue
        cos, sin = rope_tables(cfg, r["positions"][s:s + 1])
        q_ref = apply_rope(rms_norm(r["q"][s].astype(f32).reshape(1, hq, d), r["q_norm"].astype(f32), cfg.rms_eps),
                           cos, sin)
        k_ref = apply_rope(rms_norm(r["k"][s].astype(f32).reshape(1, hkv, d), r["k_norm"].astype(f32),
                                    cfg.rms_eps), cos, sin)
        v_new = r["v"][s].astype(f32).reshape(1, hkv, d)

        got_k, got_v = lay.gather(r["got_pool"], table[s], n)
        err_q = rel_error(r["got_q"][s], q_ref[0])
        err_k = rel_error(got_k[n - 1], k_ref[0])
        v_exact = bool(np.array_equal(got_v[n - 1], v_new[0]))

        hist_k, hist_v = lay.gather(r["pool"], table[s], n)  # history as uploaded (slot n-1 is NaN)
        keys = np.concatenate([hist_k[:n - 1], k_ref.astype(bfloat16).astype(f32)])
        values = np.concatenate([hist_v[:n - 1], v_new])
        o = causal_attention(q_ref, keys, values, scale=d ** -0.5).reshape(hq * d)
        want = o * sigmoid(r["gate"][s].astype(f32))
        got = r["got_out"][s].astype(f32)
        unwritten = int(np.isnan(got).sum())
        # The decode kernel alone: its used splits merged here vs attention of its own q over the cache.
        pages = -(-n // lay.page_tokens)
        used = -(-pages // max(-(-pages // r["splits"]), 1))
        lse = r["got_pl"][s, :, :used].astype(np.float64)
        wts = np.exp2(lse - lse.max(1, keepdims=True))
        merged = (r["got_po"][s, :, :used] * wts[..., None]).sum(1) / wts.sum(1)[:, None]
        keys_got, values_got = lay.gather(r["got_pool"], table[s], n)
        err_p = rel_error(merged, causal_attention(r["got_q"][s][None].astype(np.float64), keys_got, values_got,
                                                   scale=d ** -0.5).reshape(hq, d))
        err_o = rel_error(np.nan_to_num(got), want)
        max_o = float(np.max(np.abs(np.nan_to_num(got) - want)))
        lines.append(f"seq {s} len {n:5d} pos {int(r['positions'][s]):5d}: q rel {err_q:.2e}  k rel {err_k:.2e}  "
                     f"v {'exact' if v_exact else 'WRONG'}  partials rel {err_p:.2e} ({used} splits)  "
                     f"out rel {err_o:.2e} (max abs {max_o:.2e}, unwritten {unwritten})")
        ok &= (err_q <= Q_TOL and err_k <= K_TOL and v_exact and err_p <= PART_TOL and err_o <= OUT_TOL
               and unwritten == 0)

    # The step writes exactly one slot per sequence: every other pool entry is as uploaded.
    before = r["pool"].astype(f32)
    after = r["got_pool"].astype(f32)
    mask = np.ones(before.shape, bool)
    for s, n in enumerate(lens):
        if n:
            p, t = divmod(n - 1, lay.page_tokens)
            mask[table[s][p], :, :, t] = False
    stray = int(np.sum(~((before == after) | (np.isnan(before) & np.isnan(after))) & mask))
    guard_ok = bool(np.all(r["guard"] == 0xFF))
    lines.append(f"splits {r['splits']}  stray cache writes {stray}  out guard {'ok' if guard_ok else 'TOUCHED'}")
    print(f"\n{cfg.n_heads}/{cfg.n_kv_heads} heads, lens {lens}:\n  " + "\n  ".join(lines))
    assert ok and stray == 0 and guard_ok, "\n".join(lines)


CASES = [
    ([1], None), ([63], None), ([64], None), ([65], None), ([1000], None), ([7681], None), ([8192], None),
    ([65536], None), ([65536], 33),
    ([1000], 1),  # one split: the whole sequence in one CTA
    ([65], 40),  # more splits than pages: idle CTAs, combine reads only the used splits
    ([7681], 3), ([7681], 5), ([8192], 132), ([65536], 7),  # uneven splits; 4 CTAs per SM
    ([1, 65, 1000], None), ([8192, 64, 130], 16), ([2, 3, 4, 5, 6, 7, 8, 9], 3),
    ([0, 70, 0], None),  # idle lanes (lens 0) around a live one
    ([0, 8191, 0, 33, 0], 66),  # idle lanes in a batch with long and short live ones
]


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("lens,splits", CASES)
def test_decode_step(attention, configs, rng, model, lens, splits):
    cfg = configs[model]
    _check(cfg, lens, _step(attention(model), cfg, lens, splits, rng))


REGS = {"27b": "attn_decode_g6_regs", "35b": "attn_decode_g8_regs"}  # the defaults before the pipeline
PIPELINED = {"27b": "attn_decode_g6_pipelined", "35b": "attn_decode_g8_pipelined"}  # before tensor cores
THREE_STAGES = {"27b": "attn_decode_g6_s3", "35b": "attn_decode_g8_s3"}  # candidate default (sm_90a only)
FALLBACK_CASES = [([65], None), ([1000], 1), ([7681], None), ([8192, 64, 130], 16), ([0, 70, 0], None)]


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("lens,splits", FALLBACK_CASES)
def test_decode_step_previous_variants(attention, configs, rng, model, lens, splits):
    cfg = configs[model]
    _check(cfg, lens, _step(attention(model, REGS[model], "attn_combine_serial"), cfg, lens, splits, rng))


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("lens,splits", FALLBACK_CASES)
def test_decode_step_pipelined_fallback(attention, configs, rng, model, lens, splits):
    """The previous defaults: the CUDA-core pipelined decode and the two-pass combine."""
    cfg = configs[model]
    _check(cfg, lens, _step(attention(model, PIPELINED[model], "attn_combine_2pass"), cfg, lens, splits, rng))


CROSS_CASES = [*FALLBACK_CASES, ([1], None), ([1, 65, 1000], None), ([65536], 132), ([0, 8191, 0, 33, 0], 66)]


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("lens,splits", CROSS_CASES)
def test_online_combine_with_pipelined_decode(attention, configs, rng, model, lens, splits):
    """The one-pass combine (the default) on partials of the GPU-verified pipelined decode: a combine
    bug shows here without the tensor-core decode; 128 used splits = two loads per group."""
    cfg = configs[model]
    _check(cfg, lens, _step(attention(model, PIPELINED[model], "attn_combine"), cfg, lens, splits, rng))


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("lens,splits", CROSS_CASES)
def test_mma_decode_with_two_pass_combine(attention, configs, rng, model, lens, splits):
    """The tensor-core decode (the default) merged by the GPU-verified two-pass combine."""
    cfg = configs[model]
    _check(cfg, lens, _step(attention(model, None, "attn_combine_2pass"), cfg, lens, splits, rng))


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("lens,splits", [*FALLBACK_CASES, ([1], None), ([64], None), ([97], 40), ([65536], None),
                                         ([0, 8191, 0, 33, 0], 66)])
def test_decode_step_three_stages(device, attention, configs, rng, model, lens, splits):
    if device.arch != "sm_90a":
        pytest.skip("the three-stage variants build for sm_90a only")
    cfg = configs[model]
    _check(cfg, lens, _step(attention(model, THREE_STAGES[model]), cfg, lens, splits, rng))


FUSED = {"27b": "attn_decode_g6_fused", "35b": "attn_decode_g8_fused"}  # prep folded into the decode
FUSED_S3 = {"27b": "attn_decode_g6_fused_s3", "35b": "attn_decode_g8_fused_s3"}  # + three stages (sm_90a)


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("lens,splits", CASES)
def test_fused_decode_step(attention, configs, rng, model, lens, splits):
    """attn_decode_g<G>_fused + attn_combine_early: the whole step in two launches. The new token's K/V
    row is appended by the CTA of the last used split and used from shared memory (the pool's row is
    NaN before the step: reading it from global memory would poison the output); q is checked as
    written by the split-0 CTAs."""
    cfg = configs[model]
    _check(cfg, lens, _step(attention(model, FUSED[model], "attn_combine_early"), cfg, lens, splits, rng))


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("lens,splits", [*FALLBACK_CASES, ([1], None), ([64], None), ([97], 40), ([65536], None),
                                         ([0, 8191, 0, 33, 0], 66), ([1, 65, 1000], None)])
def test_fused_decode_step_three_stages(device, attention, configs, rng, model, lens, splits):
    if device.arch != "sm_90a":
        pytest.skip("the three-stage variants build for sm_90a only")
    cfg = configs[model]
    _check(cfg, lens, _step(attention(model, FUSED_S3[model]), cfg, lens, splits, rng))


@pytest.mark.parametrize("decode,pdl", [(None, False), ("fused", False), ("fused", True), (None, True)])
def test_two_steps_append(attention, configs, rng, decode, pdl):
    """Step n then step n+1 on the same cache, queued back to back (pdl: on a stream that launches them
    with programmatic dependent launch, as the executor's graph does): the second step sees the first
    step's k/v (the fused kernel reads the cache rows < lens - 1 before its PDL wait)."""
    from inferno.cuda.stream import Stream

    cfg = configs["27b"]
    attn = attention("27b", FUSED["27b"], "attn_combine_early") if decode == "fused" else attention("27b")
    hq, hkv, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    lay = KVLayout(hkv)
    pages = np.array([[3, 0]], np.int32)
    pool = lay.empty_pool(4)
    lay.write(pool, pages[0], 0, _bf16(rng, (63, hkv, d)), _bf16(rng, (63, hkv, d)))
    kv = to_device(None, pool, "kv")
    tab = to_device(None, pages, "page_table")
    q_norm, k_norm = _bf16(rng, d, 0.5), _bf16(rng, d, 0.5)
    qn, kn = to_device(None, q_norm, "qn"), to_device(None, k_norm, "kn")
    scratch = device_alloc(attn.scratch_bytes(1, 2), "scratch")
    stream = Stream.create()
    stream.pdl = pdl
    steps, bufs = [], [kv, tab, qn, kn, scratch]
    try:
        for n in (64, 65):  # every input uploaded first: the two steps then run without a host sync
            qk, gv = _projections(rng, 1, hq, hkv, d)
            rows = _upload_rows(qk, gv, hq, d)
            pos, lens = (to_device(None, np.array([x], np.int32), nm) for x, nm in ((n - 1, "pos"), (n, "lens")))
            out = device_alloc(hq * d * 2, "out")
            bufs += [rows["qk"], rows["gv"], pos, lens, out]
            steps.append((n, rows, pos, lens, out, (qk[0, :hq * d], gv[0, :hq * d], gv[0, hq * d:])))
        for n, rows, pos, lens, out, _ in steps:
            _run(attn, rows, (hq + hkv) * d, qn, kn, pos, lens, tab, kv, scratch, out, batch=1, table_width=2,
                 splits=2, eps=cfg.rms_eps, rope_theta=cfg.rope_theta, stream=stream)
        stream.synchronize()
        outs = [from_device(st[4], bfloat16, (hq * d,)).astype(np.float32) for st in steps]
        got_pool = from_device(kv, bfloat16, pool.shape)
    finally:
        stream.synchronize()
        stream.close()
        for buf in bufs:
            buf.free()
    keys, values = lay.gather(got_pool, pages[0], 65)
    for (n, *_, (qh, gate, _v)), got in zip(steps, outs):
        cos, sin = rope_tables(cfg, np.array([n - 1]))
        q = apply_rope(rms_norm(qh.astype(np.float32).reshape(1, hq, d), q_norm.astype(np.float32), cfg.rms_eps),
                       cos, sin)
        o = causal_attention(q, keys[:n], values[:n], d ** -0.5).reshape(hq * d)
        want = o * sigmoid(gate.astype(np.float32))
        err = rel_error(got, want)
        print(f"{attn.decode.name} pdl {pdl} len {n}: out rel {err:.2e}")
        assert err <= OUT_TOL
    assert np.array_equal(values[63:65], np.concatenate([steps[0][5][2], steps[1][5][2]]).reshape(2, hkv, d)
                          .astype(np.float32))


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("length", [1, 65, 8192])
def test_fused_sums_equal_bf16_inputs(device, configs, rng, model, length):
    """attn_decode_g<G>_fused_sums + attn_combine_sums on fp32 q | k | gate | v sums (an accumulating GEMV's, one
    row as the executor's ws['mix_sums']) equal attn_decode_g<G>_fused + attn_combine_early on their bf16
    roundings bit for bit (out, q, partials, the cache), and leave the sums zero with their guard intact."""
    cfg = configs[model]
    hq, hkv, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    qw, kw = hq * d, hkv * d
    lay = KVLayout(hkv)
    pages = lay.pages_for(length)
    table = page_table([list(rng.permutation(pages + 2)[:pages])], pages + 1)
    pool = lay.empty_pool(pages + 2)
    if length > 1:
        lay.write(pool, table[0], 0, _bf16(rng, (length - 1, hkv, d)), _bf16(rng, (length - 1, hkv, d)))
    sums = (3 * rng.standard_normal(2 * (qw + kw))).astype(np.float32)  # q | k | gate | v
    splits = av.default_splits(length, 1, hkv)
    fused = av.decode_variant(hq, hkv, fused=True).name
    kinds = {"bf16": (fused, av.COMBINE_EARLY.name, sums.astype(bfloat16), 2),
             "sums": (fused + "_sums", av.COMBINE_SUMS.name, sums, 4)}
    common = {n: to_device(None, a, n) for n, a in (("q_norm", _bf16(rng, d, 0.5)), ("k_norm", _bf16(rng, d, 0.5)),
                                                    ("positions", np.array([length + 3], np.int32)),
                                                    ("lens", np.array([length], np.int32)), ("table", table))}
    got, bufs = {}, list(common.values())
    try:
        for kind, (dname, cname, row, esz) in kinds.items():
            decode, combine = av.AttnDecodeFused.load(dname, device), av.AttnCombine.load(cname, device)
            kv, rows = to_device(None, pool, "kv"), _poisoned(row.nbytes, f"rows {kind}")
            h2d(rows, row)
            q, k, gate, v = (rows.view(at * esz, n * esz) for at, n in ((0, qw), (qw, kw), (qw + kw, qw),
                                                                           (2 * qw + kw, kw)))
            po, pl = av.partial_bytes(1, hq, splits)
            q32, part_o, part_lse = (_poisoned(n, name) for n, name in ((qw * 4, "q"), (po, "po"), (pl, "pl")))
            out = _poisoned(qw * 2, "out")
            bufs += [kv, rows, q32, part_o, part_lse, out]
            decode(q, k, v, common["q_norm"], common["k_norm"], common["positions"], common["lens"], common["table"],
                   kv, q32, part_o, part_lse, batch=1, n_heads=hq, n_kv_heads=hkv, table_width=pages + 1,
                   splits=splits, eps=cfg.rms_eps, rope_theta=cfg.rope_theta)
            combine(part_o, part_lse, common["lens"], gate, out, batch=1, n_heads=hq, splits=splits,
                    zero=(q, k, v) if kind == "sums" else None, n_kv_heads=hkv)
            got[kind] = {name: from_device(b, np.uint8, (b.nbytes,)) for name, b in
                         (("kv", kv), ("q", q32), ("part_o", part_o), ("part_lse", part_lse), ("out", out),
                          ("rows", rows))}
    finally:
        for b in bufs:
            b.free()
    for name in ("kv", "q", "part_o", "part_lse", "out"):
        diff = np.flatnonzero(got["sums"][name] != got["bf16"][name])
        assert diff.size == 0, f"{model} length {length}: {name} differs at {diff.size} bytes, first {diff[:4]}"
    left = got["sums"]["rows"]
    assert np.all(left[sums.nbytes:] == 0xFF), "the guard after the sums was written"
    assert not np.any(left[:sums.nbytes].view(np.float32)), \
        f"{np.count_nonzero(left[:sums.nbytes].view(np.float32))} sums not zeroed"


@pytest.fixture(scope="module")
def copy_gbps(device):
    """Device-to-device copy bandwidth of this run (read + write bytes per second, GB/s)."""
    from inferno.cuda.copy import d2d
    from inferno.cuda.stream import Event, Stream

    n = 512 << 20
    src, dst = device_alloc(n, "copy src"), device_alloc(n, "copy dst")
    stream = Stream.create()
    try:
        d2d(dst, src, stream=stream)
        start, end = Event.create(), Event.create()
        start.record(stream)
        for _ in range(10):
            d2d(dst, src, stream=stream)
        end.record(stream)
        end.synchronize()
        return 2 * n * 10 / (Event.elapsed_ms(start, end) * 1e6)
    finally:
        stream.synchronize()
        stream.close()
        src.free()
        dst.free()


@pytest.mark.parametrize("old", [None, "s3", "pipelined", "regs"])
@pytest.mark.parametrize("model,batch,length", [("27b", 1, 8192), ("27b", 8, 8192), ("27b", 1, 32768),
                                                ("27b", 1, 65536), ("27b", 1, 1000), ("35b", 1, 8192),
                                                ("35b", 8, 8192)])
def test_decode_bandwidth_report(attention, configs, device, copy_gbps, model, batch, length, old):
    """Prints the decode + combine time and the KV bytes per second (a report; nothing timed is asserted).

    The cache and q are zeros, so every score is 0 and the output must be exactly 0."""
    from inferno.cuda.stream import Event

    cfg = configs[model]
    if old == "s3" and device.arch != "sm_90a":
        pytest.skip("the three-stage variants build for sm_90a only")
    attn = {None: lambda: attention(model), "s3": lambda: attention(model, THREE_STAGES[model]),
            "pipelined": lambda: attention(model, PIPELINED[model], "attn_combine_2pass"),
            "regs": lambda: attention(model, REGS[model], "attn_combine_serial")}[old]()
    hq, hkv = cfg.n_heads, cfg.n_kv_heads
    lay = KVLayout(hkv)
    per_seq = lay.pages_for(length)
    pool = device_alloc(batch * per_seq * lay.page_bytes, "kv")
    memset_d8(pool, 0)
    table = to_device(None, np.arange(batch * per_seq, dtype=np.int32).reshape(batch, per_seq), "pt")
    lens = to_device(None, np.full(batch, length, np.int32), "lens")
    splits = av.default_splits(length, batch, hkv, device.sm_count)
    po_b, pl_b = av.partial_bytes(batch, hq, splits)
    q, po, pl = (device_alloc(n, nm) for n, nm in ((batch * hq * 1024, "q"), (po_b, "po"), (pl_b, "pl")))
    gate, out = device_alloc(batch * hq * 512, "gate"), device_alloc(batch * hq * 512, "out")
    for buf in (q, gate):
        memset_d8(buf, 0)
    try:
        def run():
            attn.decode(q, lens, table, pool, po, pl, batch=batch, n_heads=hq, n_kv_heads=hkv,
                        table_width=per_seq, splits=splits)
            attn.combine(po, pl, lens, gate, out, batch=batch, n_heads=hq, splits=splits)

        for _ in range(3):
            run()
        start, end = Event.create(), Event.create()
        iters = 50
        start.record()
        for _ in range(iters):
            run()
        end.record()
        end.synchronize()
        us = Event.elapsed_ms(start, end) * 1e3 / iters
        kv_bytes = batch * length * lay.token_bytes
        print(f"\n{attn.decode.name} + {attn.combine.name} {model} batch {batch} len {length} splits {splits}: "
              f"{us:.1f} us per layer, "
              f"{kv_bytes / us / 1e3:.0f} GB/s of KV ({kv_bytes / 2**20:.1f} MiB), "
              f"{kv_bytes / us / 1e3 / copy_gbps:.0%} of this run's d2d copy {copy_gbps:.0f} GB/s")
        assert not np.any(from_device(out, bfloat16, (batch * hq * 256,)).astype(np.float32))
    finally:
        for buf in (pool, table, lens, q, po, pl, gate, out):
            buf.free()
