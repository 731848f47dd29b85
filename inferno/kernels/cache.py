"""Run-time kernel loading from the on-disk cache of cubins + manifests.

The cache root is `$INFERNO_KERNEL_DIR` or `~/.cache/inferno/kernels`; cubins for an arch live
in `<root>/<arch>/` (the same layout `inferno kernels build --out <root>` writes). `load()` checks
the manifest against the current kernel source (source hash) and the cubin (sha256); a missing
or stale kernel is rebuilt when the DSL is importable, otherwise the error names the exact build
command.
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from inferno.errors import InfernoError
from inferno.kernels.manifest import Manifest, ManifestError, source_hash
from inferno.kernels.registry import Variant, get

if TYPE_CHECKING:
    from inferno.cuda.device import Device
    from inferno.cuda.module import Kernel
    from inferno.cuda.params import ParamLayout


class KernelNotBuiltError(InfernoError):
    """A kernel's cubin is missing or stale and cannot be rebuilt here."""

    exit_code = 3


def cache_root() -> Path:
    """Root of the kernel cache: $INFERNO_KERNEL_DIR, else ~/.cache/inferno/kernels."""
    env = os.environ.get("INFERNO_KERNEL_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "inferno" / "kernels"


def kernel_dir(arch: str) -> Path:
    return cache_root() / arch


def stale_reason(v: Variant, arch: str, root: Path | None = None) -> str | None:
    """Why the cached cubin of `v` for `arch` cannot be used (None when it is current)."""
    d = (root or cache_root()) / arch
    cubin, js = d / f"{v.name}.cubin", d / f"{v.name}.json"
    if not cubin.is_file() or not js.is_file():
        return f"not built (no {cubin.name} + {js.name} in {d})"
    try:
        m = Manifest.read(js)
    except ManifestError as e:
        return str(e)
    if m.arch != arch or m.variant != v.name:
        return f"manifest is for {m.variant}/{m.arch}"
    if m.source_hash != source_hash(v.source_file, v.config):
        return f"stale (source {v.source_file.name} or config changed since it was built)"
    if m.abi != v.abi_key():
        return "stale (its registry entry changed since it was built)"
    if hashlib.sha256(cubin.read_bytes()).hexdigest() != m.cubin_sha256:
        return "cubin does not match its manifest"
    return None


@dataclass
class LoadedKernel:
    """A kernel ready to launch: its manifest, driver handle and parameter layout."""

    variant: Variant
    manifest: Manifest
    kernel: "Kernel"
    layout: "ParamLayout"
    sm_count: int = 1  # the device's SMs: the `SMS` symbol of grid rules


def ensure_built(v: Variant, arch: str, root: Path | None = None) -> Path:
    """Make sure root/arch holds a current cubin of `v` (building it if the DSL is here); returns root."""
    root = root or cache_root()
    reason = stale_reason(v, arch, root)
    if reason is None:
        return root
    from inferno.kernels.build import build_variant, dsl_available

    if not dsl_available():
        raise KernelNotBuiltError(
            f"kernel {v.name} for {arch}: {reason}; build it where the CuTe DSL is installed: "
            f"`{v.build_command(arch, str(root))}` (or set INFERNO_KERNEL_DIR to a built kernel dir)")
    print(f"building kernel {v.name} for {arch} ({reason})", file=sys.stderr)
    build_variant(v, arch, root)
    return root


_loaded: dict[tuple[int, str, str], LoadedKernel] = {}
_lock = threading.Lock()


def load(variant: "str | Variant", device: "Device | None" = None, root: Path | None = None) -> LoadedKernel:
    """Load `variant` (a registry name or a Variant) for `device` (default: GPU 0) from the cache
    (default root: cache_root()), rebuilding it if needed."""
    from inferno.cuda.device import Device
    from inferno.cuda.module import Library
    from inferno.cuda.params import ParamLayout, ParamSpec

    v = get(variant) if isinstance(variant, str) else variant
    device = device or Device.open()
    key = (device.ordinal, v.name, str(root))
    with _lock:
        if key in _loaded:
            return _loaded[key]
        arch = device.arch
        if arch not in v.archs:
            raise KernelNotBuiltError(f"kernel {v.name} has no build for {arch} ({device.name}); "
                                      f"it builds for {', '.join(v.archs)}")
        root = ensure_built(v, arch, root)
        d = root / arch
        m = Manifest.read(d / f"{v.name}.json")
        lib = Library.load((d / f"{v.name}.cubin").read_bytes(), f"{arch}/{v.name}", device, arch)
        k = lib.kernel(m.entry)
        k.pdl = v.pdl
        if m.smem > 48 * 1024:
            k.set_max_dynamic_smem(m.smem)
        specs = [ParamSpec(p.name, p.kind, p.size, p.align, len(p.dyn_shape) if p.kind == "tensor" else 0,
                           len(p.dyn_stride)) for p in m.params]
        loaded = LoadedKernel(v, m, k, ParamLayout(specs, v.name), device.sm_count)
        _loaded[key] = loaded
        return loaded
