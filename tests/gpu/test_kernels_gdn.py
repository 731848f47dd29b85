"""GPU: the GDN decode kernels (gdn_conv, gdn_step, the fused gdn_conv_step family) vs the numpy
reference (inferno.model.reference).

Fresh random inputs every run; outputs start poisoned (0xFF: bf16/fp32 NaN) with a poisoned guard
tail; state slots that the batch does not use are poisoned too and must come back bit-identical,
the used ones are compared with the reference. 27B (Hk 16, Hv 48) and 35B-A3B (Hk 16, Hv 32) head
counts, batch 1 and 4 with scattered slot ids, and several consecutive tokens through conv + step
against the reference layer. Every check prints its errors (run with -s to see them).

Cubins come from the kernel cache ($INFERNO_KERNEL_DIR); on a machine without the DSL build them
first: `inferno kernels build --arch <gpu arch> --out $INFERNO_KERNEL_DIR`.
"""

from types import SimpleNamespace

import numpy as np
import pytest

from inferno.cuda.copy import from_device, h2d, memset_d8
from inferno.cuda.memory import DeviceBuffer, device_alloc
from inferno.kernels.gdn_variants import GDN_VARIANTS, HEAD_DIM, GdnConv, GdnConvStep, GdnStep
from inferno.kernels.reference import bf16
from inferno.model.executor import GdnState
from inferno.model.reference.gdn import GdnWeights, causal_conv, gdn_layer, recurrent_delta_rule
from inferno.model.reference.norms import gated_rms_norm, l2_normalize, sigmoid, silu, softplus

GUARD = 256  # poisoned bytes after every buffer the kernels write
D = HEAD_DIM
MODELS = [pytest.param(16, 48, id="27B"), pytest.param(16, 32, id="35B")]
SLOTS = [pytest.param([3], id="b1"), pytest.param([5, 0, 3, 6], id="b4")]
N_SLOTS = 7
OUT_TOL = 1e-2  # bf16 outputs: relative L2 error
STATE_TOL = 2e-5  # fp32 state, one step: relative L2 error


@pytest.fixture(scope="module")
def kernels(device):
    """(conv, step) launchers; the GDN variants are found even before the registry lists them."""
    from inferno.kernels import cache, registry

    with pytest.MonkeyPatch.context() as mp:
        if not {v.name for v in GDN_VARIANTS} <= {v.name for v in registry.VARIANTS}:
            extra = {v.name: v for v in GDN_VARIANTS}
            mp.setattr(cache, "get", lambda name: extra.get(name) or registry.get(name))
        yield GdnConv.for_device(device), GdnStep.for_device(device)


FUSED = [v.name for v in GDN_VARIANTS if v.op == "gdn_conv_step" and not v.config.get("sums")]


@pytest.fixture(scope="module", params=FUSED)
def fused(device, request):
    """A fused conv + step launcher, one per gdn_conv_step variant."""
    from inferno.kernels import cache, registry

    with pytest.MonkeyPatch.context() as mp:
        if request.param not in {v.name for v in registry.VARIANTS}:
            extra = {v.name: v for v in GDN_VARIANTS}
            mp.setattr(cache, "get", lambda name: extra.get(name) or registry.get(name))
        yield GdnConvStep.for_device(device, request.param)


# --- device buffers with guards -------------------------------------------------------------------


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


def _rel(out: np.ndarray, ref: np.ndarray) -> float:
    o, r = _f32(out).astype(np.float64), _f32(ref).astype(np.float64)
    if not np.all(np.isfinite(o)):
        return float("inf")
    n = np.linalg.norm(r)
    return float(np.linalg.norm(o - r) / (n if n else 1.0))


def _report(what: str, out: np.ndarray, ref: np.ndarray) -> tuple[float, str]:
    """Relative L2 error and a one-line diagnosis (max abs error, where, NaN count)."""
    o, r = _f32(out), _f32(ref)
    nan = int(np.count_nonzero(~np.isfinite(o)))
    diff = np.abs(np.nan_to_num(o, nan=0.0, posinf=0.0, neginf=0.0) - r)
    at = np.unravel_index(int(np.argmax(diff)), diff.shape) if diff.size else ()
    rel = _rel(out, ref)
    worst = float(diff.max()) if diff.size else 0.0
    line = (f"{what}: rel {rel:.2e}  max_abs {worst:.2e} at {tuple(int(i) for i in at)}"
            f"  max|ref| {float(np.abs(r).max()):.2e}  non-finite {nan}")
    print(line)
    return rel, line


# --- numpy references (A1's functions) ------------------------------------------------------------


def _ref_step(qkv: np.ndarray, z: np.ndarray, a: np.ndarray, b: np.ndarray, a_log: np.ndarray,
              dt_bias: np.ndarray, w: np.ndarray, state: np.ndarray, hk: int, hv: int, eps: float):
    """One decode token of one sequence from the bf16 kernel inputs: (out [Hv*dv], new state)."""
    f = _f32(qkv)
    q = l2_normalize(f[: hk * D].reshape(hk, D)) * np.float32(D**-0.5)
    k = l2_normalize(f[hk * D: 2 * hk * D].reshape(hk, D))
    v = f[2 * hk * D: 2 * hk * D + hv * D].reshape(hv, D)
    q, k = (np.repeat(x, hv // hk, axis=0) for x in (q, k))
    g = -np.exp(a_log) * softplus(_f32(a) + dt_bias)
    o, s = recurrent_delta_rule(q[:, None], k[:, None], v[:, None], g[:, None], sigmoid(_f32(b))[:, None], state)
    return gated_rms_norm(o[:, 0], _f32(z).reshape(hv, D), _f32(w), eps).reshape(-1), s


def _gates(rng, hv: int) -> tuple[np.ndarray, np.ndarray]:
    """A_log and dt_bias as the model initialises them: A in [1, 16], softplus(dt_bias) in [1e-3, 0.1]."""
    a_log = np.log(rng.uniform(1, 16, hv)).astype(np.float32)
    dt_bias = np.log(np.expm1(rng.uniform(1e-3, 0.1, hv))).astype(np.float32)
    return a_log, dt_bias


# --- conv ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("hk,hv", MODELS)
@pytest.mark.parametrize("slots", SLOTS)
def test_conv(device, kernels, bufs, rng, hk, hv, slots):
    conv, _ = kernels
    c = 2 * hk * D + hv * D
    nb, xs = len(slots), c + 64  # x rows padded: the launcher's row stride
    x = rng.standard_normal((nb, xs), np.float32).astype(bf16)
    w = (0.5 * rng.standard_normal((4, c), np.float32)).astype(bf16)
    st = rng.standard_normal((N_SLOTS, 3, c), np.float32).astype(bf16)
    dx, dw, dst = bufs.up(x, "x"), bufs.up(w, "conv_w"), bufs.up(st, "conv_state")
    dslots = bufs.up(np.array(slots, np.int32), "slots")
    dout = bufs.poisoned(nb * c * 2, "out")
    conv(dx, dst, dw, dslots, dout, nb, c, N_SLOTS, x_stride=xs)
    device.synchronize()

    out, out_guard = Bufs.read(dout, bf16, (nb, c))
    new_st, st_guard = Bufs.read(dst, bf16, (N_SLOTS, 3, c))
    ref = np.empty((nb, c), np.float32)
    want_st = st.copy()
    for i, s in enumerate(slots):
        co, cs = causal_conv(_f32(x[i, :c])[None], _f32(st[s]).T, _f32(w).T)
        ref[i] = silu(co[0])
        want_st[s] = cs.T.astype(bf16)  # the raw bf16 inputs: exact
    rel, line = _report(f"gdn_conv hk{hk} hv{hv} slots {slots}: out", out, ref)
    assert out_guard and st_guard, f"{line}; a guard tail was written"
    assert rel <= OUT_TOL, line
    changed = np.argwhere(new_st.view(np.uint16) != want_st.view(np.uint16))
    assert changed.size == 0, (f"conv state differs from the shifted window at {len(changed)} places, "
                               f"first {changed[:3].tolist()}")


# --- fused step ----------------------------------------------------------------------------------


@pytest.mark.parametrize("hk,hv", MODELS)
@pytest.mark.parametrize("slots", SLOTS)
def test_step(device, kernels, bufs, rng, hk, hv, slots):
    _, step = kernels
    nb, cq, zw, eps = len(slots), 2 * hk * D + hv * D, hv * D, 1e-6
    qkv = rng.standard_normal((nb, cq), np.float32).astype(bf16)
    z = rng.standard_normal((nb, zw), np.float32).astype(bf16)
    ab = rng.standard_normal((nb, 2 * hv), np.float32).astype(bf16)  # fused [a | b] projection rows
    a_log, dt_bias = _gates(rng, hv)
    w = (1 + 0.2 * rng.standard_normal(D, np.float32)).astype(bf16)
    # Unused slots hold NaN poison (0xFF bytes) and must not change; used slots get random states.
    state = np.full((N_SLOTS, hv, D, D), 0xFFFFFFFF, np.uint32).view(np.float32)
    for s in slots:
        state[s] = 0.1 * rng.standard_normal((hv, D, D), np.float32)
    dab = bufs.up(ab, "ab")
    d_b = dab.view(hv * 2, dab.nbytes - hv * 2, "b")  # b = a + Hv inside the fused rows
    dstate = bufs.up(state, "state")
    dout = bufs.poisoned(nb * zw * 2, "out")
    step(bufs.up(qkv, "qkv"), bufs.up(z, "z"), dab, d_b, bufs.up(a_log, "a_log"), bufs.up(dt_bias, "dt_bias"),
         bufs.up(w, "norm_w"), dstate, bufs.up(np.array(slots, np.int32), "slots"), dout, nb, hk, hv, N_SLOTS,
         eps, a_stride=2 * hv, b_stride=2 * hv)
    device.synchronize()

    out, out_guard = Bufs.read(dout, bf16, (nb, zw))
    new_state, st_guard = Bufs.read(dstate, np.float32, state.shape)
    ref_out = np.empty((nb, zw), np.float32)
    fails = []
    for i, s in enumerate(slots):
        ref_out[i], ref_state = _ref_step(qkv[i], z[i], ab[i, :hv], ab[i, hv:], a_log, dt_bias, w, state[s],
                                          hk, hv, eps)
        rel, line = _report(f"gdn_step hk{hk} hv{hv} seq {i} slot {s}: state", new_state[s], ref_state)
        if rel > STATE_TOL:
            fails.append(line)
    rel, line = _report(f"gdn_step hk{hk} hv{hv} slots {slots}: out", out, ref_out)
    if rel > OUT_TOL:
        fails.append(line)
    unused = [s for s in range(N_SLOTS) if s not in slots]
    touched = [s for s in unused if not np.array_equal(new_state[s].view(np.uint32), state[s].view(np.uint32))]
    assert out_guard and st_guard, "a guard tail was written"
    assert not touched, f"state slots {touched} are not in the batch but were written"
    assert not fails, "; ".join(fails)


# --- several consecutive tokens: conv + step against the reference layer ------------------------


def _layer_weights(rng, hidden: int, hk: int, hv: int) -> GdnWeights:
    c = 2 * hk * D + hv * D

    def mat(n_in: int, n_out: int) -> np.ndarray:
        return (rng.standard_normal((n_in, n_out), np.float32) / np.sqrt(n_in)).astype(np.float32)

    a_log, dt_bias = _gates(rng, hv)
    # Weights the kernels read in bf16 are made bf16-exact so both sides use the same values.
    return GdnWeights(
        in_proj_qkv=mat(hidden, c), in_proj_z=mat(hidden, hv * D), in_proj_b=mat(hidden, hv),
        in_proj_a=mat(hidden, hv), conv=_f32((0.5 * rng.standard_normal((c, 4), np.float32)).astype(bf16)),
        a_log=a_log, dt_bias=dt_bias, norm=_f32((1 + 0.2 * rng.standard_normal(D, np.float32)).astype(bf16)),
        out_proj=mat(hv * D, hidden))


@pytest.mark.parametrize("hk,hv", MODELS)
def test_consecutive_tokens_match_reference_layer(device, kernels, bufs, rng, hk, hv):
    conv, step = kernels
    hidden, tokens, slots, eps = 256, 6, [4, 0, 2], 1e-6
    nb, c, zw = len(slots), 2 * hk * D + hv * D, hv * D
    wts = _layer_weights(rng, hidden, hk, hv)
    cfg = SimpleNamespace(gdn_k_heads=hk, gdn_v_heads=hv, gdn_k_dim=D, gdn_v_dim=D, gdn_key_width=hk * D,
                          rms_eps=eps)
    # Carried-in states: bf16-exact conv windows, small random recurrent states.
    conv_state = rng.standard_normal((N_SLOTS, 3, c), np.float32).astype(bf16)
    rec_state = (0.05 * rng.standard_normal((N_SLOTS, hv, D, D), np.float32)).astype(np.float32)
    ref_states = [GdnState(conv=_f32(conv_state[s]).T.copy(), recurrent=rec_state[s].copy()) for s in slots]

    dconv_w = bufs.up(_f32(wts.conv).T.astype(bf16), "conv_w")
    dconv_st, dstate = bufs.up(conv_state, "conv_state"), bufs.up(rec_state, "state")
    dslots = bufs.up(np.array(slots, np.int32), "slots")
    dalog, ddt = bufs.up(wts.a_log, "a_log"), bufs.up(wts.dt_bias, "dt_bias")
    dnw = bufs.up(wts.norm.astype(bf16), "norm_w")
    dmixed, dqkv = bufs.poisoned(nb * c * 2, "mixed"), bufs.poisoned(nb * c * 2, "qkv")
    dz, da, db = bufs.poisoned(nb * zw * 2, "z"), bufs.poisoned(nb * hv * 2, "a"), bufs.poisoned(nb * hv * 2, "b")
    dout = bufs.poisoned(nb * zw * 2, "out")

    fails = []
    for t in range(tokens):
        x = rng.standard_normal((nb, hidden), np.float32)
        # The projections (another kernel's job) are done here and rounded to bf16 as the GEMV emits them.
        h2d(dmixed, (x @ wts.in_proj_qkv).astype(bf16))
        h2d(dz, (x @ wts.in_proj_z).astype(bf16))
        h2d(da, (x @ wts.in_proj_a).astype(bf16))
        h2d(db, (x @ wts.in_proj_b).astype(bf16))
        memset_d8(dout, 0xFF, nb * zw * 2)
        conv(dmixed, dconv_st, dconv_w, dslots, dqkv, nb, c, N_SLOTS)
        step(dqkv, dz, da, db, dalog, ddt, dnw, dstate, dslots, dout, nb, hk, hv, N_SLOTS, eps)
        device.synchronize()
        out, guard = Bufs.read(dout, bf16, (nb, zw))
        assert guard, f"token {t}: out guard tail written"
        y = _f32(out) @ wts.out_proj
        ref = np.stack([gdn_layer(x[i: i + 1], wts, cfg, ref_states[i])[0] for i in range(nb)])
        rel, line = _report(f"gdn conv+step hk{hk} hv{hv} token {t}: layer output", y, ref)
        if rel > 3 * OUT_TOL:
            fails.append(line)

    new_state, _ = Bufs.read(dstate, np.float32, rec_state.shape)
    new_conv, _ = Bufs.read(dconv_st, bf16, conv_state.shape)
    for i, s in enumerate(slots):
        rel, line = _report(f"gdn conv+step hk{hk} hv{hv} slot {s}: state after {tokens} tokens",
                            new_state[s], ref_states[i].recurrent)
        if rel > OUT_TOL:
            fails.append(line)
        rel, line = _report(f"gdn conv+step slot {s}: conv window", new_conv[s], ref_states[i].conv.T)
        if rel > 1e-2:
            fails.append(line)
    for s in set(range(N_SLOTS)) - set(slots):
        if not (np.array_equal(new_state[s], rec_state[s]) and
                np.array_equal(new_conv[s].view(np.uint16), conv_state[s].view(np.uint16))):
            fails.append(f"slot {s} is not in the batch but its state changed")
    assert not fails, "; ".join(fails)


# --- fused conv + step: several tokens in a row, states carried ----------------------------------


@pytest.mark.parametrize("hk,hv", MODELS)
@pytest.mark.parametrize("slots", SLOTS)
def test_conv_step(device, fused, bufs, rng, hk, hv, slots):
    """Fresh inputs each token; outputs poisoned before each call; the conv window and the fp32 state
    carried on the device and in the reference; slots outside the batch hold NaN poison and must
    come back bit-identical; the sync counters must be zero after every call."""
    nb, c, zw, eps, tokens = len(slots), 2 * hk * D + hv * D, hv * D, 1e-6, 4
    row = c + zw + 2 * hv + 8  # one padded fused projection row: x | z | a | b
    a_log, dt_bias = _gates(rng, hv)
    w = (1 + 0.2 * rng.standard_normal(D, np.float32)).astype(bf16)
    conv_w = (0.5 * rng.standard_normal((4, c), np.float32)).astype(bf16)
    conv_st = np.full((N_SLOTS, 3, c), 0xFFFF, np.uint16).view(bf16)
    state = np.full((N_SLOTS, hv, D, D), 0xFFFFFFFF, np.uint32).view(np.float32)
    for s in slots:
        conv_st[s] = rng.standard_normal((3, c), np.float32).astype(bf16)
        state[s] = 0.1 * rng.standard_normal((hv, D, D), np.float32)
    ref_conv = {s: _f32(conv_st[s]) for s in slots}
    ref_state = {s: state[s].copy() for s in slots}
    dmix = bufs.poisoned(nb * row * 2, "mix")
    dz = dmix.view(c * 2, dmix.nbytes - c * 2, "z")
    da = dmix.view((c + zw) * 2, dmix.nbytes - (c + zw) * 2, "a")
    db = dmix.view((c + zw + hv) * 2, dmix.nbytes - (c + zw + hv) * 2, "b")
    dconv_st, dstate = bufs.up(conv_st, "conv_state"), bufs.up(state, "state")
    dconv_w, dnw = bufs.up(conv_w, "conv_w"), bufs.up(w, "norm_w")
    dalog, ddt = bufs.up(a_log, "a_log"), bufs.up(dt_bias, "dt_bias")
    dslots = bufs.up(np.array(slots, np.int32), "slots")
    dsync = bufs.up(np.zeros(nb * hk, np.int32), "sync")
    dout = bufs.poisoned(nb * zw * 2, "out")
    fails = []
    for t in range(tokens):
        mix = rng.standard_normal((nb, row), np.float32).astype(bf16)
        h2d(dmix, mix)
        memset_d8(dout, 0xFF, nb * zw * 2)
        fused(dmix, dconv_st, dconv_w, dz, da, db, dalog, ddt, dnw, dstate, dslots, dsync, dout, nb, hk, hv, N_SLOTS,
              eps, x_stride=row, z_stride=row, a_stride=row, b_stride=row)
        device.synchronize()
        out, out_guard = Bufs.read(dout, bf16, (nb, zw))
        sync, _ = Bufs.read(dsync, np.int32, (nb * hk,))
        if not out_guard:
            fails.append(f"token {t}: out guard tail written")
        if np.any(sync):
            fails.append(f"token {t}: sync counters not back to zero: {np.flatnonzero(sync)[:8].tolist()}")
        ref_out = np.empty((nb, zw), np.float32)
        for i, s in enumerate(slots):
            x = _f32(mix[i, :c])
            co, cs = causal_conv(x[None], ref_conv[s].T, _f32(conv_w).T)
            ref_conv[s] = cs.T
            ref_out[i], ref_state[s] = _ref_step(silu(co[0]), mix[i, c: c + zw], mix[i, c + zw: c + zw + hv],
                                                 mix[i, c + zw + hv: c + zw + 2 * hv],
                                                 a_log, dt_bias, w, ref_state[s], hk, hv, eps)
        rel, line = _report(f"{fused.name} hk{hk} hv{hv} slots {slots} token {t}: out", out, ref_out)
        if rel > OUT_TOL:
            fails.append(line)
    new_conv, conv_guard = Bufs.read(dconv_st, bf16, conv_st.shape)
    new_state, st_guard = Bufs.read(dstate, np.float32, state.shape)
    for s in slots:
        rel, line = _report(f"{fused.name} hk{hk} hv{hv} slot {s}: state after {tokens} tokens", new_state[s],
                            ref_state[s])
        if rel > tokens * STATE_TOL:
            fails.append(line)
        changed = np.argwhere(new_conv[s].view(np.uint16) != ref_conv[s].astype(bf16).view(np.uint16))
        if changed.size:
            fails.append(f"slot {s}: conv window differs at {len(changed)} places, first {changed[:3].tolist()}")
    for s in set(range(N_SLOTS)) - set(slots):
        if not (np.array_equal(new_state[s].view(np.uint32), state[s].view(np.uint32)) and
                np.array_equal(new_conv[s].view(np.uint16), conv_st[s].view(np.uint16))):
            fails.append(f"slot {s} is not in the batch but its state changed")
    assert conv_guard and st_guard, "a state guard tail was written"
    assert not fails, "; ".join(fails)


@pytest.mark.parametrize("hk,hv", MODELS)
def test_conv_step_sums_equals_bf16_inputs(device, bufs, rng, hk, hv):
    """gdn_conv_step_sums on fp32 x and z (an accumulating GEMV's sums) is gdn_conv_step on their bf16
    roundings, bit for bit (out, conv window, state), token after token; it leaves the sums zero (guards
    intact), so the next layer's GEMV adds into zeros."""
    from inferno.kernels import cache, registry

    nb, c, zw, eps, slot = 1, 2 * hk * D + hv * D, hv * D, 1e-6, 3
    with pytest.MonkeyPatch.context() as mp:
        if "gdn_conv_step_sums" not in {v.name for v in registry.VARIANTS}:
            extra = {v.name: v for v in GDN_VARIANTS}
            mp.setattr(cache, "get", lambda name: extra.get(name) or registry.get(name))
        plain, sums = GdnConvStep.for_device(device), GdnConvStep.for_device(device, "gdn_conv_step_sums")
    a_log, dt_bias = _gates(rng, hv)
    w = (1 + 0.2 * rng.standard_normal(D, np.float32)).astype(bf16)
    conv_w = (0.5 * rng.standard_normal((4, c), np.float32)).astype(bf16)
    conv_st = rng.standard_normal((N_SLOTS, 3, c), np.float32).astype(bf16)
    state = 0.1 * rng.standard_normal((N_SLOTS, hv, D, D), np.float32)
    shared = [bufs.up(conv_w, "conv_w")]
    tail = [bufs.up(a_log, "a_log"), bufs.up(dt_bias, "dt_bias"), bufs.up(w, "norm_w")]
    runs = {}
    for name in ("plain", "sums"):
        runs[name] = dict(conv=bufs.up(conv_st, f"conv_state {name}"), state=bufs.up(state, f"state {name}"),
                          sync=bufs.up(np.zeros(hk, np.int32), f"sync {name}"),
                          out=bufs.poisoned(zw * 2, f"out {name}"))
    dslots = bufs.up(np.array([slot], np.int32), "slots")
    for t in range(3):
        x = (rng.standard_normal(c) * 2).astype(np.float32)
        z = (rng.standard_normal(zw) * 2).astype(np.float32)
        ab = rng.standard_normal(2 * hv, np.float32).astype(bf16)
        dab = bufs.up(ab, "ab")
        da, db = dab.view(0, hv * 2, "a"), dab.view(hv * 2, dab.nbytes - hv * 2, "b")
        dx16, dz16 = bufs.up(x.astype(bf16), "x bf16"), bufs.up(z.astype(bf16), "z bf16")
        dx32, dz32 = bufs.up(x, "x sums"), bufs.up(z, "z sums")
        for name, k, dx, dz in (("plain", plain, dx16, dz16), ("sums", sums, dx32, dz32)):
            r = runs[name]
            k(dx, r["conv"], shared[0], dz, da, db, *tail, r["state"], dslots, r["sync"], r["out"], nb, hk, hv,
              N_SLOTS, eps)
        device.synchronize()
        for what, dtype, shape in (("out", np.uint16, (zw,)), ("conv", np.uint16, conv_st.shape),
                                   ("state", np.uint32, state.shape)):
            got, g1 = Bufs.read(runs["sums"][what], dtype, shape)
            want, g2 = Bufs.read(runs["plain"][what], dtype, shape)
            assert g1 and g2, f"token {t}: {what} guard tail written"
            diff = np.flatnonzero(got != want)
            assert diff.size == 0, f"hk{hk} hv{hv} token {t}: {what} differs at {diff.size} places, first {diff[:4]}"
        for what, buf, n in (("x", dx32, c), ("z", dz32, zw)):
            left, guard = Bufs.read(buf, np.float32, (n,))
            assert guard and not np.any(left), f"token {t}: {np.count_nonzero(left)} {what} sums not zeroed"


def test_conv_step_graph_replays(device, bufs, rng):
    """The default fused variant (a cluster launch) captured once in a CUDA graph and replayed three
    times on the same inputs equals three reference tokens: the executor's way of running it."""
    from inferno.cuda.graph import Graph
    from inferno.cuda.stream import Stream

    fused = GdnConvStep.for_device(device)
    hk, hv, slots, eps, reps = 16, 48, [2, 5], 1e-6, 3
    nb, c, zw = len(slots), 2 * hk * D + hv * D, hv * D
    a_log, dt_bias = _gates(rng, hv)
    w = (1 + 0.2 * rng.standard_normal(D, np.float32)).astype(bf16)
    conv_w = (0.5 * rng.standard_normal((4, c), np.float32)).astype(bf16)
    x = rng.standard_normal((nb, c), np.float32).astype(bf16)
    z = rng.standard_normal((nb, zw), np.float32).astype(bf16)
    ab = rng.standard_normal((nb, 2 * hv), np.float32).astype(bf16)
    conv_st = rng.standard_normal((N_SLOTS, 3, c), np.float32).astype(bf16)
    state = (0.1 * rng.standard_normal((N_SLOTS, hv, D, D), np.float32)).astype(np.float32)
    dab = bufs.up(ab, "ab")
    dconv_st, dstate = bufs.up(conv_st, "conv_state"), bufs.up(state, "state")
    dsync, dout = bufs.up(np.zeros(nb * hk, np.int32), "sync"), bufs.poisoned(nb * zw * 2, "out")
    args = (bufs.up(x, "x"), dconv_st, bufs.up(conv_w, "conv_w"), bufs.up(z, "z"), dab,
            dab.view(hv * 2, dab.nbytes - hv * 2, "b"), bufs.up(a_log, "a_log"), bufs.up(dt_bias, "dt_bias"),
            bufs.up(w, "norm_w"), dstate, bufs.up(np.array(slots, np.int32), "slots"), dsync, dout)
    stream = Stream.create()
    try:
        with Graph.capture(stream) as g:
            fused(*args, nb, hk, hv, N_SLOTS, eps, a_stride=2 * hv, b_stride=2 * hv, stream=stream)
        ge = g.instantiate()
        for _ in range(reps):
            ge.launch(stream)
        stream.synchronize()
        ge.close()
        g.close()
    finally:
        stream.close()
    out, _ = Bufs.read(dout, bf16, (nb, zw))
    new_state, _ = Bufs.read(dstate, np.float32, state.shape)
    new_conv, _ = Bufs.read(dconv_st, bf16, conv_st.shape)
    sync, _ = Bufs.read(dsync, np.int32, (nb * hk,))
    fails = [] if not np.any(sync) else [f"sync counters not back to zero: {sync.tolist()}"]
    for i, s in enumerate(slots):
        win, st = _f32(conv_st[s]), state[s].copy()
        for _ in range(reps):
            co, cs = causal_conv(_f32(x[i])[None], win.T, _f32(conv_w).T)
            win = cs.T
            ref_out, st = _ref_step(silu(co[0]), z[i], ab[i, :hv], ab[i, hv:], a_log, dt_bias, w, st, hk, hv, eps)
        for what, got, want, tol in (("out", out[i], ref_out, OUT_TOL), ("state", new_state[s], st, reps * STATE_TOL)):
            rel, line = _report(f"{fused.name} graph x{reps} slot {s}: {what}", got, want)
            if rel > tol:
                fails.append(line)
        if not np.array_equal(new_conv[s].view(np.uint16), win.astype(bf16).view(np.uint16)):
            fails.append(f"slot {s}: conv window differs from the reference after {reps} replays")
    assert not fails, "; ".join(fails)


def test_conv_step_back_to_back_layers(device, fused, bufs, rng):
    """Each fused variant as the executor runs it: several layers (own conv weights, windows and states,
    one shared `sync` buffer) launched back to back with PDL into one CUDA graph, replayed for several
    tokens; every layer's output, state and conv window against the reference."""
    from inferno.cuda.graph import Graph
    from inferno.cuda.stream import Stream

    hk, hv, slots, eps, layers, tokens = 16, 48, [4, 1], 1e-6, 3, 2
    nb, c, zw = len(slots), 2 * hk * D + hv * D, hv * D
    a_log, dt_bias = _gates(rng, hv)
    w = (1 + 0.2 * rng.standard_normal(D, np.float32)).astype(bf16)
    x = rng.standard_normal((nb, c), np.float32).astype(bf16)
    z = rng.standard_normal((nb, zw), np.float32).astype(bf16)
    ab = rng.standard_normal((nb, 2 * hv), np.float32).astype(bf16)
    conv_w = [(0.5 * rng.standard_normal((4, c), np.float32)).astype(bf16) for _ in range(layers)]
    conv_st = [rng.standard_normal((N_SLOTS, 3, c), np.float32).astype(bf16) for _ in range(layers)]
    state = [(0.1 * rng.standard_normal((N_SLOTS, hv, D, D), np.float32)).astype(np.float32) for _ in range(layers)]
    dx, dz, dab = bufs.up(x, "x"), bufs.up(z, "z"), bufs.up(ab, "ab")
    db = dab.view(hv * 2, dab.nbytes - hv * 2, "b")
    shared = (bufs.up(a_log, "a_log"), bufs.up(dt_bias, "dt_bias"), bufs.up(w, "norm_w"))
    dslots, dsync = bufs.up(np.array(slots, np.int32), "slots"), bufs.up(np.zeros(nb * hk, np.int32), "sync")
    dconv_w = [bufs.up(cw, f"conv_w{i}") for i, cw in enumerate(conv_w)]
    dconv_st = [bufs.up(cs, f"conv_state{i}") for i, cs in enumerate(conv_st)]
    dstate = [bufs.up(st, f"state{i}") for i, st in enumerate(state)]
    dout = [bufs.poisoned(nb * zw * 2, f"out{i}") for i in range(layers)]
    stream = Stream.create()
    stream.pdl = True
    try:
        with Graph.capture(stream) as g:
            for i in range(layers):
                fused(dx, dconv_st[i], dconv_w[i], dz, dab, db, *shared, dstate[i], dslots, dsync, dout[i], nb, hk,
                      hv, N_SLOTS, eps, a_stride=2 * hv, b_stride=2 * hv, stream=stream)
        ge = g.instantiate()
        for _ in range(tokens):
            ge.launch(stream)
        stream.synchronize()
        ge.close()
        g.close()
    finally:
        stream.close()
    sync, _ = Bufs.read(dsync, np.int32, (nb * hk,))
    fails = [] if not np.any(sync) else [f"sync counters not back to zero: {sync.tolist()}"]
    for layer in range(layers):
        out, out_guard = Bufs.read(dout[layer], bf16, (nb, zw))
        new_state, _ = Bufs.read(dstate[layer], np.float32, state[layer].shape)
        new_conv, _ = Bufs.read(dconv_st[layer], bf16, conv_st[layer].shape)
        if not out_guard:
            fails.append(f"layer {layer}: out guard tail written")
        for i, s in enumerate(slots):
            win, st = _f32(conv_st[layer][s]), state[layer][s].copy()
            for _ in range(tokens):
                co, cs = causal_conv(_f32(x[i])[None], win.T, _f32(conv_w[layer]).T)
                win = cs.T
                ref_out, st = _ref_step(silu(co[0]), z[i], ab[i, :hv], ab[i, hv:], a_log, dt_bias, w, st, hk, hv,
                                        eps)
            for what, got, want, tol in (("out", out[i], ref_out, OUT_TOL),
                                         ("state", new_state[s], st, tokens * STATE_TOL)):
                rel, line = _report(f"{fused.name} layer {layer} x{tokens} slot {s}: {what}", got, want)
                if rel > tol:
                    fails.append(line)
            if not np.array_equal(new_conv[s].view(np.uint16), win.astype(bf16).view(np.uint16)):
                fails.append(f"layer {layer} slot {s}: conv window differs from the reference")
        for s in set(range(N_SLOTS)) - set(slots):
            if not (np.array_equal(new_state[s].view(np.uint32), state[layer][s].view(np.uint32)) and
                    np.array_equal(new_conv[s].view(np.uint16), conv_st[layer][s].view(np.uint16))):
                fails.append(f"layer {layer}: slot {s} is not in the batch but its state changed")
    assert not fails, "; ".join(fails)


# --- time per step (graph-captured, each launch on a different state so L2 does not help) --------


@pytest.mark.parametrize("nb", [1, 4])
def test_step_time(device, kernels, bufs, rng, nb):
    from inferno.cuda.graph import Graph
    from inferno.cuda.stream import Event, Stream

    _, step = kernels
    hk, hv, launches, n_slots = 16, 48, 32, 32  # 32 slots x 3 MiB = 96 MiB, twice the H200 L2
    cq, zw = 2 * hk * D + hv * D, hv * D
    slot_ids = bufs.up(np.concatenate([rng.permutation(n_slots) for _ in range(nb)]).astype(np.int32), "slots")
    dstate = bufs.up(np.zeros((n_slots, hv, D, D), np.float32), "state")
    args = [bufs.up(rng.standard_normal((nb, cq), np.float32).astype(bf16), "qkv"),
            bufs.up(rng.standard_normal((nb, zw), np.float32).astype(bf16), "z"),
            bufs.up(rng.standard_normal((nb, hv), np.float32).astype(bf16), "a"),
            bufs.up(rng.standard_normal((nb, hv), np.float32).astype(bf16), "b"),
            *(bufs.up(g, n) for g, n in zip(_gates(rng, hv), ("a_log", "dt_bias"))),
            bufs.up(np.ones(D, bf16), "norm_w"), dstate]
    dout = bufs.poisoned(nb * zw * 2, "out")
    stream = Stream.create()
    with Graph.capture(stream) as g:
        for i in range(launches):
            # launch i reads ids [i*nb, (i+1)*nb): nb permutations of the slots laid end to end, so
            # the 32 launches touch every slot nb times and no batch repeats a slot
            ids = slot_ids.view(i * nb * 4, nb * 4)
            step(*args, ids, dout, nb, hk, hv, n_slots, 1e-6, stream=stream)
    ge = g.instantiate()
    ge.launch(stream)
    start, end = Event.create(), Event.create()
    reps = 5
    start.record(stream)
    for _ in range(reps):
        ge.launch(stream)
    end.record(stream)
    end.synchronize()
    us = Event.elapsed_ms(start, end) * 1e3 / (reps * launches)
    moved = 2 * nb * hv * D * D * 4  # state read + written
    tbps = moved / us / 1e6
    print(f"gdn_step hv{hv} batch {nb}: {us:.2f} us per layer-step, {moved / 2**20:.1f} MiB moved, "
          f"{tbps:.2f} TB/s; x48 layers = {48 * us:.0f} us per token")
    ge.close()
    g.close()
    stream.close()
    out, _ = Bufs.read(dout, bf16, (nb, zw))
    assert np.all(np.isfinite(_f32(out))), "the timed steps wrote non-finite outputs"
    assert tbps > 0.5, f"gdn_step moves its state at {tbps:.2f} TB/s, far under the HBM rate"
