"""`EmulatedOps`: the GPU executor's device operations modelled in numpy over an emulated memory.

Device buffers are ranges of one host byte array at fake addresses, and each operation does
what its kernel's docstring says, with the kernel's storage dtypes (bf16 activations, bf16 conv
state and KV cache, fp32 recurrent state) and fp32 math. Running the executor's real launch
sequences on it (decode, and prefill.py's chunks) checks the wiring (buffer offsets, fused row orders, page tables, state slots)
against the reference executor without a GPU; kernel numerics are the kernels' own tests' job.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import Any, ContextManager

import numpy as np
from ml_dtypes import bfloat16

from inferno.cuda.errors import OutOfMemoryError
from inferno.cuda.memory import DeviceBuffer
from inferno.kernels.qlayout import dequant_rows
from inferno.kernels.gemv_mma_variants import ACCUMULATE
from inferno.model.gpu.ops import (AttnGeometry, accumulates_inputs_shape, defers_residual_shape, fold_norms,
                                   folds_norm_shape)
from inferno.model.gpu.residency import ALIGN, align_up
from inferno.model.reference.norms import rms_norm, sigmoid, silu, softplus
from inferno.model.reference.rope import apply_rope

BASE = 1 << 32  # emulated address of byte 0
PAGE = 64


class EmulatedOps:
    """`Ops` over `capacity` bytes of host memory; work runs immediately (one in-order 'stream').
    The GEMVs take the RMSNorm of their input as the GPU's `_n` kernels do (`folds_norm`), unless
    $INFERNO_FOLD_NORM=0."""

    def __init__(self, capacity: int):
        self.fold_norms = fold_norms()
        self.mem = np.zeros(capacity + ALIGN, np.uint8)
        self.capacity = capacity
        self.top = 0
        self._dequant: dict[tuple[int, int, int, str, bool, int], np.ndarray] = {}
        self.launches = 0

    # ---- memory ----------------------------------------------------------------------------------
    def alloc(self, name: str, nbytes: int) -> DeviceBuffer:
        start = align_up(self.top)
        if start + nbytes > self.capacity:
            raise OutOfMemoryError(f"emulated arena full: {name!r} needs {nbytes} bytes", name=name,
                                   requested=nbytes, used=self.top, capacity=self.capacity, free=None)
        self.top = start + nbytes
        return DeviceBuffer(BASE + start, nbytes, name)

    def _bytes(self, buf: DeviceBuffer | int, nbytes: int | None = None) -> np.ndarray:
        ptr = buf.ptr if isinstance(buf, DeviceBuffer) else buf
        n = buf.nbytes if nbytes is None else nbytes
        off = ptr - BASE
        if off < 0 or off + n > self.mem.size:
            raise AssertionError(f"emulated access [{ptr:#x}, +{n}) is outside the arena")
        return self.mem[off:off + n]

    def _get(self, buf: DeviceBuffer, dtype: Any, count: int, offset: int = 0) -> np.ndarray:
        """`count` elements of `dtype` at `buf` + `offset` elements, as fp32 (a copy)."""
        dt = np.dtype(dtype)
        if (offset + count) * dt.itemsize > buf.nbytes:
            raise AssertionError(f"read of {count} {dt} past the end of {buf.name!r}")
        raw = self._bytes(buf.ptr + offset * dt.itemsize, count * dt.itemsize)
        return raw.view(dt).astype(np.float32) if dt != np.int32 else raw.view(dt).copy()

    def _put(self, buf: DeviceBuffer, values: np.ndarray, dtype: Any = bfloat16, offset: int = 0) -> None:
        dt = np.dtype(dtype)
        data = np.ascontiguousarray(np.asarray(values, np.float32).astype(dt) if dt != np.int32 else values)
        if (offset * dt.itemsize + data.nbytes) > buf.nbytes:
            raise AssertionError(f"write of {data.size} {dt} past the end of {buf.name!r}")
        self._bytes(buf.ptr + offset * dt.itemsize, data.nbytes)[:] = data.reshape(-1).view(np.uint8)

    def upload(self, buf: DeviceBuffer, array: np.ndarray) -> None:
        raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        self._bytes(buf, raw.size)[:] = raw

    def download(self, buf: DeviceBuffer, dtype: Any, shape: tuple[int, ...]) -> np.ndarray:
        dt = np.dtype(dtype)
        n = int(np.prod(shape)) * dt.itemsize
        return self._bytes(buf, n).view(dt).reshape(shape).copy()

    def zero(self, buf: DeviceBuffer) -> None:
        self._bytes(buf)[:] = 0

    def write(self, buf: DeviceBuffer, array: np.ndarray) -> None:
        self.upload(buf, array)

    def read(self, out: np.ndarray, buf: DeviceBuffer) -> None:
        out.reshape(-1).view(np.uint8)[:] = self._bytes(buf, out.nbytes)

    def synchronize(self) -> None:
        pass

    def marker(self) -> Callable[[], None]:
        return lambda: None  # every operation ran when it was queued

    def side(self) -> ContextManager[None]:
        return nullcontext()  # one in-order stream: side work runs where it is queued

    def join(self) -> None:
        pass

    def copy2d(self, dst, dst_pitch, src, src_pitch, width, height) -> None:
        for r in range(height):
            self._bytes(dst.ptr + r * dst_pitch, width)[:] = self._bytes(src.ptr + r * src_pitch, width)

    # ---- kernels -----------------------------------------------------------------------------------
    def embedding(self, ids, table, out, vocab, hidden) -> None:
        self.launches += 1
        token = int(self._get(ids, np.int32, 1)[0])
        assert 0 <= token < vocab, f"token {token} outside the table"
        self._put(out, self._get(table, bfloat16, hidden, token * hidden))

    def rmsnorm(self, x, w, y, n, eps) -> None:
        self.launches += 1
        self._put(y, rms_norm(self._get(x, bfloat16, n), self._get(w, bfloat16, n), eps))

    def _weights(self, fmt: str, w: DeviceBuffer, n: int, k: int, tiled: bool = False, q4_rows: int = 0) -> np.ndarray:
        key = (w.ptr, n, k, fmt, tiled, q4_rows)
        m = self._dequant.get(key)
        if m is None and q4_rows:  # a mixed stack (merge.py): its Q4 rows' tile16-v1 image, then its Q5 rows'
            from inferno.kernels.tiled import untile
            from inferno.model.gpu.merge import mixed_parts

            m = self._dequant[key] = np.concatenate([
                dequant_rows(f, untile(f, self._bytes(w.ptr + offset, size), rows, k).tobytes(), rows, k)
                for f, _, rows, offset, size in mixed_parts(n, k, q4_rows)]).astype(np.float32)
        if m is None and fmt == "BF16":
            m = self._dequant[key] = self._get(w, bfloat16, n * k).reshape(n, k).astype(np.float32)
        payload = None
        if m is None and tiled:  # in tile16-v1 (groupwise-int) or tile16-nvfp4-v1 (residency.TILED)
            from inferno.kernels.tiled import tiled_geometry, untile

            payload = untile(fmt, self._bytes(w, tiled_geometry(fmt, n, k).nbytes), n, k).tobytes()
        if m is None and fmt == "NVFP4":
            from inferno.artifact.formats import nvfp4

            if payload is None:
                payload = self._bytes(w, nvfp4.geometry((n, k)).nbytes).tobytes()
            m = self._dequant[key] = nvfp4.decode(payload, (n, k))
        if m is None and tiled:
            m = self._dequant[key] = dequant_rows(fmt, payload, n, k).astype(np.float32)
        if m is None:
            from inferno.artifact.formats.groupwise import geometry

            payload = self._bytes(w, geometry(fmt, (n, k)).nbytes).tobytes()
            m = self._dequant[key] = dequant_rows(fmt, payload, n, k).astype(np.float32)
        return m

    def folds_norm(self, fmt, epilogue, tiled, k) -> bool:
        """As on the GPU (the shapes the `_n` kernels cover)."""
        return self.fold_norms and folds_norm_shape(fmt, epilogue, tiled, k)

    def defers_residual(self, out_fmt, out_tiled, out_k, readers, k) -> bool:
        """As on the GPU (the shapes the accumulate / `_na` kernels cover, the norm folded)."""
        return self.fold_norms and defers_residual_shape(out_fmt, out_tiled, out_k, readers, k)

    def _x(self, x, k, norm, add=None, sums=None):
        """x as the GEMV reads it: bf16(x + s) with `add` (written to add.xo, add.z zeroed, as the kernel does)
        or `sums` (s only read), then RMS-normed (bf16, as the kernel stages it) when `norm` is given."""
        xv = self._get(x, bfloat16, k)
        if add is not None or sums is not None:
            s = add.s if add is not None else sums
            xv = (xv + self._get(s, np.float32, k)).astype(bfloat16).astype(np.float32)
        if add is not None:
            self._put(add.xo, xv)
            self._put(add.z, np.zeros(k, np.float32), np.float32)
        if norm is None:
            return xv
        return rms_norm(xv, self._get(norm[0], bfloat16, k), norm[1]).astype(bfloat16).astype(np.float32)

    def gemv(self, fmt, epilogue, w, x, y, n, k, r=None, tiled=False, norm=None, add=None, q4_rows=0) -> None:
        self.launches += 1
        wm = self._weights(fmt, w, n, k, tiled, q4_rows)
        xv = self._x(x, k, norm, add)
        if epilogue == "swiglu":
            m = n // 2
            out = silu(wm[:m] @ xv) * (wm[m:] @ xv)
        elif epilogue == ACCUMULATE:
            self._put(y, self._get(y, np.float32, n) + wm @ xv, np.float32)
            return
        else:
            out = wm @ xv
            if epilogue == "residual":
                out = out + self._get(r, bfloat16, n)
        self._put(y, out)

    def linear_bf16(self, x, w, y, n, k, norm=None, sums=None) -> None:
        self.launches += 1
        self._put(y, self._get(w, bfloat16, n * k).reshape(n, k) @ self._x(x, k, norm, sums=sums))

    def accumulates_inputs(self, mixer, fmt, tiled, k) -> bool:
        """As on the GPU (the accumulating `_n` / `_na` GEMVs, gdn_conv_step_sums or the attention kernels reading
        sums, the norm folded)."""
        return self.fold_norms and accumulates_inputs_shape(fmt, tiled, k)

    def gdn_conv_step(self, x, conv_state, conv_w, z, a, b, a_log, dt_bias, norm_w, state, slots, sync, out,
                      k_heads, v_heads, n_slots, eps, sums=False) -> None:
        self.launches += 1
        av, bv = self._get(a, bfloat16, v_heads), self._get(b, bfloat16, v_heads)
        slot = int(self._get(slots, np.int32, 1)[0])
        assert 0 <= slot < n_slots
        channels = 2 * k_heads * 128 + v_heads * 128
        taps = conv_state.nbytes // (n_slots * channels * 2)
        zv = self._get(z, np.float32 if sums else bfloat16, v_heads * 128).astype(bfloat16).astype(np.float32)
        xv = self._get(x, np.float32 if sums else bfloat16, channels).astype(bfloat16).astype(np.float32)
        if sums:  # the kernel zeroes the sums it has read
            self._put(x, np.zeros(channels, np.float32), np.float32)
            self._put(z, np.zeros(v_heads * 128, np.float32), np.float32)
        st = self._get(conv_state, bfloat16, taps * channels, slot * taps * channels).reshape(taps, channels)
        w = self._get(conv_w, bfloat16, (taps + 1) * channels).reshape(taps + 1, channels)
        mixed = silu((w[:taps] * st).sum(axis=0) + w[taps] * xv)  # fp32, as the kernel keeps it
        self._put(conv_state, np.concatenate([st[1:], xv[None]]), offset=slot * taps * channels)
        size = v_heads * 128 * 128
        s = self._get(state, np.float32, size, slot * size).reshape(v_heads, 128, 128)
        normed = _gdn_token(mixed, zv, av, bv, self._get(a_log, np.float32, v_heads),
                            self._get(dt_bias, np.float32, v_heads), self._get(norm_w, bfloat16, 128), s, k_heads,
                            v_heads, eps)
        self._put(state, s, np.float32, slot * size)
        self._put(out, normed)

    def attention(self, q_proj, k, v, q_norm, k_norm, positions, lens, page_table, kv, q, part_o, part_lse, gate,
                  out, g: AttnGeometry, sums=False) -> None:
        """As the GPU's two launches (the decode kernel with the prep folded in, the combine); `sums`: q_proj, k,
        v and gate are fp32 sums, rounded to bf16 as the GEMV's epilogue would, and zeroed (by the combine)."""
        d, hq, hkv = g.head_dim, g.n_heads, g.n_kv_heads
        read = [self._get(b, np.float32 if sums else bfloat16, n * d).astype(bfloat16).astype(np.float32)
                for b, n in ((q_proj, hq), (k, hkv), (v, hkv), (gate, hq))]
        if sums:
            for b, n in ((q_proj, hq), (k, hkv), (v, hkv), (gate, hq)):
                self._put(b, np.zeros(n * d, np.float32), np.float32)
        self._attn_prep(*read[:3], q_norm, k_norm, positions, lens, page_table, kv, q, g)
        self._attn_decode(q, lens, page_table, kv, part_o, part_lse, read[3], out, g)
        self.launches += 2

    def _attn_prep(self, q_proj, k, v, q_norm, k_norm, positions, lens, page_table, kv, q, g: AttnGeometry) -> None:
        """q_proj, k, v: the projections' values (fp32 arrays of bf16 values)."""
        d, hq, hkv = g.head_dim, g.n_heads, g.n_kv_heads
        pos = int(self._get(positions, np.int32, 1)[0])
        slot = int(self._get(lens, np.int32, 1)[0]) - 1
        table = self._get(page_table, np.int32, g.pages_per_seq)
        qh, kh, vh = q_proj.reshape(hq, d), k.reshape(hkv, d), v.reshape(hkv, d)
        cos, sin = _rope(g, pos)
        qh = apply_rope(rms_norm(qh, self._get(q_norm, bfloat16, d), g.eps)[None], cos, sin)[0]
        kh = apply_rope(rms_norm(kh, self._get(k_norm, bfloat16, d), g.eps)[None], cos, sin)[0]
        self._put(q, qh, np.float32)
        page = int(table[slot // PAGE])
        assert 0 <= page < g.n_pages, f"page table entry {page} for token {slot} is outside the pool"
        for kvi, data in ((0, kh), (1, vh)):
            for head in range(hkv):
                row = ((page * 2 + kvi) * hkv + head) * PAGE + slot % PAGE
                self._put(kv, data[head], offset=row * d)

    def _attn_decode(self, q, lens, page_table, kv, part_o, part_lse, gate, out, g: AttnGeometry) -> None:
        """gate: the gate projection's values (an fp32 array of bf16 values)."""
        d, hq, hkv = g.head_dim, g.n_heads, g.n_kv_heads
        length = int(self._get(lens, np.int32, 1)[0])
        table = self._get(page_table, np.int32, g.pages_per_seq)
        keys = np.empty((length, hkv, d), np.float32)
        values = np.empty_like(keys)
        for t in range(length):
            page = int(table[t // PAGE])
            for head in range(hkv):
                keys[t, head] = self._get(kv, bfloat16, d, (((page * 2) * hkv + head) * PAGE + t % PAGE) * d)
                values[t, head] = self._get(kv, bfloat16, d, (((page * 2 + 1) * hkv + head) * PAGE + t % PAGE) * d)
        qh = self._get(q, np.float32, hq * d).reshape(hq, d)
        group = hq // hkv
        o = np.empty((hq, d), np.float32)
        for h in range(hq):
            scores = keys[:, h // group] @ qh[h] * np.float32(d ** -0.5)
            p = np.exp(scores - scores.max())
            o[h] = (p / p.sum()) @ values[:, h // group]
        self._put(out, o * sigmoid(gate.reshape(hq, d)))

    # ---- prefill kernels (inferno/model/gpu/prefill.py PrefillOps): T rows of one sequence -------------
    def _rows_of(self, buf: DeviceBuffer, dtype: Any, rows: int, width: int, stride: int) -> np.ndarray:
        """`rows` rows of `width` values `stride` elements apart, as fp32 [rows, width]."""
        flat = self._get(buf, dtype, (rows - 1) * stride + width)
        return np.stack([flat[r * stride:r * stride + width] for r in range(rows)])

    def embed_rows(self, ids, table, out, tokens, vocab, hidden) -> None:
        self.launches += 1
        rows = self._get(ids, np.int32, tokens)
        assert ((rows >= 0) & (rows < vocab)).all(), f"token ids {rows} outside the table"
        t = self._get(table, bfloat16, vocab * hidden).reshape(vocab, hidden)
        self._put(out, t[rows])

    def rmsnorm_rows(self, x, w, y, rows, n, eps) -> None:
        self.launches += 1
        self._put(y, rms_norm(self._get(x, bfloat16, rows * n).reshape(rows, n), self._get(w, bfloat16, n), eps))

    def add_rmsnorm_rows(self, x, r, w, y, h, rows, n, eps) -> None:
        self.launches += 1
        hv = (self._get(x, bfloat16, rows * n) + self._get(r, bfloat16, rows * n)).reshape(rows, n)
        self._put(h, hv)
        self._put(y, rms_norm(hv.astype(bfloat16).astype(np.float32), self._get(w, bfloat16, n), eps))

    def dequant(self, fmt, w, out, n, k, tiled=False) -> None:
        self.launches += 1
        self._put(out, self._weights(fmt, w, n, k, tiled))

    def gemm(self, a, b, c, m, n, k) -> None:
        self.launches += 1
        am = self._get(a, bfloat16, m * k).reshape(m, k)
        self._put(c, am @ self._get(b, bfloat16, n * k).reshape(n, k).T)

    def silu_mul(self, gu, out, rows, inter) -> None:
        self.launches += 1
        g = self._get(gu, bfloat16, rows * 2 * inter).reshape(rows, 2 * inter)
        self._put(out, silu(g[:, :inter]) * g[:, inter:])

    def gdn_conv_rows(self, x, conv_state, conv_w, out, tokens, channels, n_slots, slot, x_stride) -> None:
        self.launches += 1
        assert 0 <= slot < n_slots
        taps = conv_state.nbytes // (n_slots * channels * 2)
        xs = self._rows_of(x, bfloat16, tokens, channels, x_stride)
        st = self._get(conv_state, bfloat16, taps * channels, slot * taps * channels).reshape(taps, channels)
        w = self._get(conv_w, bfloat16, (taps + 1) * channels).reshape(taps + 1, channels)
        window = np.concatenate([st, xs])  # [taps + T, channels]
        y = sum(w[j] * window[j:j + tokens] for j in range(taps + 1))
        self._put(out, silu(y))
        self._put(conv_state, window[-taps:], offset=slot * taps * channels)

    def gdn_chunk(self, qkv, z, a, b, a_log, dt_bias, norm_w, state, out, tokens, k_heads, v_heads, n_slots, slot,
                  eps, z_stride, ab_stride) -> None:
        self.launches += 1
        assert 0 <= slot < n_slots
        cq, zw = 2 * k_heads * 128 + v_heads * 128, v_heads * 128
        mixed = self._get(qkv, bfloat16, tokens * cq).reshape(tokens, cq)
        zs = self._rows_of(z, bfloat16, tokens, zw, z_stride)
        av = self._rows_of(a, bfloat16, tokens, v_heads, ab_stride)
        bv = self._rows_of(b, bfloat16, tokens, v_heads, ab_stride)
        a_log_v, dt, nw = (self._get(a_log, np.float32, v_heads), self._get(dt_bias, np.float32, v_heads),
                           self._get(norm_w, bfloat16, 128))
        size = v_heads * 128 * 128
        s = self._get(state, np.float32, size, slot * size).reshape(v_heads, 128, 128)
        o = np.stack([_gdn_token(mixed[t], zs[t], av[t], bv[t], a_log_v, dt, nw, s, k_heads, v_heads, eps)
                      for t in range(tokens)])
        self._put(state, s, np.float32, slot * size)
        self._put(out, o)

    def attn_prep_rows(self, qg, k, v, q_norm, k_norm, positions, lens, tables, kv, q, g: AttnGeometry,
                       tokens) -> None:
        """The decode prep over `tokens` batch lanes, each with a one-entry page table."""
        self.launches += 1
        d, hq, hkv = g.head_dim, g.n_heads, g.n_kv_heads
        pos = self._get(positions, np.int32, tokens)
        rows = self._get(lens, np.int32, tokens) - 1
        pages = self._get(tables, np.int32, tokens)
        qn, kn = self._get(q_norm, bfloat16, d), self._get(k_norm, bfloat16, d)
        qh = self._get(qg, bfloat16, tokens * 2 * hq * d).reshape(tokens, hq, 2 * d)[:, :, :d]
        kh = self._get(k, bfloat16, tokens * hkv * d).reshape(tokens, hkv, d)
        vh = self._get(v, bfloat16, tokens * hkv * d).reshape(tokens, hkv, d)
        out = np.empty((tokens, hq, d), np.float32)
        for t in range(tokens):
            cos, sin = _rope(g, int(pos[t]))
            out[t] = apply_rope(rms_norm(qh[t], qn, g.eps)[None], cos, sin)[0]
            kt = apply_rope(rms_norm(kh[t], kn, g.eps)[None], cos, sin)[0]
            page, slot = int(pages[t]), int(rows[t])
            assert 0 <= page < g.n_pages and 0 <= slot < PAGE, f"token {t}: page {page} row {slot} outside the pool"
            for kvi, data in ((0, kt), (1, vh[t])):
                for head in range(hkv):
                    self._put(kv, data[head], offset=(((page * 2 + kvi) * hkv + head) * PAGE + slot) * d)
        self._put(q, out, np.float32)

    def attn_prefill(self, q, gate, kv, pages, out, tokens, prefix, g: AttnGeometry) -> None:
        self.launches += 1
        d, hq, hkv = g.head_dim, g.n_heads, g.n_kv_heads
        length = prefix + tokens
        table = self._get(pages, np.int32, -(-length // PAGE))
        pool = self._get(kv, bfloat16, g.n_pages * 2 * hkv * PAGE * d).reshape(g.n_pages, 2, hkv, PAGE, d)
        cache = pool[table]  # [pages, 2, hkv, PAGE, d]
        keys = cache[:, 0].transpose(1, 0, 2, 3).reshape(hkv, -1, d)[:, :length]
        values = cache[:, 1].transpose(1, 0, 2, 3).reshape(hkv, -1, d)[:, :length]
        qh = self._get(q, np.float32, tokens * hq * d).reshape(tokens, hq, d)
        gates = self._get(gate, bfloat16, tokens * hq * d).reshape(tokens, hq, d)
        group = hq // hkv
        causal = np.arange(length)[None, :] <= prefix + np.arange(tokens)[:, None]  # [tokens, length]
        o = np.empty((tokens, hq, d), np.float32)
        for h in range(hq):
            scores = qh[:, h] @ keys[h // group].T * np.float32(d ** -0.5)
            scores = np.where(causal, scores, -np.inf)
            p = np.exp(scores - scores.max(axis=1, keepdims=True))
            o[:, h] = (p / p.sum(axis=1, keepdims=True)) @ values[h // group]
        self._put(out, o * sigmoid(gates))

    def argmax(self, x, out, n) -> None:
        self.launches += 1
        self._put(out, np.array([np.argmax(self._get(x, bfloat16, n))], np.int32), np.int32)

    def sample(self, logits, counts, scratch, out, n, params, u) -> None:
        """The device sampler's numpy model (`reference_token`): out[0] = token, counts[token] += 1."""
        from inferno.kernels.sample_variants import reference_token

        self.launches += 2
        c = self._get(counts, np.int32, n)
        token = reference_token(self._get(logits, bfloat16, n).astype(np.float32), c, params, u)
        c[token] += 1
        self._put(counts, c, np.int32)
        self._put(out, np.array([token], np.int32), np.int32)

    def close(self) -> None:
        self._dequant.clear()


def _rope(g: AttnGeometry, position: int) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin `[1, rotary_dim]` of text RoPE (t = h = w) at `position`, NeoX half-split."""
    half = g.rotary_dim // 2
    inv = 1.0 / g.rope_theta ** (np.arange(half, dtype=np.float64) * 2.0 / g.rotary_dim)
    ang = np.concatenate([position * inv, position * inv])[None]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def _gdn_token(mixed: np.ndarray, z: np.ndarray, a: np.ndarray, b: np.ndarray, a_log: np.ndarray,
               dt_bias: np.ndarray, norm_w: np.ndarray, s: np.ndarray, k_heads: int, v_heads: int,
               eps: float) -> np.ndarray:
    """One token of the fused GDN step: gates, q/k l2norm, delta rule on the fp32 state `s`
    [Hv, dk, dv] (updated in place), gated RMSNorm; returns the output [Hv * dv]."""
    dk = dv = 128
    kw = k_heads * dk
    q = mixed[:kw].reshape(k_heads, dk)
    k = mixed[kw:2 * kw].reshape(k_heads, dk)
    v = mixed[2 * kw:].reshape(v_heads, dv)
    q = q / np.sqrt((q * q).sum(-1, keepdims=True) + np.float32(1e-6)) * np.float32(dk ** -0.5)
    k = k / np.sqrt((k * k).sum(-1, keepdims=True) + np.float32(1e-6))
    group = v_heads // k_heads
    g = -np.exp(a_log) * softplus(a + dt_bias)
    beta = sigmoid(b)
    o = np.empty((v_heads, dv), np.float32)
    for j in range(v_heads):
        qj, kj = q[j // group], k[j // group]
        sj = s[j] * np.exp(g[j])
        u = beta[j] * (v[j] - kj @ sj)
        s[j] = sj + np.outer(kj, u)
        o[j] = qj @ s[j]
    zv = z.reshape(v_heads, dv)
    return (o / np.sqrt((o * o).mean(-1, keepdims=True) + np.float32(eps)) * norm_w * silu(zv)).reshape(-1)
