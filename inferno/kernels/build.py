"""Compile kernel variants to cubins + manifests with the CuTe DSL (no GPU needed).

`build_variant(variant, arch, out_dir)` writes `out_dir/<arch>/<variant>.cubin` and
`<variant>.json`. The parameter layout is read from the PTX `.entry` and checked against the
layout the registry declares; the block size is the PTX `.reqntid`; the dynamic shared memory
comes from the DSL's host IR. The DSL is imported only here.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import re
import sys
import tempfile
import time
from pathlib import Path

from inferno.errors import InfernoError
from inferno.kernels.manifest import (
    Manifest,
    ManifestError,
    ParamEntry,
    ir_launch,
    ptx_entries,
    source_hash,
)
from inferno.kernels.registry import Tensor, Variant

TENSOR_BYTES = {"bf16": 2, "f32": 4, "i32": 4}


class KernelBuildError(InfernoError):
    """A kernel could not be compiled (no DSL, or the DSL refused the kernel)."""


def dsl_available() -> bool:
    """True when the CuTe DSL can be imported here."""
    try:
        import cutlass.cute  # noqa: F401
    except Exception:
        return False
    return True


def compiler_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"nvidia-cutlass-dsl {version('nvidia-cutlass-dsl')}"
    except PackageNotFoundError:
        return "nvidia-cutlass-dsl unknown"


def _import_dsl():
    try:
        import cuda.bindings.driver as cuda
        import cutlass
        import cutlass.cute as cute
        from cutlass.cute.runtime import make_fake_tensor
    except Exception as e:
        raise KernelBuildError(
            f"the CuTe DSL is not importable ({type(e).__name__}: {e}); "
            "install it with `pip install -e '.[kernels]'`"
        ) from None
    return cutlass, cute, cuda, make_fake_tensor


def tensor_param_size(t: Tensor) -> int:
    """Bytes of a tensor kernel parameter: {u64 ptr; i32 per dynamic shape; i64 per dynamic stride}."""
    size = 8 + 4 * len(t.dyn_shape)
    if t.dyn_stride:
        size += -size % 8 + 8 * len(t.dyn_stride)
    return size + (-size % 8)


def _expected_params(v: Variant, tma_boxes: dict) -> list[ParamEntry]:
    """The kernel parameter list the registry declares (offsets filled in later)."""
    out: list[ParamEntry] = []
    if v.params is None:
        for a in v.args:
            if a is None:
                continue
            if isinstance(a, Tensor):
                out.append(ParamEntry(a.name, "tensor", tensor_param_size(a), 8, 0, a.dtype,
                                      list(a.dyn_shape), list(a.dyn_stride)))
            else:
                out.append(ParamEntry(a.name, a.dtype, 4, 4, 0, a.dtype))
        return out
    tensors = {a.name: a for a in v.args if isinstance(a, Tensor)}
    for p in v.params:
        if p.kind == "tma":
            if p.of not in tma_boxes:
                raise KernelBuildError(f"{v.name}: kernel did not record a TMA box for {p.of!r}")
            box, swizzle = tma_boxes[p.of]
            out.append(ParamEntry(p.name, "tma", 128, 64, 0, tensors[p.of].dtype, of=p.of,
                                  tma={"box": list(box), "swizzle": _swizzle_bytes(swizzle)}))
        elif p.kind == "shape":
            out.append(ParamEntry(p.name, "bytes", p.size, p.align, 0, "i32",
                                  dyn_shape=list(tensors[p.of].dyn_shape), of=p.of))
        elif p.kind == "bytes":
            out.append(ParamEntry(p.name, "bytes", p.size, p.align, 0))
        else:
            raise KernelBuildError(f"{v.name}: unknown param kind {p.kind!r}")
    return out


def _swizzle_bytes(s: str) -> int:
    """CuTe swizzle S<B,4,3> over 16-byte units -> the TMA swizzle span in bytes (0 = none)."""
    m = re.fullmatch(r"S<(\d+),(\d+),(\d+)>", s.replace(" ", ""))
    if m is None:
        raise KernelBuildError(f"unexpected smem swizzle {s!r}")
    b, base = int(m.group(1)), int(m.group(2))
    if b == 0:
        return 0
    if base != 4:
        raise KernelBuildError(f"smem swizzle {s} does not map onto a TMA swizzle mode")
    return 16 << b


def _fake_args(v: Variant, cutlass, cute, cuda, make_fake_tensor) -> list:
    dtypes = {"bf16": cutlass.BFloat16, "f32": cutlass.Float32, "i32": cutlass.Int32}
    shape_syms: dict[str, object] = {}
    stride_syms: dict[str, object] = {}

    def sym(name: str, stride: bool):
        table, other = (stride_syms, shape_syms) if stride else (shape_syms, stride_syms)
        if name in other:
            raise KernelBuildError(f"{v.name}: symbol {name!r} is used as both a shape and a stride")
        if name not in table:
            div = v.divisibility.get(name, 1)
            table[name] = cute.sym_int64(divisibility=div) if stride else cute.sym_int32(divisibility=div)
        return table[name]

    args: list = []
    for a in v.args:
        if a is None:
            args.append(None)
        elif isinstance(a, Tensor):
            shape = tuple(sym(s, False) if isinstance(s, str) else s for s in a.shape)
            stride = tuple(sym(s, True) if isinstance(s, str) else s for s in a.stride)
            args.append(make_fake_tensor(dtypes[a.dtype], shape, stride, assumed_align=a.align))
        else:
            args.append(dtypes[a.dtype](0))
    args.append(cuda.CUstream(0))
    return args


def build_variant(v: Variant, arch: str, out_dir: Path) -> Manifest:
    """Compile one variant for `arch`; write its cubin and manifest under out_dir/arch."""
    if arch not in v.archs:
        raise KernelBuildError(f"kernel {v.name} does not build for {arch} (it builds for {', '.join(v.archs)})")
    cutlass, cute, cuda, make_fake_tensor = _import_dsl()
    mod = importlib.import_module(v.source)
    kernel = getattr(mod, v.cls)(**v.config)
    args = _fake_args(v, cutlass, cute, cuda, make_fake_tensor)
    with tempfile.TemporaryDirectory(prefix="inferno-kbuild-") as tmp:
        try:
            compiled = cute.compile(kernel, *args,
                                    options=f"--gpu-arch {arch} --keep-cubin --keep-ptx --dump-dir {tmp}")
        except Exception as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise KernelBuildError(f"compiling {v.name} for {arch} failed: {first}") from e
        cubin, ptx, ir = compiled.__cubin__, compiled.__ptx__, str(compiled.ir_module)
    if not isinstance(cubin, bytes) or not isinstance(ptx, str):
        raise KernelBuildError(f"compiling {v.name} for {arch}: the DSL returned no cubin/PTX")
    names = list(compiled.kernel_info)
    entries = [e for e in ptx_entries(ptx) if e.name in names] if names else ptx_entries(ptx)
    if len(entries) != 1:
        raise KernelBuildError(f"{v.name}: expected one kernel entry, the PTX has {len(entries)}")
    entry = entries[0]

    params = _expected_params(v, getattr(kernel, "tma_boxes", {}))
    got = [(p.size, p.align) for p in params]
    if got != entry.params:
        raise ManifestError(f"{v.name} ({arch}): registry declares params (size, align) {got}, "
                            f"the compiled kernel has {entry.params}; fix the registry entry")
    off = 0
    for p in params:
        off += -off % p.align
        p.offset = off
        off += p.size

    launch = ir_launch(ir)
    block = list(entry.reqntid) if entry.reqntid else None
    if block is None or any(b is not None and b != block[i] for i, b in enumerate(launch["block"])):
        raise ManifestError(f"{v.name} ({arch}): block size unknown or inconsistent "
                            f"(.reqntid {entry.reqntid}, host launch {launch['block']})")
    manifest = Manifest(
        variant=v.name, op=v.op, arch=arch, entry=entry.name, params=params, block=block,
        smem=launch["smem"], cluster=[1, 1, 1], grid=list(v.grid), config=dict(v.config),
        divisibility=dict(v.divisibility), source=v.source,
        source_hash=source_hash(v.source_file, v.config), compiler=compiler_version(),
        cubin_sha256=hashlib.sha256(cubin).hexdigest(), abi=v.abi_key(),
    )
    dest = out_dir / arch
    dest.mkdir(parents=True, exist_ok=True)
    # Cubin first, manifest last, each replaced atomically: a reader sees an old or a new pair
    # (a cubin newer than its manifest reads as stale, never as current).
    _write_atomic(dest / f"{v.name}.cubin", cubin)
    _write_atomic(dest / f"{v.name}.json", manifest.to_json().encode())
    return manifest


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def build_all(variants: list[Variant], archs: list[str], out_dir: Path, progress=sys.stderr,
              jobs: int = 1) -> list[Manifest]:
    """Build every (variant, arch) pair the variant supports, `jobs` compiler processes at once; progress
    lines go to `progress`."""
    return build_pairs([(v, a) for a in archs for v in variants if a in v.archs], out_dir, progress, jobs)


def build_pairs(pairs: list[tuple[Variant, str]], out_dir: Path, progress=sys.stderr,
                jobs: int = 1) -> list[Manifest]:
    """Build each (variant, arch) of `pairs` into out_dir, in `jobs` processes (each imports the DSL once:
    worth it past a few builds); the manifests in the order of `pairs`."""
    done: list = [None] * len(pairs)
    if jobs <= 1 or len(pairs) < 2:
        for i, (v, a) in enumerate(pairs):
            done[i] = _timed_build(v, a, out_dir)
            _report(progress, v, a, *done[i])
        return [m for m, _ in done]
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from multiprocessing import get_context

    # spawned, not forked: the parent may hold the DSL's compiler state, which a fork does not carry over
    pool = ProcessPoolExecutor(min(jobs, len(pairs)), mp_context=get_context("spawn"))
    try:
        futures = {pool.submit(_timed_build, v, a, out_dir): i for i, (v, a) in enumerate(pairs)}
        for f in as_completed(futures):
            i = futures[f]
            done[i] = f.result()
            _report(progress, *pairs[i], *done[i])
    finally:  # a failed build ends the whole build at once: the queued ones are dropped
        pool.shutdown(cancel_futures=True)
    return [m for m, _ in done]


def _timed_build(v: Variant, arch: str, out_dir: Path) -> tuple[Manifest, float]:
    t = time.perf_counter()
    return build_variant(v, arch, out_dir), time.perf_counter() - t


def _report(progress, v: Variant, arch: str, m: Manifest, seconds: float) -> None:
    if progress is not None:
        print(f"built {arch}/{v.name}.cubin  block {m.block[0]}  smem {m.smem}  {len(m.params)} params  "
              f"{seconds:.2f}s", file=progress)
