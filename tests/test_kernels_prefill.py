"""CPU: the prefill kernels (dequant, attn_prefill) build for sm_90a and sm_120a; manifests, launcher
packing and argument checks; a numpy model of the attention kernel's tiling (page blocks, key-block
order, diagonal mask, -inf rows) against the reference attention; the tile16-v1 dequant kernel's own
index and bit arithmetic run on numpy over its grid (tile16-v1 image in, every element once, equal
to `qlayout.dequant_rows` of the row-split payload); the compiled PTX of the tile16-v1 and
tile16-nvfp4-v1 dequant kernels run by a SIMT interpreter (shuffles, byte permutes, div.rn.f32)
against the formats' decoders (the NVFP4 kernel's model and launcher: test_kernels_dequant_nvfp4_tiled.py)."""

import hashlib
import re
import struct

import numpy as np
import pytest

from inferno.artifact.formats import groupwise as gw
from inferno.artifact.formats import nvfp4 as nv
from inferno.cuda.errors import LaunchError
from inferno.cuda.memory import DeviceBuffer
from inferno.cuda.params import ParamLayout, ParamSpec
from inferno.kernels import prefill_variants as pv
from inferno.kernels import qlayout as ql
from inferno.kernels.kv_layout import KVLayout, page_table
from inferno.kernels.manifest import Manifest, eval_grid, grid_symbols, source_hash
from inferno.kernels.reference import bf16
from inferno.kernels.registry import ARCHS, Tensor
from inferno.model.reference.attention import causal_attention
from ptx_tools import compile_ptx

SMEM_LIMIT = {"sm_90a": 232448, "sm_120a": 101376}
BY_NAME = {v.name: v for v in pv.PREFILL_VARIANTS}
PAIRS = [(v.name, a) for v in pv.PREFILL_VARIANTS for a in v.archs]


# --- numpy model of cute_kernels/attn_prefill.py's tiling -------------------------------------------


def flash_model(q, pool, pages, prefix, group, scale, bm=64, bn=64):
    """What the kernel computes, tile by tile, in fp32 (no bf16 rounding of P): q [T, Hq, d]; K/V
    read from the pool as 64-row page blocks (page * 2 + kv) * Hkv + g; key blocks from the last
    down to 0; the mask only on tiles that cross the diagonal; rows of all -inf keep max -inf."""
    t, hq, d = q.shape
    hkv = hq // group
    rows = pool.reshape(-1, d).astype(np.float32)
    s_len = prefix + t
    out = np.zeros((t, hq, d), np.float32)
    for h in range(hq):
        g = h // group
        for mb in range(-(-t // bm)):
            qt = np.zeros((bm, d), np.float32)
            qt[: min(bm, t - mb * bm)] = q[mb * bm:(mb + 1) * bm, h]
            n_blocks = -(-(prefix + min((mb + 1) * bm, t)) // bn)
            mx = np.full(bm, -np.inf, np.float32)
            sm = np.zeros(bm, np.float32)
            acc = np.zeros((bm, d), np.float32)
            for n in range(n_blocks - 1, -1, -1):
                def tile(kv):
                    blk = (int(pages[n]) * 2 + kv) * hkv + g
                    x = rows[blk * bn:(blk + 1) * bn].copy()
                    x[max(0, s_len - n * bn):] = 0  # rows past S: zero-filled
                    return x
                kt, vt = tile(0), tile(1)
                s = qt @ kt.T
                if (n + 1) * bn - 1 > prefix + mb * bm:
                    limit = np.minimum(prefix + mb * bm + np.arange(bm), s_len - 1) - n * bn
                    s[np.arange(bn)[None, :] > limit[:, None]] = -np.inf
                cur = np.maximum(mx, s.max(axis=1))
                base = np.where(cur == -np.inf, 0, cur)
                p = np.exp2((s - base[:, None]) * scale * np.log2(np.e))
                corr = np.exp2((mx - base) * scale * np.log2(np.e))
                sm = sm * corr + p.sum(axis=1)
                acc = acc * corr[:, None] + p @ vt
                mx = cur
            o = acc / np.where(sm > 0, sm, 1)[:, None]
            out[mb * bm:(mb + 1) * bm, h] = o[: min(bm, t - mb * bm)]
    return out


@pytest.mark.parametrize("t,prefix,group", [(1, 0, 6), (17, 64, 8), (130, 1000, 6), (70, 5, 2)])
def test_tiling_model_matches_reference(t, prefix, group):
    rng = np.random.default_rng(t + prefix)
    hkv, d = 2, 32
    hq = hkv * group
    lay = KVLayout(hkv, d)
    s = prefix + t
    n_pages = lay.pages_for(s) + 3
    pages = rng.permutation(n_pages)[: lay.pages_for(s)]
    pool = lay.empty_pool(n_pages)  # NaN everywhere the sequence does not write
    k, v = rng.standard_normal((2, s, hkv, d), np.float32)
    lay.write(pool, pages, 0, k, v)
    q = rng.standard_normal((t, hq, d), np.float32)
    kf, vf = lay.gather(pool, pages, s)
    want = causal_attention(q, kf, vf, d**-0.5)
    got = flash_model(q, np.asarray(pool, np.float32), page_table([list(pages)])[0], prefix, group, d**-0.5)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


def test_page_block_is_kv_layout_row():
    lay = KVLayout(4)
    for page, kv, g in [(0, 0, 0), (7, 1, 3), (3, 0, 2)]:
        assert ((page * 2 + kv) * 4 + g) * pv.PAGE_TOKENS == lay.row(page, kv, g, 0)
    assert lay.page_tokens == pv.PAGE_TOKENS and lay.head_dim == pv.HEAD_DIM


# --- numpy model of cute_kernels/dequant.py's NVFP4 word arithmetic ---------------------------------


def nvfp4_kernel_model(payload: np.ndarray, n: int, k: int) -> np.ndarray:
    """W float32 [n, k] decoded the kernel's way: code words n * K/8 + 4c.., scale word of groups
    (2c, 2c + 1) at scale_word0 + ((n//128) * K/64 + g//4) * 128 + (n%32) * 4 + (n%128)//32,
    E2M1 / E4M3 built from their bits, then (code * scale) / d_w."""
    w = payload.view(np.uint32)
    scale_word0 = -(-(n * k // 8) // 64) * 64
    d_w = w[scale_word0 + n * k // 64].view(np.float32)
    rows = np.arange(n)[:, None]
    q = np.arange(k)[None, :]
    word = w[rows * (k // 8) + q // 8]
    c = ((word >> (4 * (q % 8))) & 0xF).astype(np.uint32)
    m = c & 7
    normal = (((m >> 1) + 126) << 23) | ((m & 1) << 22)
    code = (((c & 8) << 28) | np.where(m >= 2, normal, (m & 1) * 0x3F000000)).astype(np.uint32).view(np.float32)
    g = q // 16
    sw = w[scale_word0 + ((rows // 128) * (k // 64) + g // 4) * 128 + (rows % 32) * 4 + (rows % 128) // 32]
    s = (sw >> (8 * (g % 4))) & 0xFF
    e = s >> 3
    normal_s = (((e + 120) << 23) | ((s & 7) << 20)).astype(np.uint32).view(np.float32)
    scale = np.where(e == 0, (s & 7).astype(np.float32) * np.float32(2.0**-9), normal_s)
    return (code * scale) / d_w


def test_nvfp4_kernel_model_matches_decoder():
    rng = np.random.default_rng(7)
    n, k = 256, 192
    codes = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
    scales = rng.integers(0, 0x7F, (n, k // 16), dtype=np.uint8)  # every finite non-negative word
    scales[0, :8] = np.arange(8)  # subnormal scales and +0
    pay = nv.pack(codes, scales, np.float32(3.7))
    got = nvfp4_kernel_model(pay, n, k)
    want = nv.decode(pay, (n, k))
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


# --- numpy model of cute_kernels/dequant.py's tile16-v1 groupwise-int kernel (DequantQTiled) ---------


def _dequant_tiled_model(fmt: str, image: np.ndarray, n: int, k: int, n0: int, rows: int, stride: int):
    """Run DequantQTiled's thread mapping and bit logic (its own `item_fields` / `code_bits`, on numpy
    arrays) over the grid the variant's rule gives: (out fp32 [rows, stride], NaN where unwritten;
    how many times each element was written)."""
    dq = pytest.importorskip("cute_kernels.dequant", reason="CuTe DSL not installed")
    v = pv.prefill_variant(pv.DEQUANT_TILED[fmt])
    bits, group, threads, items = (v.config[x] for x in ("bits", "group", "threads", "items"))
    grid = eval_grid(v.grid, {"M": rows, "K": k, "WL": image.size // 4, "out_stride": stride})
    words = image.view("<i4").astype(np.int64)  # the kernel's Int32 words (arithmetic shifts)
    groups = -(-k // 128) * 128 // group
    per_block = dq.items_per_block(bits)
    jstep = threads // per_block
    bx, by, tidx = np.meshgrid(np.arange(grid[0]), np.arange(grid[1]), np.arange(threads), indexing="ij")
    tile = n0 // 16 + by.ravel()
    j0 = bx.ravel() * (items * jstep) + tidx.ravel() // per_block
    vi = tidx.ravel() % per_block
    active = (tile * 16 < n0 + rows) & (j0 < groups)  # the threads that pass the kernel's first test
    tile, j0, vi = tile[active], j0[active], vi[active]
    high_off, scale_off = dq.plane_words(bits, -(-n // 16), groups)
    out = np.full((rows, stride), np.nan, np.float32)
    count = np.zeros((rows, stride), np.int64)
    for s in range(items):
        j = j0 + s * jstep
        base, high, high_shift, scale, scale_shift, row, col = dq.item_fields(
            bits, group, tile, np.minimum(j, groups - 1), vi, groups)
        assert np.all(base + (bits == 8) < high_off)  # inside the base plane
        wb = (words[base], words[base + 1]) if bits == 8 else words[base]
        hw = words[high_off + high] >> high_shift if bits in (5, 6) else 0
        sc = ((words[scale_off + scale] >> scale_shift) & 0xFFFF).astype(np.uint16).view(np.float16)
        r = row - n0
        ok = (j < groups) & (r >= 0) & (r < rows) & (col < k)
        for q in range(dq.VEC):
            c = dq.code_bits(bits, wb, hw, q)
            f = (c | dq.MAGIC).astype(np.uint32).view(np.float32) - np.float32(2**23 + (1 << (bits - 1)))
            val = (f * sc.astype(np.float32)).astype(bf16).astype(np.float32)
            out[r[ok], col[ok] + q] = val[ok]
            np.add.at(count, (r[ok], col[ok] + q), 1)
    return out, count


@pytest.mark.parametrize("fmt", list(gw.SCHEMES))
@pytest.mark.parametrize("n,k,n0,rows,stride", [
    (16, 128, 0, 16, 128), (40, 200, 0, 40, 200), (1002, 264, 301, 500, 272), (130, 8, 0, 130, 8),
    (48, 1000, 17, 16, 1000), (48, 384, 5, 3, 392), (33, 256, 32, 1, 256), (20, 5120, 0, 20, 5120)])
def test_dequant_tiled_model_matches_decoder(fmt, n, k, n0, rows, stride):
    """Every element of the slice written exactly once, with bf16(code * scale) of the row-split
    payload; padding columns and other rows never written."""
    from inferno.kernels.tiled import tile, tiled_geometry

    rng = np.random.default_rng()
    pay = ql.random_payload(fmt, n, k, rng)
    image = tile(fmt, pay, n, k)
    assert image.size == tiled_geometry(fmt, n, k).nbytes
    got, count = _dequant_tiled_model(fmt, image, n, k, n0, rows, stride)
    assert np.all(count[:, :k] == 1) and np.all(count[:, k:] == 0)
    want = ql.dequant_rows(fmt, pay, n, k, np.arange(n0, n0 + rows)).astype(np.float32).astype(bf16)
    assert np.array_equal(got[:, :k].astype(bf16).view(np.uint16), want.view(np.uint16))


# --- the compiled PTX of the tile16-v1 dequant kernel, run by a small SIMT interpreter ----------------
#
# The numpy model above checks the kernel's intended arithmetic; this runs what the DSL made of it:
# the kernel's PTX for sm_90a, every thread of the launch grid in lockstep (numpy lanes, forward
# branches as an active mask), loads from the tile16-v1 image, stores into a poisoned output.

M32 = (1 << 32) - 1
W_BASE, OUT_BASE = 1 << 40, 1 << 44  # fake device addresses of the weight image and the output
_ASM_F16 = re.compile(r"\{\s*\.reg \.b16 lo, hi;\s*mov\.b32 \{lo, hi\}, (%r\d+);\s*cvt\.f32\.f16 (%r\d+), lo;\s*\}")


def _compile_dequant_ptx(name: str) -> str:
    return compile_ptx(pv.prefill_variant(name))


def _ptx_program(ptx: str) -> list[str]:
    start = ptx.index("{", ptx.index(".entry")) + 1
    body = _ASM_F16.sub(r"cvt.f32.f16lo \2, \1;", ptx[start:ptx.rindex("}")])  # the kernel's body
    text = "\n".join(line.split("//")[0] for line in body.splitlines())
    out = []
    for st in text.split(";"):
        st = " ".join(st.split())
        while (m := re.match(r"^(\$\w+):\s*", st)):  # a label, then maybe its first statement
            out.append(m.group(1) + ":")
            st = st[m.end():]
        if st and not st.startswith("."):
            out.append(st)
    return out


def _s32(u):
    return ((u & M32) ^ 0x80000000).astype(np.int64) - 0x80000000


def _f32(u):
    return (u & M32).astype(np.uint32).view(np.float32)


def _bits(f):
    return np.asarray(f, np.float32).view(np.uint32).astype(np.uint64)


def _bf16_bits(u):
    return _bits(_f32(u).astype(bf16).astype(np.float32)) >> np.uint64(16)


def run_ptx(ptx: str, grid: tuple, threads: int, params: dict[str, bytes], image: np.ndarray, out: np.ndarray,
            writes: np.ndarray) -> None:
    """Run `ptx` over `grid` x `threads`: `image` (uint32 words) at W_BASE is read, `out` (uint32 words,
    bf16 pairs) at OUT_BASE written and each written word counted in `writes`."""
    bx, by, tx = np.meshgrid(np.arange(grid[0]), np.arange(grid[1]), np.arange(threads), indexing="ij")
    lanes = bx.size
    special = {"%tid.x": tx.ravel(), "%ctaid.x": bx.ravel(), "%ctaid.y": by.ravel()}
    reg: dict[str, np.ndarray] = {}
    active = np.ones(lanes, bool)
    waiting: dict[str, np.ndarray] = {}

    def val(x: str) -> np.ndarray:
        if x in reg:
            return reg[x]
        if x in special:
            return special[x].astype(np.uint64)
        if x.startswith("0f"):
            return np.full(lanes, int(x[2:], 16), np.uint64)
        return np.full(lanes, int(x) & ((1 << 64) - 1), np.uint64)

    def address(x: str) -> np.ndarray:  # [reg] or [reg+offset]
        base, _, off = x.strip("[]").partition("+")
        return val(base) + np.uint64(int(off or 0))

    def put(d: str, v, on: np.ndarray) -> None:
        old = reg.get(d, np.zeros(lanes, np.uint64))
        reg[d] = np.where(on, np.asarray(v).astype(np.uint64), old)

    for st in _ptx_program(ptx):
        if st.endswith(":"):
            active |= waiting.pop(st[:-1], False)
            continue
        pred = None
        if st.startswith("@"):
            p, st = st.split(" ", 1)
            pred = val(p.lstrip("@!")).astype(bool) ^ p.startswith("@!")
        op, _, rest = st.partition(" ")
        on = active if pred is None else active & pred
        if op == "ret":
            break
        if op in ("bra", "bra.uni"):
            assert rest.startswith("$"), st
            waiting[rest] = waiting.get(rest, np.zeros(lanes, bool)) | on
            active = active & ~on
            continue
        if op.startswith("ld.param"):
            m = re.match(r"(\{.*\}|%\w+), \[(\w+?)(?:\+(\d+))?\]", rest)
            dst, pname, off = m.group(1), m.group(2), int(m.group(3) or 0)
            raw = params[pname.rsplit("_", 1)[-1]]
            width = 8 if op.endswith("64") else 4
            for i, d in enumerate(dst.strip("{}").split(", ")):
                word = int.from_bytes(raw[off + i * width:off + (i + 1) * width], "little")
                put(d, np.full(lanes, word, np.uint64), on)
            continue
        args = [a.strip() for a in re.split(r",(?![^{]*\})", rest)]
        if op.startswith("ld.global"):
            addr = address(args[1])[on].astype(np.int64) - W_BASE
            assert np.all(addr % 4 == 0) and np.all(addr >= 0), st
            words = addr // 4
            for i, d in enumerate(args[0].strip("{}").split(", ")):
                assert np.all(words + i < image.size), f"{st}: read past the image"
                v = np.zeros(lanes, np.uint64)
                v[on] = image[words + i]
                put(d, v, on)
            continue
        if op.startswith("st.global"):
            srcs = args[1].strip("{}").split(", ")
            addr = address(args[0])[on].astype(np.int64) - OUT_BASE
            assert np.all(addr % (4 * len(srcs)) == 0) and np.all(addr >= 0), st
            for i, s in enumerate(srcs):
                w = addr // 4 + i
                assert np.all(w < out.size), f"{st}: write past the output"
                out[w] = val(s)[on] & M32
                np.add.at(writes, w, 1)
            continue
        if op == "prmt.b32":  # default mode only: byte i of d = byte (c >> 4i) & 7 of {b, a}
            a, b, c = (val(x) & M32 for x in args[1:4])
            assert not np.any(c[on] & 0x8888), f"{st}: sign-replicating selector not modelled"
            x = (b << np.uint64(32)) | a
            v = np.zeros(lanes, np.uint64)
            for i in range(4):
                sel = (c >> np.uint64(4 * i)) & np.uint64(7)
                v |= ((x >> (np.uint64(8) * sel)) & np.uint64(0xFF)) << np.uint64(8 * i)
            put(args[0], v, on)
            continue
        if op == "shfl.sync.idx.b32":  # lanes are (CTA, thread) raveled, so a warp is 32 aligned lanes
            srcs = (np.arange(lanes) & ~31) + (val(args[2]) & 31).astype(np.int64)
            assert np.all(active[srcs[on]]), f"{st}: a shuffle reads an inactive lane"
            put(args[0], val(args[1])[srcs], on)
            continue
        d, a = args[0], [val(x) for x in args[1:]]
        kind = op.split(".")[0]
        typ = op.rsplit(".", 1)[-1]
        if op == "cvt.f32.f16lo":
            v = _bits((a[0] & 0xFFFF).astype(np.uint16).view(np.float16).astype(np.float32))
        elif op == "cvt.rn.bf16x2.f32":
            v = (_bf16_bits(a[0]) << np.uint64(16)) | _bf16_bits(a[1])
        elif op in ("cvt.u64.u32",):
            v = a[0] & M32
        elif op in ("cvt.s64.s32",):
            v = _s32(a[0]).astype(np.uint64)
        elif op == "cvt.rn.f32.u32":
            v = _bits((a[0] & M32).astype(np.float32))
        elif typ == "f32" and kind in ("add", "sub", "mul", "div"):  # IEEE binary32, RNE (div.rn too)
            with np.errstate(all="ignore"):  # lanes that are not active compute on zeros
                fn = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}[kind]
                f = fn(_f32(a[0]), _f32(a[1]))
            v = _bits(f)
        elif kind == "setp":
            cmp = op.split(".")[1]
            unordered = typ == "f32" and cmp in ("ltu", "leu", "gtu", "geu", "equ", "neu")
            if typ == "f32":
                x, y = _f32(a[0]), _f32(a[1])
            else:
                x, y = (_s32(a[0]), _s32(a[1])) if typ == "s32" else (a[0] & M32, a[1] & M32)
            with np.errstate(invalid="ignore"):
                v = {"lt": x < y, "le": x <= y, "gt": x > y, "ge": x >= y, "eq": x == y,
                     "ne": x != y}[cmp[:2]]
            if unordered:
                v = v | np.isnan(x) | np.isnan(y)
        elif typ == "pred":
            if kind == "not":
                v = ~a[0].astype(bool)
            else:
                v = {"and": np.logical_and, "or": np.logical_or}[kind](a[0].astype(bool), a[1].astype(bool))
        elif kind == "selp":
            v = np.where(a[2].astype(bool), a[0], a[1]) & M32
        elif kind == "mov":
            v = a[0] & M32
        elif op == "mul.wide.s32":
            v = (_s32(a[0]) * _s32(a[1])).astype(np.uint64)
        elif op == "mul.wide.u32":
            v = (a[0] & M32) * (a[1] & M32)
        elif typ in ("s64", "b64", "u64"):
            if kind == "mad":
                v = a[0] * a[1] + a[2]
            elif kind == "shl":
                v = a[0] << a[1]
            else:
                v = {"add": np.add, "sub": np.subtract, "or": np.bitwise_or}[kind](a[0], a[1])
        else:  # 32-bit integer
            x, y = _s32(a[0]), (_s32(a[1]) if len(a) > 1 else None)
            u, sh = a[0] & M32, (a[1] & M32 if len(a) > 1 else None)
            if kind in ("shl", "shr"):
                sh = np.minimum(sh, 32).astype(np.int64)
                if kind == "shl":
                    v = np.where(sh >= 32, 0, (u << np.minimum(sh, 31).astype(np.uint64)) & M32)
                elif typ == "s32":
                    v = (x >> np.minimum(sh, 31)).astype(np.int64)
                else:
                    v = np.where(sh >= 32, 0, u >> np.minimum(sh, 31).astype(np.uint64))
            elif kind in ("and", "or", "xor"):
                v = {"and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor}[kind](u, a[1] & M32)
            elif kind == "add":
                v = x + y
            elif kind == "sub":
                v = x - y
            elif kind == "mul":
                assert op == "mul.lo.s32", st
                v = x * y
            elif kind == "min":
                v = np.minimum(x, y) if typ == "s32" else np.minimum(u, a[1] & M32)
            else:
                raise AssertionError(f"PTX instruction not modelled: {st}")
            v = np.asarray(v).astype(np.int64).astype(np.uint64) & M32
        put(d, v, on)
    assert not any(w.any() for w in waiting.values()), "threads left waiting at a label never reached"


_PTX: dict[str, str] = {}


@pytest.mark.parametrize("fmt", list(gw.SCHEMES))
@pytest.mark.parametrize("n,k,n0,rows,stride", [
    (40, 200, 0, 40, 200), (1002, 264, 301, 37, 272), (48, 384, 5, 3, 392), (33, 256, 32, 1, 256),
    (24, 5120, 3, 18, 5128)])
def test_dequant_tiled_ptx_matches_decoder(fmt, n, k, n0, rows, stride):
    """The kernel's compiled PTX, run over its launch grid on a tile16-v1 image: every element of the
    slice written once with bf16(code * scale) of the row-split payload; nothing else written."""
    name = pv.DEQUANT_TILED[fmt]
    ptx = _PTX.get(name) or _PTX.setdefault(name, _compile_dequant_ptx(name))
    from inferno.kernels.tiled import tile

    v = pv.prefill_variant(name)
    pay = ql.random_payload(fmt, n, k, np.random.default_rng())
    image = tile(fmt, pay, n, k).view("<u4")
    grid = eval_grid(v.grid, {"M": rows, "K": k, "WL": image.size, "out_stride": stride})
    out = np.full(rows * stride // 2 + 16, M32, np.uint64)  # bf16 pairs, poisoned, a guard tail
    writes = np.zeros(out.size, np.int64)
    params = {"0": struct.pack("<Qii", W_BASE, image.size, 0), "1": struct.pack("<Qiiq", OUT_BASE, rows, k, stride),
              "2": struct.pack("<i", n), "3": struct.pack("<i", n0)}
    run_ptx(ptx, grid, v.config["threads"], params, image.astype(np.uint64), out, writes)
    per_row = writes[:rows * stride // 2].reshape(rows, stride // 2)
    assert np.all(per_row[:, :k // 2] == 1) and np.all(per_row[:, k // 2:] == 0) and not writes[rows * stride // 2:].any()
    got = out[:rows * stride // 2].astype(np.uint32).view(np.uint16).reshape(rows, stride)[:, :k]
    want = ql.dequant_rows(fmt, pay, n, k, np.arange(n0, n0 + rows)).astype(np.float32).astype(bf16)
    assert np.array_equal(got, want.view(np.uint16))


@pytest.mark.parametrize("n,k,n0,rows,stride,d", [
    (256, 192, 0, 256, 192, None), (256, 192, 37, 100, 200, None), (40, 80, 3, 30, 88, None),
    (48, 5120, 17, 24, 5128, None), (64, 256, 0, 64, 256, 1.37 * 2.0**125), (64, 256, 0, 64, 256, 1e-37),
    (32, 128, 0, 32, 128, 2.0**-149)])
def test_dequant_nvfp4_tiled_ptx_matches_decoder(n, k, n0, rows, stride, d):
    """dequant_nvfp4_tiled's compiled PTX (warp shuffles, div.rn.f32 included) over its launch grid on a
    tile16-nvfp4-v1 image: every element of the slice written once, equal to bf16 of the NVFP4
    decoder's value; nothing else written. d_w random, or extreme (s / d_w subnormal, zero or
    infinite for some scales: the kernel's per-code division path)."""
    from inferno.kernels.tiled_nvfp4 import tile_words

    name = "dequant_nvfp4_tiled"
    ptx = _PTX.get(name) or _PTX.setdefault(name, _compile_dequant_ptx(name))
    v = pv.prefill_variant(name)
    rng = np.random.default_rng()
    codes = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
    scales = rng.integers(0, 0x7F, (n, k // 16), dtype=np.uint8)  # every finite non-negative word
    scales[0, :5] = np.arange(5)  # +0 and subnormal scales
    d = np.float32(rng.uniform(0.5, 3000.0) if d is None else d)
    image = tile_words(codes, scales, d).view("<u4")
    grid = eval_grid(v.grid, {"M": rows, "K": k, "WL": image.size, "out_stride": stride})
    out = np.full(rows * stride // 2 + 16, M32, np.uint64)  # bf16 pairs, poisoned, a guard tail
    writes = np.zeros(out.size, np.int64)
    params = {"0": struct.pack("<Qii", W_BASE, image.size, 0), "1": struct.pack("<Qiiq", OUT_BASE, rows, k, stride),
              "2": struct.pack("<i", n), "3": struct.pack("<i", n0)}
    run_ptx(ptx, grid, v.config["threads"], params, image.astype(np.uint64), out, writes)
    per_row = writes[:rows * stride // 2].reshape(rows, stride // 2)
    assert np.all(per_row[:, :k // 2] == 1) and np.all(per_row[:, k // 2:] == 0)
    assert not writes[rows * stride // 2:].any()
    got = out[:rows * stride // 2].astype(np.uint32).view(np.uint16).reshape(rows, stride)[:, :k]
    with np.errstate(all="ignore"):
        want = nv.dequantize(codes[n0:n0 + rows], scales[n0:n0 + rows], d).astype(bf16)
    assert np.array_equal(got, want.view(np.uint16))


@pytest.mark.parametrize("fmt", list(gw.SCHEMES))
def test_dequant_tiled_plane_words_match_tiled_geometry(fmt):
    dq = pytest.importorskip("cute_kernels.dequant", reason="CuTe DSL not installed")
    from inferno.kernels.tiled import tiled_geometry

    bits = gw.SCHEMES[fmt].bits
    for n, k in [(16, 128), (1002, 200), (34816, 5120), (5120, 17408)]:
        t = tiled_geometry(fmt, n, k)
        assert dq.plane_words(bits, t.tiles, t.groups) == (t.high_offset // 4, t.scale_offset // 4)
        assert t.base_bytes == t.tiles * t.groups * dq.BLOCK_WORDS * 4
        assert t.high_bytes == t.tiles * t.groups * dq.high_block_words(bits) * 4


# --- variants, builds, manifests -----------------------------------------------------------------


def test_variants_are_distinct():
    from inferno.kernels.attn_variants import ATTN_VARIANTS
    from inferno.kernels.gdn_variants import GDN_VARIANTS
    from inferno.kernels.gemv_variants import GEMV_VARIANTS
    from inferno.kernels.registry import VARIANTS

    assert len(BY_NAME) == len(pv.PREFILL_VARIANTS)
    others = {v.name for v in (*VARIANTS, *GEMV_VARIANTS, *GDN_VARIANTS, *ATTN_VARIANTS) if v not in pv.PREFILL_VARIANTS}
    assert not others & set(BY_NAME), "a prefill variant name clashes with another variant"
    for v in pv.PREFILL_VARIANTS:
        assert set(v.archs) == set(ARCHS) and v.source_file.is_file()
    with pytest.raises(LaunchError, match="no prefill kernel variant"):
        pv.prefill_variant("dequant_q3")


@pytest.fixture(scope="module")
def built(kernel_builds):
    return kernel_builds(pv.PREFILL_VARIANTS, ARCHS)


def _manifest(root, name, arch) -> Manifest:
    return Manifest.read(root / arch / f"{name}.json")


@pytest.mark.parametrize("name,arch", PAIRS)
def test_manifest_complete_and_consistent(built, name, arch):
    from inferno.cuda.image import cubin_entries, inspect_image
    from inferno.kernels import cache

    v = BY_NAME[name]
    m = _manifest(built, name, arch)
    cubin = (built / arch / f"{name}.cubin").read_bytes()
    info = inspect_image(cubin)
    assert info.kind == "cubin" and info.arch == arch
    assert m.entry in cubin_entries(cubin)
    assert (m.variant, m.op, m.arch, m.source) == (v.name, v.op, arch, v.source)
    assert m.source_hash == source_hash(v.source_file, v.config)
    assert m.cubin_sha256 == hashlib.sha256(cubin).hexdigest()
    assert m.config == v.config and m.cluster == [1, 1, 1]
    assert m.block == [v.config["threads"], 1, 1]
    assert 0 <= m.smem <= SMEM_LIMIT[arch]
    args = [a for a in v.args if a is not None]
    assert [p.name for p in m.params] == [a.name for a in args]
    for p, a in zip(m.params, args):
        if isinstance(a, Tensor):
            assert (p.kind, p.dtype, p.dyn_shape, p.dyn_stride) == ("tensor", a.dtype, list(a.dyn_shape),
                                                                     list(a.dyn_stride))
        else:
            assert (p.kind, p.size) == (a.dtype, 4)
    assert grid_symbols(m.grid) <= {s for p in m.params for s in p.dyn_shape}
    assert cache.stale_reason(v, arch, built) is None


def test_attention_smem_holds_q_k_v_tiles(built):
    for arch in ARCHS:
        for g in pv.GQA_GROUPS:
            m = _manifest(built, f"attn_prefill_g{g}", arch)
            assert m.smem >= 3 * 64 * pv.HEAD_DIM * 2


# --- launchers: packing, grids, argument checks (no GPU: launch is recorded) -----------------------


class _Recorder:
    def __init__(self):
        self.calls = []

    def __call__(self, kernel, grid, block, params, smem, stream):
        self.calls.append((grid, tuple(block), params, smem))


@pytest.fixture
def rec(monkeypatch):
    r = _Recorder()
    monkeypatch.setattr(pv, "launch", r)
    return r


def _fake_loaded(built, name, arch="sm_90a"):
    from inferno.kernels.cache import LoadedKernel

    m = _manifest(built, name, arch)
    specs = [ParamSpec(p.name, p.kind, p.size, p.align, len(p.dyn_shape) if p.kind == "tensor" else 0,
                       len(p.dyn_stride)) for p in m.params]
    return LoadedKernel(BY_NAME[name], m, None, ParamLayout(specs, name))


def _dev(nbytes, ptr):
    return DeviceBuffer(ptr, nbytes, "buf")


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("fmt", list(pv.DEQUANT_FORMATS))
def test_dequant_launcher_packs_and_grids(built, rec, arch, fmt):
    k = pv.Dequant(_fake_loaded(built, pv.DEQUANT_FORMATS[fmt], arch))
    assert k.fmt == fmt
    if fmt == "NVFP4":
        n, kk, n0, rows, stride = 1024, 192, 256, 500, 200
        nbytes, chunks = nv.geometry((n, kk)).nbytes, kk // 32
    else:
        n, kk, n0, rows, stride = 1000, 200, 300, 500, 264
        nbytes, chunks = gw.geometry(fmt, (n, kk)).nbytes, 8
    w, out = _dev(nbytes, 1 << 20), _dev(rows * stride * 2, 1 << 28)
    k(w, out, n, kk, n0=n0, rows=rows, out_stride=stride)
    grid, block, params, smem = rec.calls[-1]
    assert grid == (-(-rows * chunks // 256), 1, 1) and block == (256, 1, 1) and smem == 0
    assert params.raw("w") == struct.pack("<Qii", w.ptr, nbytes // 4, 0)
    assert params.raw("out") == struct.pack("<Qiiq", out.ptr, rows, kk, stride)
    assert params.raw("n_total") == struct.pack("<i", n) and params.raw("n0") == struct.pack("<i", n0)
    k(w, _dev(n * kk * 2, 1 << 28), n, kk)  # defaults: every row, contiguous
    assert rec.calls[-1][2].raw("out") == struct.pack("<Qiiq", 1 << 28, n, kk, kk)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("fmt", list(pv.FORMATS))  # NVFP4's tile16-nvfp4-v1: test_kernels_dequant_nvfp4_tiled.py
def test_dequant_tiled_launcher_packs_and_grids(built, rec, arch, fmt):
    from inferno.kernels.tiled import tiled_geometry

    k = pv.Dequant(_fake_loaded(built, pv.DEQUANT_TILED[fmt], arch))
    assert k.fmt == fmt and k.tiled
    n, kk, n0, rows, stride = 1000, 200, 300, 500, 264
    nbytes = tiled_geometry(fmt, n, kk).nbytes
    assert nbytes > gw.geometry(fmt, (n, kk)).nbytes  # 1000 rows: the image pads to 63 tiles
    w, out = _dev(nbytes, 1 << 20), _dev(rows * stride * 2, 1 << 28)
    k(w, out, n, kk, n0=n0, rows=rows, out_stride=stride)
    grid, block, params, smem = rec.calls[-1]
    # x: the 2 * 256 items of a tile over 1024 per CTA; y: 32 tiles + 1 (n0 = 300 is inside one)
    assert grid == (1, 33, 1) and block == (256, 1, 1) and smem == 0
    assert params.raw("w") == struct.pack("<Qii", w.ptr, nbytes // 4, 0)
    assert params.raw("out") == struct.pack("<Qiiq", out.ptr, rows, kk, stride)
    assert params.raw("n_total") == struct.pack("<i", n) and params.raw("n0") == struct.pack("<i", n0)
    k(w, _dev(n * 5120 * 2, 1 << 28), n, 200)
    assert rec.calls[-1][0] == (1, 64, 1)
    nbytes = tiled_geometry(fmt, 64, 5120).nbytes
    k(_dev(nbytes, 1 << 20), _dev(64 * 5120 * 2, 1 << 28), 64, 5120)
    assert rec.calls[-1][0] == (10, 5, 1)  # 40 pairs x 256 items / 1024; 4 tiles + 1


def test_dequant_tiled_launcher_refuses_bad_arguments(built, rec):
    from inferno.kernels.tiled import tiled_geometry

    k = pv.Dequant(_fake_loaded(built, "dequant_q4_tiled"))
    n, kk = 72, 256
    w, out = _dev(tiled_geometry("Q4G64_F16S", n, kk).nbytes, 1 << 20), _dev(n * kk * 2, 1 << 28)
    with pytest.raises(LaunchError, match="bytes, the call needs"):  # a row-split payload, not the image
        k(_dev(gw.geometry("Q4G64_F16S", (n, kk)).nbytes, 1 << 20), out, n, kk)
    with pytest.raises(LaunchError, match="too large for one call"):  # 65535 tiles + 1 > the grid's y limit
        k(w, out, 16 * 65535, 8)
    with pytest.raises(LaunchError, match="run past"):
        k(w, out, n, kk, n0=70, rows=8)
    assert not rec.calls
    with pytest.raises(LaunchError, match="no tile16-v1 dequant kernel"):
        pv.Dequant.for_format("Q3G64_F16S", tiled=True)


def test_dequant_launcher_refuses_bad_arguments(built, rec):
    k = pv.Dequant(_fake_loaded(built, "dequant_q4"))
    n, kk = 64, 256
    w, out = _dev(gw.geometry("Q4G64_F16S", (n, kk)).nbytes, 1 << 20), _dev(n * kk * 2, 1 << 28)
    with pytest.raises(LaunchError, match="multiple of 8"):
        k(w, out, n, 260)
    with pytest.raises(LaunchError, match="run past"):
        k(w, out, n, kk, n0=60, rows=8)
    with pytest.raises(LaunchError, match="bytes, the call needs"):
        k(w, out, 2 * n, kk)
    with pytest.raises(LaunchError, match="less than k"):
        k(w, out, n, kk, out_stride=128)
    with pytest.raises(LaunchError, match="not 16-byte aligned"):
        k(w, _dev(n * kk * 2, (1 << 28) + 8), n, kk)
    nvk = pv.Dequant(_fake_loaded(built, "dequant_nvfp4"))
    with pytest.raises(LaunchError, match="NVFP4 needs"):
        nvk(w, out, 100, 256)
    with pytest.raises(LaunchError, match="multiple of 64"):
        nvk(w, out, 128, 96)
    assert not rec.calls


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("q_f32", [False, True])
@pytest.mark.parametrize("group,hq", [(6, 24), (8, 16)])
def test_attention_launcher_packs_and_grids(built, rec, arch, group, hq, q_f32):
    k = pv.AttnPrefill(_fake_loaded(built, f"attn_prefill_g{group}" + ("_qf32" if q_f32 else ""), arch))
    t, prefix, pool_pages, d = 100, 1000, 40, pv.HEAD_DIM
    width = hq * d
    qg = _dev(t * 2 * width * 2, 1 << 20)  # interleaved q|gate projection, gate read in place
    q = _dev(t * width * (4 if q_f32 else 2), 1 << 24)
    kv = _dev(pool_pages * 2 * (hq // group) * 64 * d * 2, 1 << 30)
    pages = _dev(18 * 4, 1 << 27)
    out = _dev(t * width * 2, 1 << 28)
    gate = qg.view(d * 2, qg.nbytes - d * 2)
    k(q, gate, kv, pages, out, t, hq, prefix, pool_pages, gate_stride=2 * width, gate_hstride=2 * d)
    grid, block, params, smem = rec.calls[-1]
    assert grid == (hq, 2, 1) and block == (128, 1, 1) and smem == _manifest(built, k.name, arch).smem
    assert params.raw("q") == struct.pack("<Qiiqq", q.ptr, t, hq, width, d)
    assert params.raw("gate") == struct.pack("<Qiiqq", gate.ptr, t, hq, 2 * width, 2 * d)
    assert params.raw("kv") == struct.pack("<Qii", kv.ptr, pool_pages * 2 * (hq // group) * 64, 0)
    assert params.raw("pages") == struct.pack("<Qii", pages.ptr, 18, 0)
    assert params.raw("out") == struct.pack("<Qiiq", out.ptr, t, hq, width)
    assert params.raw("prefix") == struct.pack("<i", prefix)
    assert params.raw("scale") == struct.pack("<f", d**-0.5)


def test_attention_launcher_refuses_bad_arguments(built, rec):
    k = pv.AttnPrefill(_fake_loaded(built, "attn_prefill_g6"))
    t, hq, d = 10, 24, pv.HEAD_DIM
    q, out = _dev(t * hq * d * 2, 1 << 20), _dev(t * hq * d * 2, 1 << 24)
    kv, pages = _dev(4 * 2 * 4 * 64 * d * 2, 1 << 30), _dev(64, 1 << 27)
    with pytest.raises(LaunchError, match="not a multiple of its GQA group"):
        k(q, q, kv, pages, out, t, 20, 0, 4)
    with pytest.raises(LaunchError, match="pages .* bytes, the call needs"):
        k(q, q, kv, pages, out, t, hq, 64 * 16, 4)  # 17 pages of ids needed, 16 given
    with pytest.raises(LaunchError, match="kv_pool .* bytes"):
        k(q, q, kv, pages, out, t, hq, 0, 5)
    with pytest.raises(LaunchError, match="multiple of 8"):
        k(q, q, kv, pages, out, t, hq, 0, 4, q_hstride=260)
    with pytest.raises(LaunchError, match="less than the row width"):
        k(q, q, kv, pages, out, t, hq, 0, 4, out_stride=256)
    with pytest.raises(LaunchError, match="must be >= 0"):
        k(q, q, kv, pages, out, t, hq, -1, 4)
    assert not rec.calls
    k32 = pv.AttnPrefill(_fake_loaded(built, "attn_prefill_g6_qf32"))
    with pytest.raises(LaunchError, match="q .* bytes, the call needs"):  # fp32 q: twice the bytes
        k32(q, q, kv, pages, out, t, hq, 0, 4)
    assert not rec.calls
    with pytest.raises(LaunchError, match="no prefill attention kernel"):
        pv.AttnPrefill.for_group(4)
    with pytest.raises(LaunchError, match="no dequant kernel"):
        pv.Dequant.for_format("Q3G64_F16S")


def test_flops_in_docs_match_model():
    """docs/kernels-prefill.md quotes causal FLOPs for 27B at T = P = 4096; keep it in sync."""
    from pathlib import Path

    doc = (Path(pv.__file__).resolve().parents[2] / "docs" / "kernels-prefill.md").read_text()
    t, p, hq, d = 4096, 4096, 24, 256
    keys = sum(p + i + 1 for i in range(t))
    flops = 4 * hq * d * keys
    assert f"{flops / 1e12:.2f} TFLOP" in doc
