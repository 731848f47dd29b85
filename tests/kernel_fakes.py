"""CPU stand-ins for testing kernel launchers: a recorder in place of `launch`, and a LoadedKernel
built from a variant's manifest without a driver handle."""

from inferno.cuda.params import ParamLayout, ParamSpec
from inferno.kernels.cache import LoadedKernel


class LaunchRecorder:
    """Records (grid, block, params, smem) and the cluster of every launch it replaces."""

    def __init__(self):
        self.calls = []
        self.clusters = []

    def __call__(self, kernel, grid, block, params, smem, stream, cluster=None):
        self.calls.append((tuple(grid), tuple(block), params, smem))
        self.clusters.append(cluster)


def fake_loaded(variant, manifest, sm_count: int = 132) -> LoadedKernel:
    """`variant` as if loaded: its manifest and parameter layout, no kernel handle."""
    specs = [ParamSpec(p.name, p.kind, p.size, p.align, len(p.dyn_shape) if p.kind == "tensor" else 0,
                       len(p.dyn_stride)) for p in manifest.params]
    return LoadedKernel(variant, manifest, None, ParamLayout(specs, variant.name), sm_count)
