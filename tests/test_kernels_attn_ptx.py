"""CPU: the compiled PTX of the tensor-core decode kernel (AttnDecodeMma) moves the right data.

The numpy emulation in test_kernels_attn.py checks the kernel's intended index math; it cannot see
how the CuTe DSL lowers that math to addresses. This test reads the generated code instead: it
evaluates the integer arithmetic of the PTX for each of the 256 threads (first K/V block, stage 0,
CTA (0, 0, 0); branches are not followed, every instruction runs once in text order, which is exact
for the straight-line address code), decodes every ldmatrix row address back to the smem element it
reads (sQ / sP rows, swizzled K / V stage rows), and checks, lane by lane against the PTX fragment
layouts of mma.m16n8k16: the A and B operands of every mma, the accumulator chains, the partial
scores stored to sS, the softmax's sS reads and P stores, and the part_o store of each accumulator
(row h = hi + row 8 + h = lo of the same column). It caught a DSL lowering bug that the emulation
could not: a slice of the swizzled V stage inside a swizzle atom had its offset counted twice.
AttnDecodeFused (the same block loop on a q it normalises and RoPEs itself) gets the same check,
with its q stores into sQ (8 dims per lane) and its q load at the view's strides.

The same evaluator checks the global addresses of the q load of attn_qk_prep and of the gate load
of every combine variant: they read [B, Hq, 256] views with their own row and head strides (the
q and gate projections where the GEMVs wrote them), so a wrong stride shows as a wrong address.
"""

from __future__ import annotations

import re
from collections import defaultdict

import pytest

from inferno.kernels import attn_variants as av
from ptx_tools import compile_ptx

MMA_VARIANTS = [v.name for v in av.DECODE_VARIANTS if v.cls == "AttnDecodeMma"]
FUSED_VARIANTS = ["attn_decode_g6_fused", "attn_decode_g8_fused_s3"]  # the 27B / 35B groups, 2 and 3 stages
M32 = (1 << 32) - 1
PO_STRIDE = 1 << 20  # every stride of part_o in the fake launch parameters: address -> (row, dim)


def _compile_ptx(name: str) -> str:
    return compile_ptx(av.attn_variant(name))


# --- a straight-line evaluator of PTX integer code ----------------------------------------------------

def _statements(ptx: str) -> list[str]:
    body = ptx[ptx.index("{", ptx.index(".entry")):]
    text = "\n".join(line.split("//")[0] for line in body.splitlines())
    out = []
    for st in text.split(";"):
        st = re.sub(r"^(\$?\w+:\s*)+", "", " ".join(st.split())).lstrip("{} ")
        if st and not st.startswith(".") and not st.startswith("@"):  # predicated: branches, guarded stores
            out.append(st)
    return out


def _signed(v: int, op: str) -> int:
    bits = 64 if re.search(r"\.[bsu]64", op) else 32
    return v - (1 << bits) if v >> (bits - 1) & 1 else v


def _run(stmts: list[str], tidx: int, params: dict, ctaid: tuple[int, int, int] = (0, 0, 0)) -> dict:
    """Evaluate one thread of CTA `ctaid`: integer registers (None where unknown: loads, floats), the
    ldmatrix (op, dst regs, address), mma (d, a, b, c regs), shared loads / stores (address, regs),
    global loads (address) and stores, and each float register's provenance (the mma results it was
    computed from)."""
    reg: dict[str, int | None] = {"%tid.x": tidx, "%ctaid.x": ctaid[0], "%ctaid.y": ctaid[1], "%ctaid.z": ctaid[2]}
    prov: dict[str, set] = {}
    rec = defaultdict(list)

    def val(x: str):
        if re.fullmatch(r"-?\d+", x):
            return int(x)
        if x.startswith("__"):  # the dynamic smem symbol: address 0
            return 0
        return reg.get(x)

    def addr(rest: str):
        m = re.search(r"\[(%\w+)(?:\+(-?\d+))?\]", rest)
        base = reg.get(m.group(1))
        return None if base is None else base + int(m.group(2) or 0)

    for st in stmts:
        op, _, rest = st.partition(" ")
        regs = re.findall(r"%\w+", rest)
        if op.startswith("ldmatrix"):
            dst = re.findall(r"%\w+", rest.split("}")[0])
            rec["ldmatrix"].append((op, dst, addr(rest)))
            for d in dst:
                reg[d], prov[d] = None, set()
        elif op.startswith("mma.sync"):
            groups = tuple(re.findall(r"%\w+", g) for g in re.findall(r"\{([^}]*)\}", rest))
            rec["mma"].append(groups)
            for d in groups[0]:
                reg[d], prov[d] = None, {(len(rec["mma"]) - 1, d)}
        elif op.startswith("st."):
            space = "shared" if op.startswith("st.shared") else "global"
            rec[space + "_st"].append((addr(rest), rest.split("]", 1)[1].strip(" ,")))
        elif op.startswith("ld.shared"):
            rec["shared_ld"].append((addr(rest), regs[0]))
            reg[regs[0]] = None
        elif op.startswith("ld.global"):
            rec["global_ld"].append(addr(rest))
            for d in re.findall(r"%\w+", rest.split("[")[0]):
                reg[d], prov[d] = None, set()
        elif op.startswith("ld.param"):  # one register or a vector of them (v2: consecutive words)
            m = re.search(r"param_(\d+)(?:\+(\d+))?", rest)
            width = 8 if re.search(r"\.[bsu]64", op) else 4
            for i, d in enumerate(re.findall(r"%\w+", rest.split("[")[0])):
                reg[d] = params.get((int(m.group(1)), int(m.group(2) or 0) + i * width))
        elif op.startswith(("cp.async", "bar", "bra", "ret", "griddep", "ldmatrix")):
            continue
        else:
            d, srcs = rest.split(",")[0].strip(), [x.strip() for x in rest.split(",")[1:]]
            prov[d] = set().union(*(prov.get(x, set()) for x in srcs))
            reg[d] = _eval(op, [val(x) for x in srcs])
    return dict(rec, prov=prov)


def _eval(op: str, a: list):
    base = op.split(".")[0]
    mask = (1 << 64) - 1 if re.search(r"\.[bsu]64", op) else M32
    if base in ("mov", "shfl"):
        return a[0]
    if re.search(r"\.f(16|32|64)\b", op) or any(x is None for x in a[:2 if base != "selp" else 3]):
        return None  # floats and anything computed from an unknown
    s = [_signed(x, op) if isinstance(x, int) and not isinstance(x, bool) else x for x in a]
    if base == "cvt":
        return _signed(a[0], op.split(".")[-1]) & mask
    ops = {"add": lambda: a[0] + a[1], "sub": lambda: a[0] - a[1], "and": lambda: a[0] & a[1],
           "or": lambda: a[0] | a[1], "xor": lambda: a[0] ^ a[1], "shl": lambda: a[0] << a[1],
           "mul": lambda: a[0] * a[1] if "wide" in op else (s[0] * s[1]) >> 32 if ".hi" in op else s[0] * s[1],
           "mad": lambda: s[0] * s[1] + s[2],
           "shr": lambda: s[0] >> a[1] if re.search(r"\.s(32|64)", op) else a[0] >> a[1],
           "min": lambda: min(s[0], s[1]), "max": lambda: max(s[0], s[1]),
           "div": lambda: abs(s[0]) // abs(s[1]) * (1 if (s[0] >= 0) == (s[1] > 0) else -1),  # truncating
           "selp": lambda: a[0] if a[2] else a[1]}
    if base == "setp":
        return {"eq": s[0] == s[1], "ne": s[0] != s[1], "lt": s[0] < s[1], "le": s[0] <= s[1],
                "gt": s[0] > s[1], "ge": s[0] >= s[1]}[op.split(".")[1]]
    return ops[base]() & mask if base in ops else None


# --- the kernel's smem map and the checks ----------------------------------------------------------

def _smem_map(stages: int) -> dict:
    """Byte offsets of AttnDecodeMma's SharedStorage (declaration order, its alignments)."""
    from cute_kernels.attn_decode import HEAD_DIM, M_ROWS, P_STRIDE, Q_STRIDE

    kv = 32 * HEAD_DIM * 2 * stages
    q = 2 * kv
    p = q + M_ROWS * Q_STRIDE * 2
    s = p + M_ROWS * P_STRIDE * 2
    return dict(v=kv, q=q, p=p, s=s, alpha=s + 4 * 4 * 8 * 32)  # sS: fp32 [4 quarters, 8 rows, 32 tokens]


def _kv_rows(stages: int) -> dict[int, tuple]:
    """ldmatrix row address -> (K or V, token, first dim) for 16-byte rows of stage 0: 8 x 64 atoms
    (128-byte rows, Swizzle<3,3,3> on the element offset), atoms token-major then dims."""
    v_at = _smem_map(stages)["v"]
    out = {}
    for tok in range(32):
        for dim in range(0, 256, 8):
            e = (tok % 8) * 64 + dim % 64
            e = (tok // 8) * 512 + (dim // 64) * 2048 + (e ^ (((e >> 6) & 7) << 3))
            out[2 * e], out[v_at + 2 * e] = ("K", tok, dim), ("V", tok, dim)
    return out


def _check(ptx: str, group: int, stages: int, fused: bool = False) -> list[str]:
    """Errors of AttnDecodeMma's PTX (`fused`: AttnDecodeFused's, which writes q into sQ itself, 8 dims
    per lane, and keeps the new K / V row in sNew after sL)."""
    sm = _smem_map(stages)
    kv_rows = _kv_rows(stages)
    stmts = _statements(ptx)
    po = 10 if fused else 4  # part_o's parameter
    params = {(po, 0): 0, **{(po, o): PO_STRIDE for o in range(8, 48, 4)}}  # part_o: base 0, every stride
    new_rows = sm["alpha"] + 3 * 32  # fused: sNew [2, 256] bf16 after sAlpha, sM, sL (fp32 [8] each)
    errors: list[str] = []
    stored: set[tuple[int, int]] = set()

    def decode(address, trans):
        if address is None:
            return None
        if trans or address < sm["q"]:
            return kv_rows.get(address)
        region, stride = ("Q", 264) if address < sm["p"] else ("P", 40)
        e, r = divmod(address - sm["q" if region == "Q" else "p"], 2)
        return (region, e // stride, e % stride) if r == 0 and e % 8 == 0 else None

    for w in range(8):
        runs = [_run(stmts, 32 * w + lane, params) for lane in range(32)]
        held = {}  # (register, lane) -> what ldmatrix put there
        for i, (op, dst, _) in enumerate(runs[0]["ldmatrix"]):
            trans = ".trans" in op
            rows = [decode(runs[lane]["ldmatrix"][i][2], trans) for lane in range(32)]
            for m, lane in ((m, lane) for m in range(4) for lane in range(32)):
                if trans:  # lane gets rows 2 (lane % 4) and + 1, column lane // 4 of matrix m
                    r0, r1 = rows[8 * m + 2 * (lane % 4)], rows[8 * m + 2 * (lane % 4) + 1]
                    if r0 is None or r1 is None or (r0[0], r0[2]) != (r1[0], r1[2]):
                        errors.append(f"warp {w} ldmatrix {i} lane {lane}: rows {r0} {r1}")
                        continue
                    held[dst[m], lane] = (r0[0], (r0[1], r1[1]), r0[2] + lane // 4)
                else:  # lane gets row lane // 4, columns 2 (lane % 4) and + 1 of matrix m
                    r = rows[8 * m + lane // 4]
                    if r is None:
                        errors.append(f"warp {w} ldmatrix {i} lane {lane}: address outside sQ / sK / sP")
                        continue
                    held[dst[m], lane] = (r[0], r[1], r[2] + 2 * (lane % 4))
        acc = {}  # (mma, d register, lane) -> (operand kind, C row, column meaning, k0)
        for j, (d, a, b, c) in enumerate(runs[0]["mma"]):
            fa = [[held.get((a[x], lane)) for lane in range(32)] for x in range(4)]
            fb = [[held.get((b[x], lane)) for lane in range(32)] for x in range(2)]
            if any(h is None for f in fa + fb for h in f):
                errors.append(f"warp {w} mma {j}: an operand not loaded by ldmatrix")
                continue
            kind, k0 = fa[0][0][0], fa[0][0][2]
            for lane in range(32):
                g, t = lane // 4, lane % 4
                want = [(g, k0 + 2 * t), (g + 8, k0 + 2 * t), (g, k0 + 8 + 2 * t), (g + 8, k0 + 8 + 2 * t)]
                if [(fa[x][lane][1], fa[x][lane][2]) for x in range(4)] != want:
                    errors.append(f"warp {w} mma {j} lane {lane}: A holds {[f[lane] for f in fa]}, want {want}")
                for x in range(2):  # b0: k 2t, 2t + 1; b1: k 8 + 2t, +1; column g
                    got, ref = fb[x][lane], fb[0][4 * g]
                    ok = (got[0] == "K" and got[2] == k0 + 8 * x + 2 * t and got[1] == ref[1]) if kind == "Q" else \
                         (got[0] == "V" and got[1] == (k0 + 8 * x + 2 * t, k0 + 8 * x + 2 * t + 1)
                          and got[2] == ref[2])
                    if not ok:
                        errors.append(f"warp {w} mma {j} lane {lane}: B{x} holds {got} (k0 {k0})")
            ncol = [fb[0][4 * n][1] if kind == "Q" else fb[0][4 * n][2] for n in range(8)]  # token / dim
            for lane in range(32):
                g, t = lane // 4, lane % 4
                for p in range(4):
                    acc[j, d[p], lane] = me = (kind, g + 8 * (p >> 1), ncol[2 * t + (p & 1)], k0)
                    prev = [acc.get(x + (lane,)) for x in runs[lane]["prov"].get(c[p], set())]
                    if prev and prev != [(kind, me[1], me[2], k0 - 16)]:
                        errors.append(f"warp {w} mma {j} lane {lane}: {prev} accumulated into {me}")
                    if not prev and k0 % 64:
                        errors.append(f"warp {w} mma {j} lane {lane}: chain starts at k {k0}")
        for lane in range(32):
            r = runs[lane]
            tidx = 32 * w + lane
            for address, src in r.get("shared_st", []):
                if address is None or "%" not in src:
                    continue
                if fused and new_rows <= address < new_rows + 2 * 2 * 256:
                    # warp 7 keeps k in sNew row 0 (read into sK), warp 6 v in row 1 (into sV)
                    if w < 6 or address != new_rows + 2 * ((7 - w) * 256 + 8 * lane):
                        errors.append(f"warp {w} lane {lane}: new K / V row stored at sNew byte {address - new_rows}")
                    continue
                if sm["s"] <= address < sm["alpha"]:  # partial scores: hi + lo rows of one column
                    for q, reg in enumerate(re.findall(r"%\w+", src)):
                        cols = {acc.get(x + (lane,)) for x in r["prov"].get(reg, set())}
                        e = (address - sm["s"]) // 4 + q
                        part, row, tok = e // 256, e // 32 % 8, e % 32
                        if cols != {("Q", row, tok, 48 + 64 * part), ("Q", row + 8, tok, 48 + 64 * part)} \
                                or part != w // 2:
                            errors.append(f"warp {w} lane {lane}: sS[{part}, {row}, {tok}] from {sorted(cols)}")
                elif sm["p"] <= address < sm["s"]:  # P of head wid: hi in row wid, lo in row 8 + wid
                    row, col = divmod((address - sm["p"]) // 2, 40)
                    if w < group and (row % 8, col) != (w, lane):
                        errors.append(f"warp {w} lane {lane}: P stored at sP[{row}, {col}]")
                elif fused and sm["q"] <= address < sm["p"]:  # q hi / lo: row w and 8 + w, dims 8 lane..
                    row, col = divmod((address - sm["q"]) // 2, 264)
                    if row % 8 != w or col != 8 * lane:
                        errors.append(f"thread {tidx}: q stored at sQ[{row}, {col}]")
                elif sm["q"] <= address < sm["p"]:  # q hi / lo: column = thread
                    if (address - sm["q"]) // 2 % 264 != tidx:
                        errors.append(f"thread {tidx}: q stored at sQ column {(address - sm['q']) // 2 % 264}")
            s_reads = sorted(((a - sm["s"]) // 4 for a, _ in r.get("shared_ld", [])
                              if a is not None and sm["s"] <= a < sm["alpha"]))
            if w < group and s_reads != [part * 256 + w * 32 + lane for part in range(4)]:
                errors.append(f"warp {w} lane {lane}: softmax reads sS {s_reads}")
            for address, src in r.get("global_st", []):
                cols = {acc.get(x + (lane,)) for x in r["prov"].get(src, set())}
                if address is None or not cols:
                    continue
                row, dim = divmod(address // 4, PO_STRIDE)
                if cols != {("P", row, dim, 16), ("P", row + 8, dim, 16)}:
                    errors.append(f"warp {w} lane {lane}: part_o[{row}, {dim}] from {sorted(cols)}")
                stored.add((row, dim))
    if stored != {(r, d) for r in range(8) for d in range(256)}:
        errors.append(f"part_o: {len(stored)} of 8 x 256 (row, dim) cells stored")
    return errors


@pytest.fixture(scope="module")
def ptx_of():
    cache: dict[str, str] = {}

    def get(name: str) -> str:
        if name not in cache:
            cache[name] = _compile_ptx(name)
        return cache[name]

    return get


@pytest.mark.parametrize("name", MMA_VARIANTS)
def test_mma_decode_ptx_moves_the_right_data(ptx_of, name):
    v = av.attn_variant(name)
    errors = _check(ptx_of(name), v.config["group"], v.config["stages"])
    assert not errors, f"{len(errors)} errors, first: " + "\n".join(errors[:8])


@pytest.mark.parametrize("name", FUSED_VARIANTS)
def test_fused_decode_ptx_moves_the_right_data(ptx_of, name):
    """AttnDecodeFused runs AttnDecodeMma's block loop on the q it normalised and RoPE'd itself."""
    v = av.attn_variant(name)
    errors = _check(ptx_of(name), v.config["group"], v.config["stages"], fused=True)
    assert not errors, f"{len(errors)} errors, first: " + "\n".join(errors[:8])


@pytest.mark.parametrize("length", [1, 20])
def test_fused_new_row_goes_to_its_stage_row(ptx_of, length):
    """The fused kernel's one-thread-per-dim copy of the new token's k and v from sNew lands on the
    swizzled stage-0 rows of token length - 1 (one split, one block: lens is the kernel's first
    global load, made a constant here; part_lse's split count 1)."""
    ptx = ptx_of("attn_decode_g6_fused")
    m = re.search(r"ld\.global\.b32 \t?(%r\d+), \[%rd\d+\];", ptx)
    stmts = _statements(ptx[:m.start()] + f"mov.b32 {m.group(1)}, {length};" + ptx[m.end():])
    sm = _smem_map(2)
    where = {v: a for a, v in _kv_rows(2).items()}  # (K or V, token, first dim of 8) -> byte address
    wrong = []
    for t in range(256):
        got = {a for a, src in _run(stmts, t, {(11, 16): 1})["shared_st"]
               if a is not None and a < sm["q"] and "{" not in src}  # the zero fill stores {0, 0, 0, 0}
        want = {where[kv, length - 1, t - t % 8] + 2 * (t % 8) for kv in ("K", "V")}
        if got != want:
            wrong.append(f"thread {t}: stores {sorted(got)}, want {sorted(want)}")
    assert not wrong, f"{len(wrong)} threads, first: " + "\n".join(wrong[:4])


def test_fused_appends_k_v_at_the_slot_row_and_writes_q(ptx_of):
    """The fresh CTA's k and v stores go to the K and V rows of slot lens - 1 in page page_table[b, slot //
    64] (lens and every page-table entry made constants in the PTX), and the split-0 q store to
    q[b, G g + w, 8 lane..] (fp32): warps 0 and 1 of CTA (split 0, kv head 1, sequence 2)."""
    ptx = ptx_of("attn_decode_g6_fused")
    length, page, seq, kvh = 100, 7, 2, 1
    loads = list(re.finditer(r"ld\.global\.b32 \t?(%r\d+), \[%rd\d+\];", ptx))  # lens first, then pages
    for m, val in reversed(list(zip(loads, [length] + [page] * (len(loads) - 1)))):
        ptx = ptx[:m.start()] + f"mov.b32 {m.group(1)}, {val};" + ptx[m.end():]
    stmts = _statements(ptx)
    kv, q = 1 << 40, 1 << 44
    # part_lse: S = 1; kv: base, row stride; q: base, shape (3, 24), row stride; page_table: row stride
    params = {(11, 16): 1, (8, 0): kv, (8, 16): 256, (9, 0): q, (9, 8): 3, (9, 12): 24, (9, 16): 24 * 256,
              (7, 16): 50}
    row_k = (page * 2 * 4 + kvh) * 64 + (length - 1) % 64
    wrong = []
    for t in range(64):
        w, lane = divmod(t, 32)
        got = sorted(a for a, _ in _run(stmts, t, params, (0, kvh, seq)).get("global_st", [])
                     if a is not None and a >= 1 << 39)  # part_o's stores sit at address 0 (no params)
        at = q + 4 * ((seq * 24 + 6 * kvh + w) * 256 + 8 * lane)
        want = sorted([at, at + 16, kv + 2 * (row_k * 256 + 8 * lane), kv + 2 * ((row_k + 4 * 64) * 256 + 8 * lane)])
        if got != want:
            wrong.append(f"thread {t}: stores {[hex(a) for a in got]}, want {[hex(a) for a in want]}")
    assert not wrong, f"{len(wrong)} threads, first: " + "\n".join(wrong[:4])


def test_ptx_check_catches_a_misplaced_v_row(ptx_of):
    """The check fails on the bug it was written for: one V ldmatrix 32 dims off (64 bytes)."""
    ptx = ptx_of("attn_decode_g8")
    m = re.search(r"(ldmatrix\.sync\.aligned\.m8n8\.x4\.trans\.shared\.b16 \{[^}]*\}, \[%\w+\+)(\d+)\]", ptx)
    bad = ptx[:m.start()] + m.group(1) + str(int(m.group(2)) + 64) + "]" + ptx[m.end():]
    assert _check(bad, 8, 2)


# --- attn_qk_prep's q load and the combines' gate load: [B, Hq, 256] views with two dynamic strides ------

VIEW_BASE = 1 << 40
ROW_STRIDE, HEAD_STRIDE = 70_001 * 8, 97 * 8  # values; unlike any stride a kernel could assume by itself
COMBINES = [v.name for v in av.COMBINE_VARIANTS]


def _view_load_errors(ptx: str, param: int, threads: int, ctaid: tuple[int, int, int], want, esz: int = 2,
                      values: int = 8) -> list[str]:
    """Each thread's global loads whose address derives from tensor param `param` (the only param
    given values: base, row stride at byte 16, head stride at 24) against want(tidx) (value index): `values`
    values of `esz` bytes (bf16, or fp32 sums), in 16-byte loads."""
    stmts = _statements(ptx)
    params = {(param, 0): VIEW_BASE, (param, 16): ROW_STRIDE, (param, 24): HEAD_STRIDE}
    errors = []
    for t in range(threads):
        got = [a for a in _run(stmts, t, params, ctaid)["global_ld"] if a is not None]
        first = VIEW_BASE + esz * want(t)
        if got != [first + 16 * i for i in range(max(1, values * esz // 16))]:
            errors.append(f"thread {t}: loads {[hex(a - VIEW_BASE) for a in got]}, want {hex(first - VIEW_BASE)}")
    return errors


def test_prep_reads_q_at_its_row_and_head_strides(ptx_of):
    """Warp w of CTA (x, seq) loads dims 8 lane.. of q head 4 x + w from q_proj[seq, head, :]."""
    ptx = ptx_of("attn_qk_prep")
    seq, bx = 2, 1
    want = lambda t: seq * ROW_STRIDE + (4 * bx + t // 32) * HEAD_STRIDE + 8 * (t % 32)  # noqa: E731
    errors = _view_load_errors(ptx, 0, 128, (bx, seq, 0), want)
    assert not errors, f"{len(errors)} errors, first: " + "\n".join(errors[:8])
    swapped = ptx.replace("param_0+24]", "param_0+16]")  # head stride read from the row stride's slot
    assert swapped != ptx and _view_load_errors(swapped, 0, 128, (bx, seq, 0), want)


@pytest.mark.parametrize("name", ["attn_decode_g8_fused", "attn_decode_g8_fused_sums"])
def test_fused_reads_q_at_its_row_and_head_strides(ptx_of, name):
    """Warp w of CTA (split, kv head g, seq) loads dims 8 lane.. of q head G g + w from q_proj[seq, head, :]
    (warps w >= G skip it at run time; the straight-line evaluation computes their address too); `_sums`: fp32."""
    ptx = ptx_of(name)
    group, esz = av.attn_variant(name).config["group"], 4 if name.endswith("_sums") else 2
    split, kvh, seq = 3, 1, 2
    want = lambda t: seq * ROW_STRIDE + (group * kvh + t // 32) * HEAD_STRIDE + 8 * (t % 32)  # noqa: E731
    errors = _view_load_errors(ptx, 0, 64, (split, kvh, seq), want, esz)  # warps 0 and 1: two heads
    assert not errors, f"{len(errors)} errors, first: " + "\n".join(errors[:8])
    swapped = ptx.replace("param_0+24]", "param_0+16]")
    assert swapped != ptx and _view_load_errors(swapped, 0, 64, (split, kvh, seq), want, esz)


@pytest.mark.parametrize("name", COMBINES)
def test_combine_reads_gate_at_its_row_and_head_strides(ptx_of, name):
    """Thread t < 64 of CTA (head, seq) loads dims 4 t.. of gate[seq, head, :] (only the first group of
    64 threads loads the gate, so the code may use t for t % 64: the other threads are not checked)."""
    ptx = ptx_of(name)
    head, seq, esz = 5, 2, 4 if name.endswith("_sums") else 2  # `_sums`: the gate fp32
    want = lambda t: seq * ROW_STRIDE + head * HEAD_STRIDE + 4 * t  # noqa: E731
    errors = _view_load_errors(ptx, 3, 64, (head, seq, 0), want, esz, 4)
    assert not errors, f"{len(errors)} errors, first: " + "\n".join(errors[:8])
    swapped = ptx.replace("param_3+24]", "param_3+16]")
    assert swapped != ptx and _view_load_errors(swapped, 3, 64, (head, seq, 0), want, esz, 4)
