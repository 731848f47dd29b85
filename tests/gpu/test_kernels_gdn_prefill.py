"""GPU: the GDN prefill kernels (gdn_conv_prefill, gdn_chunk at every vsplit) vs the numpy reference
(A1's inferno.model.reference.gdn), and prefill followed by decode-kernel steps vs the reference.

Fresh random inputs every run; outputs start poisoned (0xFF: bf16/fp32 NaN) with a poisoned guard
tail; state slots the call does not use are poisoned and must come back bit-identical. T = 1, 63,
64, 65, 200, 1024 with a nonzero initial state; 27B (Hk 16, Hv 48) and 35B-A3B (Hk 16, Hv 32) head
counts. Every check prints its relative and max-abs error (run with -s), and the chunk checks also
print the distance to tests/gdn_prefill_emulation.py (the kernel's own bf16 roundings), so a
failure reads either as "kernel bug" (far from the emulation) or "tolerance" (close to it).
Every vsplit (1, 2, 4: CTAs per value head) runs every chunk case; the split variants are also
compared with vsplit 1 on the same inputs (they differ only in the solve's summation order).

Cubins come from the kernel cache ($INFERNO_KERNEL_DIR); on a machine without the DSL build them
first: `inferno kernels build --arch <gpu arch> --out $INFERNO_KERNEL_DIR` once the registry lists
GDN_PREFILL_VARIANTS, or before that `python -c "from pathlib import Path; from inferno.kernels.build
import build_all; from inferno.kernels.gdn_prefill_variants import GDN_PREFILL_VARIANTS as V;
build_all(list(V), ['sm_90a'], Path('$INFERNO_KERNEL_DIR'))"` (the decode GDN kernels are needed too),
and the other vsplits, which no registry lists: the same with `GDN_CHUNK_VSPLIT_VARIANTS as V`.
"""

import numpy as np
import pytest
from gdn_prefill_emulation import chunk_kernel, gated_out, inputs_to_heads

from inferno.cuda.copy import from_device, h2d, memset_d8
from inferno.cuda.memory import DeviceBuffer, device_alloc
from inferno.kernels.gdn_prefill_variants import (DEFAULT_VSPLIT, GDN_PREFILL_VARIANTS, HEAD_DIM, VSPLITS, GdnChunk,
                                                  GdnConvPrefill, chunk_variant)
from inferno.kernels.gdn_variants import GDN_VARIANTS, GdnConv, GdnStep
from inferno.kernels.reference import bf16
from inferno.model.reference.gdn import causal_conv, chunked_delta_rule, recurrent_delta_rule
from inferno.model.reference.norms import silu

GUARD = 256  # poisoned bytes after every buffer
D = HEAD_DIM
MODELS = [pytest.param(16, 48, id="27B"), pytest.param(16, 32, id="35B")]
LENGTHS = [1, 63, 64, 65, 200, 1024]
N_SLOTS = 3
SLOT = 1
OUT_TOL = 2e-2  # bf16 outputs, relative L2 (the bf16 emulation sits near 3e-3 at T = 65 and 1024)
STATE_TOL = 1e-2  # fp32 state after bf16 tensor-core products, relative L2 (emulation: ~3e-3)
SPLIT_TOL = 1e-2  # vsplit 2/4 vs vsplit 1 on the same inputs, relative L2 (bf16 v_new rounding flips)


@pytest.fixture(scope="module")
def kernels(device):
    """Prefill conv + default chunk launchers and the decode conv + step launchers (found by Variant,
    so they load before the registry lists them)."""
    from inferno.kernels.cache import load

    decode = {v.name: v for v in GDN_VARIANTS}
    assert {v.name for v in GDN_PREFILL_VARIANTS} == {"gdn_conv_prefill", "gdn_chunk"}
    return (GdnConvPrefill.for_device(device), GdnChunk.for_device(device),
            GdnConv(load(decode["gdn_conv"], device)), GdnStep(load(decode["gdn_step"], device)))


@pytest.fixture(scope="module")
def chunks(device):
    """{vsplit: gdn_chunk launcher} for every value split (the default one is `gdn_chunk`)."""
    from inferno.kernels.cache import load

    out = {n: GdnChunk(load(chunk_variant(n), device)) for n in VSPLITS}
    assert out[DEFAULT_VSPLIT].name == "gdn_chunk"
    return out


class Bufs:
    """Device buffers of one test, each followed by a poisoned guard tail; freed together."""

    def __init__(self):
        self.bufs: list[DeviceBuffer] = []

    def up(self, host: np.ndarray, name: str) -> DeviceBuffer:
        host = np.ascontiguousarray(host)
        buf = device_alloc(host.nbytes + GUARD, name)
        self.bufs.append(buf)
        memset_d8(buf, 0xFF)
        h2d(buf, host)
        return buf

    def poisoned(self, nbytes: int, name: str) -> DeviceBuffer:
        return self.up(np.full(nbytes, 0xFF, np.uint8), name)

    @staticmethod
    def read(buf: DeviceBuffer, dtype, shape) -> tuple[np.ndarray, bool]:
        """(contents, guard intact) of a buffer made by `up`/`poisoned`."""
        raw = from_device(buf, np.uint8, (buf.nbytes,))
        body = raw[: buf.nbytes - GUARD]
        return body.view(dtype).reshape(shape), bool(np.all(raw[buf.nbytes - GUARD:] == 0xFF))

    def free(self) -> None:
        for b in self.bufs:
            b.free()


@pytest.fixture
def bufs():
    b = Bufs()
    yield b
    b.free()


def _f32(a: np.ndarray) -> np.ndarray:
    return np.asarray(a).astype(np.float32)


def _report(what: str, out: np.ndarray, ref: np.ndarray) -> tuple[float, str]:
    """Relative L2 error and a one-line diagnosis (max abs error, where, non-finite count)."""
    o, r = _f32(out).astype(np.float64), _f32(ref).astype(np.float64)
    bad = int(np.count_nonzero(~np.isfinite(o)))
    diff = np.abs(np.nan_to_num(o, nan=0.0, posinf=0.0, neginf=0.0) - r)
    at = tuple(int(i) for i in np.unravel_index(int(np.argmax(diff)), diff.shape))
    n = np.linalg.norm(r)
    rel = float("inf") if bad else float(np.linalg.norm(o - r) / (n if n else 1.0))
    line = (f"{what}: rel {rel:.2e}  max_abs {float(diff.max()):.2e} at {at}  max|ref| {float(np.abs(r).max()):.2e}"
            f"  non-finite {bad}")
    print(line)
    return rel, line


def _gates(rng, hv: int) -> tuple[np.ndarray, np.ndarray]:
    """A_log and dt_bias as the model initialises them: A in [1, 16], softplus(dt_bias) in [1e-3, 0.1]."""
    a_log = np.log(rng.uniform(1, 16, hv)).astype(np.float32)
    dt_bias = np.log(np.expm1(rng.uniform(1e-3, 0.1, hv))).astype(np.float32)
    return a_log, dt_bias


def _poisoned_states(rng, shape) -> np.ndarray:
    """[N_SLOTS, ...] fp32: NaN poison everywhere except a random nonzero state in SLOT."""
    st = np.full((N_SLOTS, *shape), 0xFFFFFFFF, np.uint32).view(np.float32)
    st[SLOT] = 0.1 * rng.standard_normal(shape, np.float32)
    return st


def _check_other_slots(got: np.ndarray, before: np.ndarray, what: str) -> None:
    u = got.view(np.uint8 if got.dtype.itemsize == 1 else np.uint16 if got.dtype.itemsize == 2 else np.uint32)
    b = before.view(u.dtype)
    for s in range(N_SLOTS):
        if s != SLOT:
            assert np.array_equal(u[s], b[s]), f"{what}: slot {s}, which the call does not use, changed"


# --- conv ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("hk,hv", MODELS)
@pytest.mark.parametrize("t", [1, 2, 3, 63, 200, 1024])
def test_conv_prefill(device, kernels, bufs, rng, hk, hv, t):
    conv = kernels[0]
    c = 2 * hk * D + hv * D
    xs = c + 64  # padded rows: exercises the row stride
    x = rng.standard_normal((t, xs), np.float32).astype(bf16)
    w = (0.5 * rng.standard_normal((4, c), np.float32)).astype(bf16)
    st = np.full((N_SLOTS, 3, c), 0xFFFF, np.uint16).view(bf16)
    st[SLOT] = rng.standard_normal((3, c), np.float32).astype(bf16)
    dx, dw, dst = bufs.up(x, "x"), bufs.up(w, "conv_w"), bufs.up(st, "conv_state")
    dout = bufs.poisoned(t * c * 2, "out")
    conv(dx, dst, dw, dout, t, c, N_SLOTS, SLOT, x_stride=xs)
    device.synchronize()

    out, out_guard = Bufs.read(dout, bf16, (t, c))
    new_st, st_guard = Bufs.read(dst, bf16, (N_SLOTS, 3, c))
    co, cs = causal_conv(_f32(x[:, :c]), _f32(st[SLOT]).T, _f32(w).T)
    rel, line = _report(f"gdn_conv_prefill hk{hk} hv{hv} T={t}: out", out, silu(co))
    assert out_guard and st_guard, f"{line}; a guard tail was written"
    assert rel <= 1e-2, line
    want = cs.T.astype(bf16)  # the last 3 raw bf16 inputs: exact
    diff = np.argwhere(new_st[SLOT].view(np.uint16) != want.view(np.uint16))
    assert diff.size == 0, (f"conv state differs from the last raw inputs at {len(diff)} places, "
                            f"first {diff[:3].tolist()}")
    _check_other_slots(new_st, st, "conv state")


# --- chunked delta rule ----------------------------------------------------------------------------


def _chunk_inputs(rng, t: int, hk: int, hv: int):
    cq, zw = 2 * hk * D + hv * D, hv * D
    qkv = silu(rng.standard_normal((t, cq), np.float32)).astype(bf16)  # conv outputs are SiLU'd
    z = rng.standard_normal((t, zw), np.float32).astype(bf16)
    ab = rng.standard_normal((t, 2 * hv), np.float32).astype(bf16)  # fused [a | b] projection rows
    a_log, dt_bias = _gates(rng, hv)
    w = (1 + 0.2 * rng.standard_normal(D, np.float32)).astype(bf16)
    return qkv, z, ab, a_log, dt_bias, w


def _run_chunk(chunk, bufs, qkv, z, ab, a_log, dt_bias, w, state, t, hk, hv, eps):
    zw = hv * D
    dab = bufs.up(ab, "ab")
    d_b = DeviceBuffer(dab.ptr + hv * 2, dab.nbytes - hv * 2, "b")  # b = a + Hv inside the fused rows
    dstate = bufs.up(state, "state")
    dout = bufs.poisoned(t * zw * 2, "out")
    chunk(bufs.up(qkv, "qkv"), bufs.up(z, "z"), dab, d_b, bufs.up(a_log, "a_log"), bufs.up(dt_bias, "dt_bias"),
          bufs.up(w, "norm_w"), dstate, dout, t, hk, hv, N_SLOTS, SLOT, eps, a_stride=2 * hv, b_stride=2 * hv)
    return dstate, dout


@pytest.mark.parametrize("vs", VSPLITS)
@pytest.mark.parametrize("hk,hv", MODELS)
@pytest.mark.parametrize("t", LENGTHS)
def test_chunk(device, chunks, bufs, rng, hk, hv, t, vs):
    chunk = chunks[vs]
    eps = 1e-6
    qkv, z, ab, a_log, dt_bias, w = _chunk_inputs(rng, t, hk, hv)
    state = _poisoned_states(rng, (hv, D, D))
    dstate, dout = _run_chunk(chunk, bufs, qkv, z, ab, a_log, dt_bias, w, state, t, hk, hv, eps)
    device.synchronize()

    out, out_guard = Bufs.read(dout, bf16, (t, hv * D))
    new_state, st_guard = Bufs.read(dstate, np.float32, (N_SLOTS, hv, D, D))
    q, k, v, g, beta = inputs_to_heads(_f32(qkv), _f32(ab[:, :hv]), _f32(ab[:, hv:]), a_log, dt_bias, hk, hv)
    rule = recurrent_delta_rule if t == 1 else chunked_delta_rule
    o_ref, s_ref = rule(q, k, v, g, beta, state[SLOT])
    o_emu, s_emu = chunk_kernel(q, k, v, g, beta, state[SLOT])
    name = f"{chunk.name} (vsplit {vs}) hk{hk} hv{hv} T={t}"
    _report(f"{name}: out vs bf16 emulation", out, gated_out(o_emu, z, w, eps))
    _report(f"{name}: state vs bf16 emulation", new_state[SLOT], s_emu)
    rel, line = _report(f"{name}: out", out, gated_out(o_ref, z, w, eps))
    srel, sline = _report(f"{name}: state", new_state[SLOT], s_ref)
    assert out_guard and st_guard, f"{line}; a guard tail was written"
    assert rel <= OUT_TOL, line
    assert srel <= STATE_TOL, sline
    _check_other_slots(new_state, state, "recurrent state")


@pytest.mark.parametrize("vs", [n for n in VSPLITS if n > 1])
@pytest.mark.parametrize("t", [65, 1024])
def test_chunk_split_matches_unsplit(device, chunks, bufs, rng, t, vs):
    """vsplit 2/4 against vsplit 1 on the same inputs (27B heads): every output column and state
    column of every head is written, and close (only the solve's summation order differs)."""
    hk, hv, eps = 16, 48, 1e-6
    qkv, z, ab, a_log, dt_bias, w = _chunk_inputs(rng, t, hk, hv)
    state = _poisoned_states(rng, (hv, D, D))
    got = {}
    for n in (1, vs):
        dstate, dout = _run_chunk(chunks[n], bufs, qkv, z, ab, a_log, dt_bias, w, state, t, hk, hv, eps)
        device.synchronize()
        got[n] = (Bufs.read(dout, bf16, (t, hv * D))[0].copy(),
                  Bufs.read(dstate, np.float32, (N_SLOTS, hv, D, D))[0][SLOT].copy())
    o1, s1 = _f32(got[1][0]).reshape(t, hv, D), got[1][1]
    o2, s2 = _f32(got[vs][0]).reshape(t, hv, D), got[vs][1]
    assert np.all(np.isfinite(o2)) and np.all(np.isfinite(s2)), "the split kernel left non-finite values"
    rel, line = _report(f"gdn_chunk vsplit {vs} vs 1 T={t}: out", o2, o1)
    srel, sline = _report(f"gdn_chunk vsplit {vs} vs 1 T={t}: state", s2, s1)
    dvs = D // vs
    for part in range(vs):  # each CTA's columns, over all heads
        cols = slice(part * dvs, (part + 1) * dvs)
        prel = float(np.linalg.norm(o2[..., cols] - o1[..., cols]) / np.linalg.norm(o1[..., cols]))
        psrel = float(np.linalg.norm(s2[..., cols] - s1[..., cols]) / np.linalg.norm(s1[..., cols]))
        assert prel <= SPLIT_TOL and psrel <= SPLIT_TOL, (
            f"vsplit {vs} part {part}: out rel {prel:.2e}, state rel {psrel:.2e}")
    assert rel <= SPLIT_TOL, line
    assert srel <= SPLIT_TOL, sline


# --- prefill, then decode steps: the whole GDN mixer path against the reference ---------------------


@pytest.mark.parametrize("hk,hv", MODELS)
def test_prefill_then_decode_matches_reference(device, kernels, bufs, rng, hk, hv):
    """conv_prefill + chunk over 130 prompt tokens, then 3 tokens through the decode conv + step,
    against causal_conv + the delta rule over all 133 tokens (fp32 from the raw bf16 inputs)."""
    conv_p, chunk, conv_d, step = kernels
    t, n_dec, eps = 130, 3, 1e-6
    c, zw = 2 * hk * D + hv * D, hv * D
    total = t + n_dec
    x = rng.standard_normal((total, c), np.float32).astype(bf16)  # raw conv inputs (in_proj_qkv rows)
    cw = (0.5 * rng.standard_normal((4, c), np.float32)).astype(bf16)
    z = rng.standard_normal((total, zw), np.float32).astype(bf16)
    ab = rng.standard_normal((total, 2 * hv), np.float32).astype(bf16)
    a_log, dt_bias = _gates(rng, hv)
    w = (1 + 0.2 * rng.standard_normal(D, np.float32)).astype(bf16)
    cst = np.zeros((N_SLOTS, 3, c), bf16)
    cst[SLOT] = rng.standard_normal((3, c), np.float32).astype(bf16)
    state = _poisoned_states(rng, (hv, D, D))

    dx, dcw, dcst = bufs.up(x, "x"), bufs.up(cw, "conv_w"), bufs.up(cst, "conv_state")
    dz, dab, dstate = bufs.up(z, "z"), bufs.up(ab, "ab"), bufs.up(state, "state")
    dal, ddt, dw = bufs.up(a_log, "a_log"), bufs.up(dt_bias, "dt_bias"), bufs.up(w, "norm_w")
    d_b = DeviceBuffer(dab.ptr + hv * 2, dab.nbytes - hv * 2, "b")
    dqkv = bufs.poisoned(total * c * 2, "qkv")
    dout = bufs.poisoned(total * zw * 2, "out")
    dslot = bufs.up(np.array([SLOT], np.int32), "slots")

    conv_p(dx, dcst, dcw, dqkv, t, c, N_SLOTS, SLOT)
    chunk(dqkv, dz, dab, d_b, dal, ddt, dw, dstate, dout, t, hk, hv, N_SLOTS, SLOT, eps,
          a_stride=2 * hv, b_stride=2 * hv)
    for i in range(t, total):  # decode rows i of the same buffers
        row = lambda buf, width: DeviceBuffer(buf.ptr + i * width * 2, width * 2, buf.name)  # noqa: E731
        ab_row = row(dab, 2 * hv)
        conv_d(row(dx, c), dcst, dcw, dslot, row(dqkv, c), 1, c, N_SLOTS)
        step(row(dqkv, c), row(dz, zw), ab_row, DeviceBuffer(ab_row.ptr + hv * 2, hv * 2, "b"), dal, ddt, dw,
             dstate, dslot, row(dout, zw), 1, hk, hv, N_SLOTS, eps)
    device.synchronize()

    out, _ = Bufs.read(dout, bf16, (total, zw))
    new_state, st_guard = Bufs.read(dstate, np.float32, (N_SLOTS, hv, D, D))
    new_cst, cst_guard = Bufs.read(dcst, bf16, (N_SLOTS, 3, c))
    co, cs = causal_conv(_f32(x), _f32(cst[SLOT]).T, _f32(cw).T)
    q, k, v, g, beta = inputs_to_heads(silu(co), _f32(ab[:, :hv]), _f32(ab[:, hv:]), a_log, dt_bias, hk, hv)
    o_ref, s_ref = recurrent_delta_rule(q, k, v, g, beta, state[SLOT])
    y_ref = gated_out(o_ref, z, w, eps)
    name = f"prefill {t} + decode {n_dec} hk{hk} hv{hv}"
    rel_p, line_p = _report(f"{name}: prefill rows", out[:t], y_ref[:t])
    rel_d, line_d = _report(f"{name}: decode rows", out[t:], y_ref[t:])
    rel_s, line_s = _report(f"{name}: final state", new_state[SLOT], s_ref)
    assert st_guard and cst_guard, "a guard tail was written"
    assert rel_p <= OUT_TOL, line_p
    assert rel_d <= OUT_TOL, line_d
    assert rel_s <= STATE_TOL, line_s
    want = cs.T.astype(bf16)
    assert np.array_equal(new_cst[SLOT].view(np.uint16), want.view(np.uint16)), "final conv window differs"
    _check_other_slots(new_state, state, "recurrent state")


# --- time ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("hk,hv", MODELS)
def test_prefill_time(device, kernels, chunks, bufs, rng, hk, hv):
    """Time of one GDN layer's prefill kernels over 1024 tokens, gdn_chunk at every vsplit (printed;
    checked only loosely)."""
    from inferno.cuda.stream import Event, Stream

    conv_p = kernels[0]
    t, eps, reps = 1024, 1e-6, 10
    c, zw = 2 * hk * D + hv * D, hv * D
    qkv, z, ab, a_log, dt_bias, w = _chunk_inputs(rng, t, hk, hv)
    dx = bufs.up(qkv, "x")
    dcw = bufs.up((0.5 * rng.standard_normal((4, c), np.float32)).astype(bf16), "conv_w")
    dcst = bufs.up(np.zeros((N_SLOTS, 3, c), bf16), "conv_state")
    dqkv = bufs.poisoned(t * c * 2, "qkv")
    args = [bufs.up(z, "z"), bufs.up(ab, "ab")]
    d_b = DeviceBuffer(args[1].ptr + hv * 2, args[1].nbytes - hv * 2, "b")
    rest = [bufs.up(a_log, "a_log"), bufs.up(dt_bias, "dt_bias"), bufs.up(w, "norm_w"),
            bufs.up(np.zeros((N_SLOTS, hv, D, D), np.float32), "state"), bufs.poisoned(t * zw * 2, "out")]
    stream = Stream.create()
    times = {}
    cases = [("gdn_conv_prefill", lambda: conv_p(dx, dcst, dcw, dqkv, t, c, N_SLOTS, SLOT, stream=stream))]
    for n, ch in chunks.items():
        cases.append((f"gdn_chunk vsplit {n}", lambda ch=ch: ch(dqkv, args[0], args[1], d_b, *rest, t, hk, hv, N_SLOTS,
                                                             SLOT, eps, a_stride=2 * hv, b_stride=2 * hv,
                                                             stream=stream)))
    for name, fn in cases:
        fn()
        start, end = Event.create(), Event.create()
        start.record(stream)
        for _ in range(reps):
            fn()
        end.record(stream)
        end.synchronize()
        times[name] = Event.elapsed_ms(start, end) * 1e3 / reps
    stream.close()
    flops = hv * (t // 64) * 2 * 64 * (128 * 128 * 2 + 64 * 128 * 2 + 128 * 64 + 128 * 128)
    for n in chunks:
        us = times[f"gdn_chunk vsplit {n}"]
        print(f"GDN prefill hk{hk} hv{hv} T={t}: conv {times['gdn_conv_prefill']:.1f} us, chunk vsplit {n} "
              f"{us:.1f} us ({flops / us / 1e6:.1f} TFLOP/s on the mma products, "
              f"{times['gdn_chunk vsplit 1'] / us:.2f}x vsplit 1); "
              f"x48 layers = {48 * (times['gdn_conv_prefill'] + us) / 1e3:.2f} ms per 1024-token chunk")
    out, _ = Bufs.read(rest[-1], bf16, (t, zw))
    assert np.all(np.isfinite(_f32(out))), "the timed runs wrote non-finite outputs"
    slowest = max(v for k, v in times.items() if k.startswith("gdn_chunk"))
    assert slowest < 5e4, "gdn_chunk took over 50 ms for 1024 tokens"
