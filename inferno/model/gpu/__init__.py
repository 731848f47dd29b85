"""The GPU executor: residency plan, weight upload, device state, decode launch sequence, CUDA graphs."""

from inferno.model.gpu.executor import GpuExecutor

__all__ = ["GpuExecutor"]
