"""`GpuExecutor`: the Executor protocol for dense Qwen3.5 `.ninfer` artifacts, on our kernels.

First version: batch-1 decode. `step` runs one token through the decode launch sequence
(layers.py), replayed from a CUDA graph captured at start-up (`cuda_graph=False`: launched
eagerly). `prefill` runs the prompt in chunks of up to `prefill_chunk` tokens through the prefill
launch sequence (prefill.py: dequant + GEMM, chunked GDN, flash attention; eager launches), then
the decode head; a lone token goes through the decode path. Logits come back as bf16 from the
head GEMV and are returned as fp32 `[vocab]`. All device memory (weights, KV pages, GDN state
slots, workspace, prefill buffers) is reserved once when the executor is made, so generating never
allocates; `close()` frees it.
"""

from __future__ import annotations

import os

import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from ml_dtypes import bfloat16

from inferno.bench.accounting import StateDtypes
from inferno.cuda.errors import OutOfMemoryError
from inferno.engine.params import SamplingParams
from inferno.errors import UsageError
from inferno.kernels.sample_variants import device_supports
from inferno.model.config import ModelConfig
from inferno.model.executor import State
from inferno.model.gpu.layers import DecodeProgram
from inferno.model.gpu.prefill import CudaPrefillOps, PrefillProgram, prefill_formats
from inferno.model.gpu.residency import STEP_HEADER, ResidencyPlan, gemv_kinds, plan_residency
from inferno.model.gpu.state import DeviceStates, GpuState
from inferno.model.gpu.weights import upload_weights

if TYPE_CHECKING:
    from inferno.bench.profile import KernelTime

RING = 64  # step-input records in flight before the host waits (prefill queues tokens without waiting)
AHEAD = 2  # decode steps `queue_sample` may have queued whose tokens the host has not taken


@dataclass
class StepTrace:
    """One traced token: per layer the mixer output before its output projection (GDN gated-normed
    output [Hv * dv], attention gated output [Hq * head_dim]) and the residual stream after the
    layer [hidden]; then the logits [vocab]. fp32 copies of the bf16 device values."""

    mixer: list[np.ndarray]
    residual: list[np.ndarray]
    logits: np.ndarray


class GpuExecutor:
    """Runs a dense Qwen3.5 artifact on the GPU over `GpuState`s (see the module docstring).

    `max_seqs` sequences of up to `max_context` tokens can live at once. `prefill_chunk` tokens go
    through one prefill call; None: the largest of 1024..8192 whose plan fits the free device memory
    (`inferno.bench.prefill_chunk`; 1024 when emulated). `emulate=True` runs the same launch sequence
    on `EmulatedOps` (numpy, no GPU, no graphs) for tests.
    """

    def __init__(self, path: str | Path, *, max_seqs: int = 4, max_context: int = 4096, cuda_graph: bool = True,
                 device: int = 0, emulate: bool = False, progress: bool = True, prefill_chunk: int | None = None):
        from inferno.artifact import open_checked

        artifact, spec, config, expected = open_checked(path)
        self.config: ModelConfig = config
        self._lock = threading.RLock()
        self._closed = False
        self._device = None
        self.ops = None
        self.graphs: dict[str, tuple] = {}
        self._pinned: tuple = ()
        inventory = {e.name: e for e in expected}
        try:
            if prefill_chunk is None:
                prefill_chunk = self._auto_chunk(config, expected, spec.plan, max_seqs, max_context, device, emulate)
            self.plan: ResidencyPlan = plan_residency(config, inventory, max_seqs, max_context, spec.plan,
                                                      prefill_chunk)
            self.ops = self._make_ops(config, device, emulate)
            self.weights = upload_weights(self.ops, artifact, inventory, self.plan, progress)
            artifact.close()
            self.states = DeviceStates(self.ops, config, self.plan)
            self.program = DecodeProgram(self.ops, config, self.weights, self.states, self.plan)
            self.prefill_program = PrefillProgram(self.ops, self._prefill_ops(emulate), config, self.weights,
                                                  self.states, self.plan, self.program.attn, self.program.ws)
            self._ring, self._logits = self._host_buffers(emulate)
            self._pending = 0
            self._queued: list[tuple[GpuState, int, Callable[[], None]]] = []  # (state, token slot, wait)
            self.cuda_graph = cuda_graph and not emulate
            if self.cuda_graph:
                self._capture()
        except OutOfMemoryError as e:  # the device had less room than it reported: name the plan and flags
            artifact.close()
            free = self._device.free_mem() if self._device is not None else 0
            self.close()
            raise self.plan.oom_error(free) from e
        except BaseException:
            artifact.close()
            self.close()
            raise
        if progress:
            print(f"GPU executor ready: {self.plan.summary()}; decode "
                  f"{'CUDA graph' if self.cuda_graph else 'eager'}", file=sys.stderr)

    # ---- set-up ------------------------------------------------------------------------------------
    @staticmethod
    def _auto_chunk(config: ModelConfig, expected, fusion: str, max_seqs: int, max_context: int, device: int,
                    emulate: bool) -> int:
        """`prefill_chunk=None`: the largest chunk of 1024..8192 tokens whose plan fits the free device memory."""
        from inferno.bench.prefill_chunk import gpu_prefill_chunk

        free = None
        if not emulate:
            from inferno.cuda import Device

            free = Device.open(device).free_mem()
        return gpu_prefill_chunk(config, expected, fusion, max_seqs, max_context, free)

    @property
    def prefill_chunk(self) -> int:
        """Tokens per prefill call (the engine should chunk prompts by the same)."""
        return self.plan.prefill_chunk

    def _make_ops(self, config: ModelConfig, device: int, emulate: bool):
        if emulate:
            from inferno.model.gpu.emulator import EmulatedOps

            return EmulatedOps(self.plan.arena_bytes)
        from inferno.cuda import Device
        from inferno.model.gpu.ops import CudaOps

        self._device = Device.open(device)
        self.plan.require_fits(self._device.free_mem())
        group = config.n_heads // config.n_kv_heads if config.attention_layers else None
        ops = CudaOps(self._device, self.plan.arena_bytes, config, group, pdl=os.environ.get("INFERNO_PDL", "1") != "0")
        ops.preload_gemv(gemv_kinds(self.plan.placements))
        return ops

    def _prefill_ops(self, emulate: bool):
        if emulate:
            return self.ops  # EmulatedOps models the prefill kernels too
        return CudaPrefillOps(self.ops, self.config, prefill_formats(self.plan))

    def _host_buffers(self, emulate: bool) -> tuple[np.ndarray, np.ndarray]:
        words, vocab = self.program.step_words, self.config.vocab
        slots = 1 + AHEAD * self.plan.kv.max_seqs  # [0]: synchronous reads; the rest: queued steps' tokens
        if emulate:
            self._tokens = np.zeros(slots, np.int32)
            self._token = self._tokens[:1]
            return np.zeros((RING, words), np.int32), np.zeros(vocab, np.uint16)
        from inferno.cuda import PinnedBuffer

        self._pinned = (PinnedBuffer(RING * words * 4, "step inputs"), PinnedBuffer(vocab * 2, "logits"),
                        PinnedBuffer(4 * slots, "sampled tokens"))
        self._tokens = self._pinned[2].array(np.int32, (slots,))
        self._token = self._tokens[:1]
        return self._pinned[0].array(np.int32, (RING, words)), self._pinned[1].array(np.uint16, (vocab,))

    def _capture(self) -> None:
        """One eager warm-up token on a scratch sequence (every kernel runs once, so launch errors
        surface plainly), then capture the body and head launch sequences."""
        scratch = self.states.new()
        try:
            self.states.reserve(scratch, 1)
            self._write_step(0, scratch)
            self.program.body()
            self.program.head()
            self.ops.synchronize()
            self._pending = 0
        finally:
            self.states.release(scratch)
        for name, fn in (("body", self.program.body), ("head", self.program.head)):
            self._capture_one(name, fn)

    def _capture_one(self, name: str, launches) -> None:
        from inferno.cuda import Graph

        self.ops.branches = os.environ.get("INFERNO_BRANCHES", "1") != "0"  # concurrent branches in the graph
        try:
            with Graph.capture(self.ops.stream) as g:
                launches()
        finally:
            self.ops.branches = False
        ge = g.instantiate()
        ge.upload(self.ops.stream)
        self.graphs[name] = (g, ge)

    # ---- Executor protocol -------------------------------------------------------------------------
    def new_state(self) -> GpuState:
        with self._lock:
            self._enter()
            st = self.states.new()
            self.ops.zero(self._sample_counts(st))  # the device sampler's penalties start from nothing
            return st

    def prefill(self, tokens: Sequence[int], state: State) -> np.ndarray:
        """Append `tokens` (in chunks of up to `prefill_chunk`); logits of the last, fp32 `[vocab]`."""
        ids = self._token_ids(tokens)
        with self._lock:
            self._enter()
            st = self._check_state(state)
            self._append(ids, st)
            return self._read_logits()

    def step(self, token: int, state: State) -> np.ndarray:
        """Append one token; its logits, fp32 `[vocab]`."""
        return self.prefill([token], state)

    # ---- greedy fast path --------------------------------------------------------------------------
    def prefill_greedy(self, tokens: Sequence[int], state: State) -> int:
        """`prefill`, but return only the greedy next token (argmax on the device: 4 bytes come back).

        Ties go to the lowest id, as `np.argmax` does on the logits `prefill` returns."""
        ids = self._token_ids(tokens)
        with self._lock:
            self._enter()
            st = self._check_state(state)
            self._append(ids, st)
            return self._read_greedy()

    def step_greedy(self, token: int, state: State) -> int:
        """`step`, returning the greedy next token instead of the logits."""
        return self.prefill_greedy([token], state)

    # ---- device sampling ---------------------------------------------------------------------------
    def samples_on_device(self, params: SamplingParams) -> bool:
        """Whether `prefill_sample` / `step_sample` take `params` (greedy, or top_k 1..64)."""
        return device_supports(params, self.config.vocab)

    def prefill_sample(self, tokens: Sequence[int], state: State, params: SamplingParams, u: float) -> int:
        """`prefill`, then sample the next token on the device with the uniform draw `u` (4 bytes come back).

        Penalties count the tokens this state sampled on the device (as `Sampler` counts its own)."""
        ids = self._token_ids(tokens)
        with self._lock:
            self._enter()
            st = self._check_state(state)
            if not self.samples_on_device(params):
                raise UsageError(f"top_k {params.top_k} is not sampled on the device; use prefill and sample "
                                 "on the host (check samples_on_device first)")
            self._append(ids, st)
            token = self._read_sample(st, params, u)
            st.sampled = True
            return token

    def step_sample(self, token: int, state: State, params: SamplingParams, u: float) -> int:
        """`step`, returning the next token sampled on the device instead of the logits."""
        return self.prefill_sample([token], state, params, u)

    def _sample_counts(self, st: GpuState):
        row = self.config.vocab * 4
        return self.program.ws["sample_counts"].view(st.slot * row, row)

    def _pick(self, st: GpuState, params: SamplingParams, u: float) -> None:
        """Queue the choice of the next token from ws['logits'] into the state's sampled word, eagerly (the
        sampler's scalars change every call): argmax for greedy without penalties (one kernel, and no
        counts to keep), else the sampler (which counts the token for the penalties)."""
        ws = self.program.ws
        if params.greedy and not params.has_penalties:
            self.ops.argmax(ws["logits"], self._sampled(st), self.config.vocab)
        else:
            self.ops.sample(ws["logits"], self._sample_counts(st), ws["sample_scratch"], self._sampled(st),
                            self.config.vocab, params, u)

    def _sampled(self, st: GpuState):
        """The word holding the last token the device sampled for this state."""
        return self.program.ws["sampled"].view(st.slot * 4, 4)

    # ---- queued device sampling: the next step is queued before this one's token is read ----------
    def queue_sample(self, token: int | None, state: State, params: SamplingParams, u: float) -> None:
        """Queue one decode step and the device sampling of the next token, without waiting for it.

        `token` is the step's input, or None for the last token the device sampled for this state (by
        `prefill_sample` or the previous queued step), so a step can be queued before the host has read
        its input. At most `AHEAD` steps of a state may wait; `take_sample` returns their tokens in order."""
        with self._lock:
            self._enter()
            st = self._check_state(state)
            if not self.samples_on_device(params):
                raise UsageError(f"top_k {params.top_k} is not sampled on the device; use step and sample "
                                 "on the host (check samples_on_device first)")
            queued = [q for q in self._queued if q[0] is st]
            if len(queued) >= AHEAD:
                raise UsageError(f"{AHEAD} steps of this state are queued already; take_sample one first")
            if token is None and not st.sampled:
                raise UsageError("nothing was sampled on the device for this state yet; pass the input token")
            ids = self._token_ids([0 if token is None else token])
            self.states.reserve(st, st.position + 1)
            self._write_step(int(ids[0]), st)
            if token is None:  # the step's input is the device's last sample of this state
                self.ops.copy2d(self.program.ids, 4, self._sampled(st), 4, 4, 1)
            if self.cuda_graph:
                self.graphs["body"][1].launch(self.ops.stream)
                self.graphs["head"][1].launch(self.ops.stream)
            else:
                self.program.body()
                self.program.head()
            st.position += 1
            self._pick(st, params, u)
            busy = {q[1] for q in self._queued}
            slot = next(i for i in range(1, len(self._tokens)) if i not in busy)
            self.ops.read(self._tokens[slot:slot + 1], self._sampled(st))
            self._queued.append((st, slot, self.ops.marker()))
            st.sampled = True

    def take_sample(self, state: State) -> int:
        """The token of this state's oldest queued step (waits for that step only)."""
        with self._lock:
            self._enter()
            st = self._check_state(state)
            i = next((i for i, q in enumerate(self._queued) if q[0] is st), None)
            if i is None:
                raise UsageError("no step of this state is queued; queue_sample first")
            _, slot, done = self._queued[i]
            del self._queued[i]
            done()
            return int(self._tokens[slot])

    def _read_sample(self, st: GpuState, params: SamplingParams, u: float) -> int:
        if self.cuda_graph:
            self.graphs["head"][1].launch(self.ops.stream)
        else:
            self.program.head()
        self._pick(st, params, u)
        self.ops.read(self._token, self._sampled(st))
        self.ops.synchronize()
        self._pending = 0
        self.prefill_program.synchronized()
        return int(self._token[0])

    def release(self, state: State) -> None:
        """Return the state's GDN slot and KV pages; the state cannot be used afterwards (idempotent)."""
        if state.released:
            return
        with self._lock:
            self._enter()
            st = self._check_state(state)
            self.ops.synchronize()  # queued steps of this sequence finish before its slot is reused
            for _, _, done in (q for q in self._queued if q[0] is st):  # tokens nobody will take
                done()  # returns at once (the stream is drained) and frees the step's event
            self._queued = [q for q in self._queued if q[0] is not st]
            self.states.release(st)
            st.released = True

    @property
    def device(self):
        """The `inferno.cuda.Device` in use (None when emulated)."""
        return self._device

    # ---- diagnostics -------------------------------------------------------------------------------
    state_dtypes = StateDtypes(kv="bf16", conv="bf16", recurrent="fp32")  # how a sequence's state is stored

    def profile_step(self, token: int, state: State) -> list[KernelTime]:
        """`step`, run eagerly with CUDA events around every launch: per-kernel times (profile.py)."""
        from inferno.model.gpu.profile import profile

        with self._lock:
            self._enter()  # the device's context is current for the timer's events
            return profile(self, lambda: self.step(token, state))

    def profile_prefill(self, tokens: Sequence[int], state: State) -> list[KernelTime]:
        """`prefill` of one chunk, run eagerly with CUDA events around every launch: per-kernel times."""
        from inferno.model.gpu.profile import profile

        with self._lock:
            self._enter()  # the device's context is current for the timer's events
            return profile(self, lambda: self.prefill(tokens, state))

    def trace_step(self, token: int, state: State) -> StepTrace:
        """Run one token eagerly, keeping every layer's mixer output and residual stream (fp32)."""
        ids = self._token_ids([token])
        out = StepTrace([], [], np.zeros(0, np.float32))
        ws = self.program.ws

        def grab(i: int) -> None:
            out.mixer.append(self._download_bf16(ws["mix_out"], self.program.mixer_width(i)))
            x, sums = self.program.layer_output(i)
            xv = self._download_bf16(x, self.config.hidden)
            if sums is not None:  # deferred: x + the down GEMV's sums, as the next layer's GEMVs read it
                xv += self.ops.download(sums, np.float32, (self.config.hidden,))
                xv = xv.astype(bfloat16).astype(np.float32)
            out.residual.append(xv)

        with self._lock:
            self._enter()
            st = self._check_state(state)
            self.states.reserve(st, st.position + 1)
            self._write_step(int(ids[0]), st)
            self.program.body(trace=grab)
            st.position += 1
            out.logits = self._read_logits(graph=False)
            return out

    def _download_bf16(self, buf, n: int) -> np.ndarray:
        return self.ops.download(buf, np.uint16, (n,)).view(bfloat16).astype(np.float32)

    def device_buffer(self, name: str) -> np.ndarray:
        """A workspace buffer's bytes (e.g. 'normed', 'logits', 'mix_out') after the last step, for debugging."""
        buf = self.program.ws[name]
        return self.ops.download(buf, np.uint8, (buf.nbytes,))

    # ---- internals ---------------------------------------------------------------------------------
    def _enter(self) -> None:
        if self._closed:
            raise UsageError("this GPU executor was closed; make a new one")
        if self._device is not None:
            self._device.activate()

    def _check_state(self, state: State) -> GpuState:
        if not isinstance(state, GpuState):
            raise UsageError("this state was not made by this GPU executor; use its new_state()")
        if state.released or state.slot < 0:
            raise UsageError("this sequence state was released; create a new one with new_state()")
        return state

    def _token_ids(self, tokens: Sequence[int]) -> np.ndarray:
        ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
        if ids.size == 0:
            raise UsageError("no tokens to run; the prompt must have at least one token")
        bad = ids[(ids < 0) | (ids >= self.config.vocab)]
        if bad.size:
            raise UsageError(f"token id {int(bad[0])} is outside the vocabulary (0..{self.config.vocab - 1})")
        return ids

    def _write_step(self, token: int, st: GpuState) -> None:
        """Queue the step inputs of `token` at the state's position (a ring record the host leaves alone until synced)."""
        if self._pending == RING:
            self.ops.synchronize()
            self._pending = 0
        rec = self._ring[self._pending]
        self._pending += 1
        rec[:] = 0
        rec[:STEP_HEADER] = (token, st.position, st.slot, st.position + 1)
        rec[STEP_HEADER:STEP_HEADER + len(st.pages)] = st.pages
        self.ops.write(self.program.step_buffer, rec)

    def _append(self, ids: np.ndarray, st: GpuState) -> None:
        """Queue `ids` on the sequence: chunks of the prefill program, a lone token through the decode path
        (either way the last token's final norm ends in the decode workspace, for the head)."""
        self.states.reserve(st, st.position + len(ids))
        chunk = self.plan.prefill_chunk
        for i in range(0, len(ids), chunk):
            part = ids[i:i + chunk]
            if len(part) == 1:
                self._run(int(part[0]), st)
            else:
                self.prefill_program.run(part, st)

    def trace_prefill(self, tokens: Sequence[int], state: State) -> StepTrace:
        """Run `tokens` (at most `prefill_chunk`) as one prefill chunk, keeping every layer's mixer output
        and residual stream of the last token (fp32), and the logits (debugging)."""
        ids = self._token_ids(tokens)
        if len(ids) > self.plan.prefill_chunk:
            raise UsageError(f"trace_prefill takes at most {self.plan.prefill_chunk} tokens, got {len(ids)}")
        out = StepTrace([], [], np.zeros(0, np.float32))
        buf, c, last = self.prefill_program.buf, self.config, len(ids) - 1

        def grab(i: int) -> None:
            width = self.program.mixer_width(i)
            out.mixer.append(self._download_bf16(buf["mix_out"], (last + 1) * width)[last * width:])
            out.residual.append(self._download_bf16(buf["x"], (last + 1) * c.hidden)[last * c.hidden:])

        with self._lock:
            self._enter()
            st = self._check_state(state)
            self.states.reserve(st, st.position + len(ids))
            self.prefill_program.run(ids, st, trace=grab)
            out.logits = self._read_logits(graph=False)
            return out

    def _run(self, token: int, st: GpuState) -> None:
        self._write_step(token, st)
        if self.cuda_graph:
            self.graphs["body"][1].launch(self.ops.stream)
        else:
            self.program.body()
        st.position += 1

    def _read_logits(self, graph: bool | None = None) -> np.ndarray:
        if self.cuda_graph if graph is None else graph:
            self.graphs["head"][1].launch(self.ops.stream)
        else:
            self.program.head()
        self.ops.read(self._logits, self.program.ws["logits"])
        self.ops.synchronize()
        self._pending = 0
        self.prefill_program.synchronized()
        return self._logits.view(bfloat16).astype(np.float32)

    def _read_greedy(self) -> int:
        replay = self.cuda_graph and "greedy" in self.graphs
        if replay:
            self.graphs["greedy"][1].launch(self.ops.stream)
        else:
            self._greedy_launches()  # eager (the first time with graphs: loads the argmax kernel)
        self.ops.read(self._token, self.program.ws["argmax"])
        self.ops.synchronize()
        self._pending = 0
        self.prefill_program.synchronized()
        if self.cuda_graph and not replay:
            self._capture_one("greedy", self._greedy_launches)
        return int(self._token[0])

    def _greedy_launches(self) -> None:
        self.program.head()
        self.program.greedy()

    def close(self) -> None:
        """Free the device memory, graphs and streams (states become invalid)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._device is not None:
                self._device.activate()
            for g, ge in self.graphs.values():
                ge.close()
                g.close()
            self.graphs.clear()
            if self.ops is not None:
                self.ops.close()  # drains the stream: the queued steps' waits return at once
            for _, _, done in getattr(self, "_queued", ()):
                done()
            for p in self._pinned:
                p.close()

    def __enter__(self) -> GpuExecutor:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
