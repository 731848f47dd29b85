"""Kernel manifests: what a launcher needs to know about a cubin, as JSON beside it.

A manifest records the entry name, each kernel parameter (kind, byte size, alignment, offset,
and for tensors the names of their dynamic shape/stride modes), the block size (the PTX
`.reqntid`), dynamic shared memory and cluster shape, the grid rule, the kernel config, the
source hash (kernel source file + config), the compiler version and the arch.

Also here: reading the parameter list and `.reqntid` from PTX, the launch constants from the
DSL's host IR, the source hash, and the grid-rule evaluator. Nothing here needs the DSL.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import operator
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from inferno.errors import InfernoError

SCHEMA = 1


class ManifestError(InfernoError):
    """A manifest that is missing, malformed, or disagrees with its cubin or source."""


@dataclass
class ParamEntry:
    name: str
    kind: str  # tensor | f32 | i32 | tma | bytes
    size: int
    align: int
    offset: int
    dtype: str = ""
    dyn_shape: list[str] = field(default_factory=list)
    dyn_stride: list[str] = field(default_factory=list)
    of: str = ""  # tma / shape params: the host tensor they describe
    tma: dict = field(default_factory=dict)  # box (innermost first), swizzle bytes, dtype


@dataclass
class Manifest:
    variant: str
    op: str
    arch: str
    entry: str
    params: list[ParamEntry]
    block: list[int]
    smem: int
    cluster: list[int]
    grid: list[str]
    config: dict
    divisibility: dict
    source: str
    source_hash: str
    compiler: str
    cubin_sha256: str
    abi: str = ""  # Variant.abi_key() at build time: args, params, grid rule, divisibility
    schema: int = SCHEMA

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, where: str) -> "Manifest":
        try:
            d = json.loads(text)
            if d.get("schema") != SCHEMA:
                raise ManifestError(f"{where}: manifest schema {d.get('schema')} is not {SCHEMA}; rebuild it")
            d["params"] = [ParamEntry(**p) for p in d["params"]]
            return cls(**d)
        except ManifestError:
            raise
        except (ValueError, TypeError, KeyError) as e:
            raise ManifestError(f"{where}: malformed manifest ({e}); rebuild it") from None

    @classmethod
    def read(cls, path: Path) -> "Manifest":
        try:
            text = path.read_text()
        except OSError as e:
            raise ManifestError(f"cannot read manifest {path}: {e.strerror}") from None
        return cls.from_json(text, str(path))


def kernel_sources(source_file: Path) -> list[Path]:
    """The kernel source file and the sibling modules it imports, transitively (`from <package>.x import`,
    `import <package>.x`, `from . import x`): a change to a base class in another file is a change too."""
    pkg = source_file.parent.name
    seen: dict[Path, None] = {}
    todo = [source_file]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen[path] = None
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.ImportFrom):
                mod = node.module or ""
                if node.level == 1 or mod == pkg:
                    names = [mod] if mod and mod != pkg else [a.name for a in node.names]
                elif mod.startswith(pkg + "."):
                    names = [mod[len(pkg) + 1:]]
            elif isinstance(node, ast.Import):
                names = [a.name[len(pkg) + 1:] for a in node.names if a.name.startswith(pkg + ".")]
            for name in names:
                dep = source_file.parent / f"{name.split('.')[0]}.py"
                if dep.is_file():
                    todo.append(dep)
    return sorted(seen, key=lambda q: (q != source_file, q.name))


def source_hash(source_file: Path, config: dict, extra: str = "") -> str:
    """sha256 over the kernel source and the sibling modules it imports (`kernel_sources`), its static
    config and the manifest schema."""
    h = hashlib.sha256()
    for path in kernel_sources(source_file):
        h.update(path.read_bytes())
    h.update(json.dumps(config, sort_keys=True).encode())
    h.update(f"schema={SCHEMA};{extra}".encode())
    return h.hexdigest()


# --- PTX -------------------------------------------------------------------------------------

_ENTRY_RE = re.compile(r"\.entry\s+(\S+)\s*\((.*?)\)\s*((?:\.\w+[^{]*?)*)\{", re.S)
_PARAM_RE = re.compile(r"\.param\s+(?:\.align\s+(\d+)\s+)?\.(\w+)\s+\S+?(?:\[(\d+)\])?\s*$")
_SCALAR_BYTES = {"b8": 1, "u8": 1, "s8": 1, "b16": 2, "u16": 2, "s16": 2, "f16": 2,
                 "b32": 4, "u32": 4, "s32": 4, "f32": 4, "b64": 8, "u64": 8, "s64": 8, "f64": 8}


@dataclass(frozen=True)
class PtxEntry:
    name: str
    params: list[tuple[int, int]]  # (size, align) per parameter
    reqntid: tuple[int, int, int] | None


def ptx_entries(ptx: str) -> list[PtxEntry]:
    """Every `.entry` in PTX text with its parameter sizes/alignments and `.reqntid`."""
    out = []
    for m in _ENTRY_RE.finditer(ptx):
        params = []
        for line in m.group(2).split(","):
            line = line.strip()
            if not line:
                continue
            p = _PARAM_RE.search(line)
            if p is None:
                raise ManifestError(f"unparsed PTX parameter {line!r} in {m.group(1)}")
            elem = _SCALAR_BYTES[p.group(2)]
            count = int(p.group(3)) if p.group(3) else 1
            params.append((elem * count, int(p.group(1)) if p.group(1) else elem))
        req = re.search(r"\.reqntid\s+(\d+)(?:\s*,\s*(\d+))?(?:\s*,\s*(\d+))?", m.group(3))
        reqntid = tuple(int(x) if x else 1 for x in req.groups()) if req else None
        out.append(PtxEntry(m.group(1), params, reqntid))
    return out


# --- DSL host IR -----------------------------------------------------------------------------

# The DSL fills a cudaLaunchConfig_t {grid[3], block[3], size_t smem, stream, attrs, nattrs}.
_CFG_T = r"!llvm\.struct<\(array<3 x i32>, array<3 x i32>, i64, ptr, ptr, i32\)>"


def ir_launch(ir: str) -> dict:
    """Block and dynamic smem constants of the single launch in the DSL's host LLVM IR."""
    consts = dict(re.findall(r"(%\w+) = llvm\.mlir\.constant\((-?\d+) : i(?:32|64)\)", ir))
    geps = {m.group(1): tuple(int(x) for x in m.group(3).split(","))
            for m in re.finditer(r"(%\w+) = llvm\.getelementptr (%\w+)\[0, ([\d, ]+)\] : \(!llvm\.ptr\) "
                                 r"-> !llvm\.ptr, " + _CFG_T, ir)}
    found: dict[tuple[int, ...], int] = {}
    for val, ptr in re.findall(r"llvm\.store (%\w+), (%\w+) : i(?:32|64), !llvm\.ptr", ir):
        if ptr in geps and val in consts:
            found[geps[ptr]] = int(consts[val])
    if (2,) not in found:
        raise ManifestError("could not find the launch's dynamic shared memory in the DSL host IR")
    block = [found.get((1, i)) for i in range(3)]
    return {"smem": found[(2,)], "block": block}


# --- grid rules ------------------------------------------------------------------------------

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.FloorDiv: operator.floordiv}
_FUNCS = {"cdiv": lambda a, b: -(-a // b), "min": min, "max": max}


def _check_node(node: ast.AST, rule) -> None:
    """Refuse anything but ints, names, + - * // and cdiv/min/max calls."""
    if isinstance(node, ast.Expression):
        return _check_node(node.body, rule)
    if isinstance(node, ast.Constant) and type(node.value) is int or isinstance(node, ast.Name):
        return None
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        _check_node(node.left, rule)
        return _check_node(node.right, rule)
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCS
            and not node.keywords):
        for a in node.args:
            _check_node(a, rule)
        return None
    raise ManifestError(f"grid rule {rule}: unsupported expression {ast.dump(node)}")


@functools.lru_cache(maxsize=256)
def compile_grid(rule: tuple[str, ...]):
    """A checked grid rule compiled once: call it with the symbol values."""
    if len(rule) != 3:
        raise ManifestError(f"grid rule {list(rule)} must have three expressions")
    for r in rule:
        try:
            tree = ast.parse(r, mode="eval")
        except SyntaxError:
            raise ManifestError(f"grid rule {list(rule)} is not a valid expression") from None
        _check_node(tree, list(rule))
    code = compile(f"({rule[0]}, {rule[1]}, {rule[2]})", "<grid rule>", "eval")

    def grid(values: dict[str, int]) -> tuple[int, int, int]:
        env = {"__builtins__": {}, **_FUNCS, **values}
        try:
            return eval(code, env)  # noqa: S307 - every node was checked above
        except NameError as e:
            raise ManifestError(f"grid rule {list(rule)} needs {e.name!r}, not given") from None

    return grid


def eval_grid(rule: list[str] | tuple[str, ...], values: dict[str, int]) -> tuple[int, int, int]:
    """Evaluate a grid rule: three integer expressions over the symbols (+ - * //, cdiv/min/max)."""
    return compile_grid(tuple(rule))(values)


def grid_symbols(rule: list[str] | tuple[str, ...]) -> set[str]:
    """Names a grid rule reads."""
    names: set[str] = set()
    for r in rule:
        names |= {n.id for n in ast.walk(ast.parse(r, mode="eval")) if isinstance(n, ast.Name)}
    return names - set(_FUNCS)
