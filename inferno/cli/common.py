"""Helpers shared by the subcommands: the demo model and choosing an executor."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from inferno.bench.prefill_chunk import NO_BUDGET_CHUNK
from inferno.errors import NotBuiltError, UsageError

DEMO_PRESET = "tiny-dense"
DEMO_SEED = 0
DEVICES = ("auto", "cpu", "cuda")

Log = Callable[[str], None]


def cache_dir() -> Path:
    """`$INFERNO_CACHE`, else `~/.cache/inferno`."""
    env = os.environ.get("INFERNO_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "inferno"


def demo_model(log: Log) -> Path:
    """The demo artifact (tiny-dense, random weights), synthesized on first use.

    It is a `.ninfer` file so the same demo runs on the GPU executor and on the reference.
    The synthesizer writes aside and renames, so a concurrent first run never sees half a file.
    """
    from inferno.artifact.synth import synthesize_artifact

    path = cache_dir() / "demo.ninfer"
    if path.is_file():
        return path
    log(f"synthesizing the demo model ({DEMO_PRESET}, seed {DEMO_SEED}) into {path} (once) ...")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        synthesize_artifact(DEMO_PRESET, path, seed=DEMO_SEED, progress=False)
    except OSError as e:
        raise UsageError(f"cannot write the demo model under {path.parent} ({e.strerror}); "
                         "set INFERNO_CACHE to a writable directory") from None
    return path


def check_device(device: str) -> None:
    """Refuse a bad --device before any work: unknown names, and cuda without a visible GPU."""
    if device not in DEVICES:
        raise UsageError(f"--device must be one of {', '.join(DEVICES)}, got {device!r}")
    if device == "cuda":
        from inferno.cuda.device import gpu_count

        if gpu_count() == 0:
            raise UsageError("--device cuda: no NVIDIA GPU is visible; use --device cpu (numpy reference) or auto")


@dataclass
class Loaded:
    """An opened model and the executor that runs it ("gpu" or "reference")."""

    source: object
    executor: object
    kind: str
    prefill_chunk: int = NO_BUDGET_CHUNK  # tokens per prefill call (the engine's chunking)


def load_model(path: Path, device: str, *, max_seqs: int, max_context: int, cuda_graph: bool, log: Log,
               prefill_chunk: int | None = None) -> Loaded:
    """Open `path` and build its executor for `device` (auto | cpu | cuda); `prefill_chunk` None is
    `--prefill-chunk auto` (the chunk used is `Loaded.prefill_chunk`).

    auto takes the GPU executor when a GPU is visible and the model is a `.ninfer` artifact it
    supports, else the numpy reference (saying why); cuda insists on the GPU and says what is wrong.
    """
    from inferno.checkpoint.source import open_model

    check_device(device)
    source = open_model(path)
    max_context = min(max_context, source.config.max_position)
    if device != "cpu":
        reason = _gpu_unusable(path)
        if reason is not None and device == "cuda":
            raise UsageError(f"--device cuda: {reason}")
        if reason is None:
            from inferno.model.gpu import GpuExecutor

            try:
                executor = GpuExecutor(path, max_seqs=max_seqs, max_context=max_context, cuda_graph=cuda_graph,
                                       prefill_chunk=prefill_chunk)
                if prefill_chunk is None:
                    log(f"--prefill-chunk auto: {executor.prefill_chunk} tokens")
                return Loaded(source, executor, "gpu", executor.prefill_chunk)
            except NotBuiltError as e:
                if device == "cuda":
                    raise
                reason = str(e)
        log(f"{reason}; using the numpy reference executor (fp32, slow)")
    from inferno.model.reference import ReferenceExecutor

    return Loaded(source, ReferenceExecutor(source.config, source.weights), "reference",
                  prefill_chunk or NO_BUDGET_CHUNK)


def _gpu_unusable(path: Path) -> str | None:
    """Why the GPU executor cannot run `path` here, or None."""
    from inferno.cuda.device import gpu_count

    if gpu_count() == 0:
        return "no NVIDIA GPU is visible"
    if path.suffix != ".ninfer":
        return f"the GPU executor runs .ninfer artifacts (convert {path} with `inferno convert`)"
    return None
