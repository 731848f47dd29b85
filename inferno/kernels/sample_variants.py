"""Kernel variants for sampling on the device, their launchers, and a numpy model of the sampler.

`SAMPLE_VARIANTS` (collected by the registry's family table):
  argmax_bf16        out[0] = first index of the maximum of x bf16 [N] (N a multiple of 8), one cluster
                     of ARGMAX_CTAS CTAs
  sample_topk_bf16   per 4096-logit slice: the 64 best penalised logits (value, id), one CTA a slice
  sample_pick        merges those lists, applies temperature / top-p / min-p, draws with u, one CTA

`Argmax.for_device(device)` and `DeviceSampler.for_device(device)` load them from the kernel
cache (building them where the DSL is). `reference_token` is the numpy model of the two sampling
kernels. On the cases the device supports (greedy, or top_k 1..K_MAX) it keeps the same
candidates with the same probabilities as `inferno.engine.sampling.Sampler`, and given the same
uniform number u it picks the same token when the order of the candidates is defined there:
greedy, top_k 1, or top_p < 1 (Sampler sorts by probability, ties by id). With top_p = 1 Sampler
draws in `np.argpartition` order, the device best first: the same distribution, but another
token for a given u. Equal logits at the top-k boundary go to the lower id here (arbitrary there).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from inferno.cuda.errors import LaunchError
from inferno.cuda.launch import launch
from inferno.cuda.memory import DeviceBuffer
from inferno.cuda.params import TensorArg
from inferno.kernels.manifest import eval_grid
from inferno.kernels.registry import Scalar, Tensor, Variant

if TYPE_CHECKING:
    from inferno.engine.params import SamplingParams
    from inferno.cuda.device import Device
    from inferno.kernels.cache import LoadedKernel

ARGMAX_CTAS = 8  # the argmax kernel's cluster (cute_kernels/argmax.py CTAS)
ARGMAX = Variant(
    name="argmax_bf16", op="argmax", source="cute_kernels.argmax", cls="Argmax",
    config=dict(threads=1024),
    args=(Tensor("x", "bf16", ("N",), (1,)), Tensor("out", "i32", (1,), (1,), align=4)),
    grid=(str(ARGMAX_CTAS), "1", "1"),
    divisibility={"N": 8},
    pdl=True,
    summary=f"greedy sampling: first index of the maximum of bf16 logits [N], one cluster of {ARGMAX_CTAS} CTAs",
)

K_MAX = 64  # the largest top_k sampled on the device (cute_kernels/sample.py)
SLICE = 4096  # logits per top-k CTA
MAX_VOCAB = SLICE * SLICE // K_MAX  # the merge CTA sorts at most SLICE partial candidates
_U_MAX = float(np.nextafter(np.float32(1.0), np.float32(0.0)))  # the largest float32 below 1


def _u32(u: float) -> float:
    """u in [0, 1) as the float32 the pick kernel uses (rounded, kept below 1)."""
    return min(float(np.float32(u)), _U_MAX)

_PV = Tensor("part_v", "f32", ("P",), (1,), align=4)
_PI = Tensor("part_i", "i32", ("P",), (1,), align=4)
SAMPLE_TOPK = Variant(
    name="sample_topk_bf16", op="sample_topk", source="cute_kernels.sample", cls="SampleTopK",
    args=(Tensor("x", "bf16", ("N",), (1,)), Tensor("counts", "i32", ("N",), (1,), align=4), _PV, _PI,
          Scalar("presence", "f32"), Scalar("frequency", "f32")),
    grid=(f"cdiv(N, {SLICE})", "1", "1"),
    divisibility={"N": 8},
    pdl=True,
    summary="device sampling, pass 1: the 64 best penalised bf16 logits of each 4096-logit slice",
)
SAMPLE_PICK = Variant(
    name="sample_pick", op="sample_pick", source="cute_kernels.sample", cls="SamplePick",
    args=(_PV, _PI, Tensor("counts", "i32", ("N",), (1,), align=4), Tensor("out", "i32", (1,), (1,), align=4),
          Scalar("top_k", "i32"), Scalar("inv_t", "f32"), Scalar("top_p", "f32"), Scalar("min_p", "f32"),
          Scalar("u", "f32")),
    grid=("1", "1", "1"),
    pdl=True,
    summary="device sampling, pass 2: merge the slices' candidates, top-k / temperature / top-p / min-p, draw",
)

SAMPLE_VARIANTS: tuple[Variant, ...] = (ARGMAX, SAMPLE_TOPK, SAMPLE_PICK)


class Argmax:
    """Typed launcher: out[0] (int32) = argmax of x bf16 [n]."""

    def __init__(self, loaded: "LoadedKernel"):
        self.loaded = loaded
        self.name = loaded.variant.name

    @classmethod
    def for_device(cls, device: "Device | None" = None) -> "Argmax":
        from inferno.cuda.device import Device
        from inferno.kernels.cache import load

        return cls(load(ARGMAX, device or Device.open()))

    def __call__(self, x: DeviceBuffer, out: DeviceBuffer, n: int, *, stream: Any = None) -> None:
        from inferno.kernels.launchers import _buf, _int

        n = _int(n, "n", self.name)
        if n % 8:
            raise LaunchError(f"kernel {self.name}: n = {n} must be a multiple of 8")
        px = _buf(x, "x", self.name, n * 2)
        po = _buf(out, "out", self.name, 4, align=4)
        m = self.loaded.manifest
        args = []
        for p in m.params:
            args.append(TensorArg(px, (n,)) if p.name == "x" else TensorArg(po))
        grid = eval_grid(m.grid, {"N": n})
        launch(self.loaded.kernel, grid, m.block, self.loaded.layout.pack(args), m.smem, stream,
               cluster=grid)  # the grid is one cluster


def device_supports(params: "SamplingParams", vocab: int) -> bool:
    """Whether `DeviceSampler` samples `params` over `vocab` logits (greedy, or top_k in 1..K_MAX)."""
    if not (8 <= vocab <= MAX_VOCAB and vocab % 8 == 0):
        return False
    return params.greedy or 1 <= params.top_k <= min(K_MAX, vocab - 1)


def _device_scalars(params: "SamplingParams") -> tuple[int, float, float, float]:
    """(top_k, inv_t, top_p, min_p) as the pick kernel takes them; greedy is top_k 1."""
    if params.greedy:
        return 1, 1.0, 1.0, 0.0
    return params.top_k, float(np.float32(1.0 / params.temperature)), params.top_p, params.min_p


def scratch_bytes(vocab: int) -> int:
    """Bytes of the partial candidate lists for `vocab` logits (values, then ids)."""
    return -(-vocab // SLICE) * K_MAX * 8


class DeviceSampler:
    """Typed launcher of the two sampling kernels: out[0] = the token, counts[token] += 1.

    logits bf16 [n]; counts int32 [n] (tokens generated so far, for the penalties; zero it per
    request); scratch `scratch_bytes(n)` bytes; out int32 [1]. `u` is a uniform number in [0, 1)
    from the request's generator (the kernel uses it as float32, kept below 1).
    """

    def __init__(self, topk: "LoadedKernel", pick: "LoadedKernel"):
        self.topk, self.pick = topk, pick
        self.name = "device sampler"

    @classmethod
    def for_device(cls, device: "Device | None" = None) -> "DeviceSampler":
        from inferno.cuda.device import Device
        from inferno.kernels.cache import load

        dev = device or Device.open()
        return cls(load(SAMPLE_TOPK, dev), load(SAMPLE_PICK, dev))

    def __call__(self, logits: DeviceBuffer, counts: DeviceBuffer, scratch: DeviceBuffer, out: DeviceBuffer,
                 n: int, params: "SamplingParams", u: float, *, stream: Any = None) -> None:
        from inferno.kernels.launchers import _buf, _int

        n = _int(n, "n", self.name)
        if not device_supports(params, n):
            raise LaunchError(f"{self.name}: n = {n} with temperature {params.temperature}, top_k {params.top_k} "
                              f"is not supported on the device (n a multiple of 8 up to {MAX_VOCAB}; greedy or "
                              f"top_k 1..{K_MAX}); sample on the host")
        if isinstance(u, bool) or not isinstance(u, (float, int, np.floating)) or not 0.0 <= u < 1.0:
            raise LaunchError(f"{self.name}: u must be a uniform number in [0, 1), got {u!r}")
        px = _buf(logits, "logits", self.name, n * 2)
        pc = _buf(counts, "counts", self.name, n * 4, align=4)
        ps = _buf(scratch, "scratch", self.name, scratch_bytes(n))
        po = _buf(out, "out", self.name, 4, align=4)
        parts = -(-n // SLICE) * K_MAX
        pv, pi = TensorArg(ps, (parts,)), TensorArg(ps + parts * 4, (parts,))
        top_k, inv_t, top_p, min_p = _device_scalars(params)
        tensors = {"x": TensorArg(px, (n,)), "counts": TensorArg(pc, (n,)), "part_v": pv, "part_i": pi,
                   "out": TensorArg(po)}
        scalars = {"presence": params.presence_penalty, "frequency": params.frequency_penalty, "top_k": top_k,
                   "inv_t": inv_t, "top_p": top_p, "min_p": min_p, "u": _u32(u)}
        for k in (self.topk, self.pick):
            m = k.manifest
            args = [tensors[p.name] if p.name in tensors else scalars[p.name] for p in m.params]
            launch(k.kernel, eval_grid(m.grid, {"N": n}), m.block, k.layout.pack(args), m.smem, stream)


def reference_candidates(logits: np.ndarray, counts: np.ndarray,
                         params: "SamplingParams") -> tuple[np.ndarray, np.ndarray]:
    """The ids the device kernels can draw and their fp32 weights (relative to the top-k set), best first.

    numpy, the kernels' arithmetic and order: penalties on fp32 logits (NaN counts as -inf); the
    top_k best by (value desc, id asc); fp32 weights exp((x - x_max) * inv_t) scaled by
    1 / (their fp64 sum); top-p: the shortest prefix whose fp64 cumulative mass reaches
    top_p * mass; min-p: w >= min_p * w_max. top_p and min_p are used as float32.
    """
    x = np.asarray(logits, np.float32)
    c = np.asarray(counts)
    pen = np.float32(params.presence_penalty) + np.float32(params.frequency_penalty) * c.astype(np.float32)
    x = np.where(c > 0, x - pen, x).astype(np.float32)
    x[np.isnan(x)] = -np.inf
    k, inv_t, top_p, min_p = _device_scalars(params)
    kth = np.partition(x, x.size - k)[x.size - k]
    cand = np.flatnonzero(x >= kth)
    ids = cand[np.lexsort((cand, -x[cand]))][:k]
    v = x[ids]
    w = np.exp((v - v[0]) * np.float32(inv_t)).astype(np.float32)
    w = (w * np.float32(1.0 / np.cumsum(w, dtype=np.float64)[-1])).astype(np.float32)
    kept = k
    if np.float32(top_p) < 1:
        cum = np.cumsum(w, dtype=np.float64)
        kept = min(int(np.count_nonzero(cum < np.float64(np.float32(top_p)) * cum[-1])) + 1, k)
    n = int(np.count_nonzero(w[:kept] >= np.float32(min_p) * w[0]))
    return ids[:n], w[:n]


def reference_token(logits: np.ndarray, counts: np.ndarray, params: "SamplingParams", u: float) -> int:
    """The token the device kernels pick (numpy model): among `reference_candidates`, the number
    of fp64 cumulative weights <= u * total (u as float32, below 1), clamped to the last candidate."""
    ids, w = reference_candidates(logits, counts, params)
    cum = np.cumsum(w, dtype=np.float64)
    return int(ids[min(int(np.count_nonzero(cum <= _u32(u) * cum[-1])), ids.size - 1)])
