"""GPU kernels: registry, cubin build + manifests, run-time cache, typed launchers.

`load(variant, device)` returns a loaded kernel from the cache (see cache.py); typed launchers
live in `inferno.kernels.launchers`. Importing this package needs neither a GPU nor the DSL.
"""

from inferno.kernels.cache import KernelNotBuiltError, LoadedKernel, cache_root, load
from inferno.kernels.registry import Variant, get, variant_for, variants

__all__ = ["KernelNotBuiltError", "LoadedKernel", "Variant", "cache_root", "get", "load",
           "variant_for", "variants"]
