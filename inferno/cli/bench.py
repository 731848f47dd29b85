"""`inferno bench`: prefill and decode speed of an artifact, each against a limit measured in the same run.

Runs through the engine's generation loop (greedy, ignore_eos) on the GPU executor (`--device
cuda`) or the numpy reference executor (`--device cpu`; small default sizes). Prints a short table
and a docs/performance.md row to stdout (stderr when the JSON goes to stdout), progress to stderr,
and writes the full JSON report with `--json OUT`. On the GPU it also measures host overhead per
graph-replayed decode step (device events around every step of one more request), and
`--prefill-chunk auto` (the default) takes the largest chunk of 1024..8192 tokens that fits. With
no TARGET it benchmarks the demo model (the tiny-dense synthetic preset as a `.ninfer`, random
weights, synthesized once into the cache).
"""

from __future__ import annotations

import importlib
import os
import platform
import sys
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

import typer

from inferno.artifact import open_checked
from inferno.bench.accounting import StateDtypes, account
from inferno.bench.clocks import ClockSampler, open_sampler
from inferno.bench.limits import Limits, cpu_limits, measure_gpu_limits
from inferno.bench.prefill_chunk import NO_BUDGET_CHUNK, gpu_prefill_chunk, parse_prefill_chunk
from inferno.bench.profile import StepTimer
from inferno.bench.report import build_report, markdown_row, text_table, write_json
from inferno.bench.runner import BenchSettings, run_bench
from inferno.cli.common import DEVICES, demo_model
from inferno.errors import NotBuiltError, UsageError

# (prompt tokens, decode tokens, reps) when not given: the sizes on the GPU, small ones on the CPU.
DEFAULTS = {"cuda": (7680, 256, 5), "cpu": (64, 16, 3)}


def _log(msg: str) -> None:
    print(f"inferno bench: {msg}", file=sys.stderr, flush=True)


def parse_contexts(text: str | None) -> tuple[int, ...]:
    """'7680,65536' -> (7680, 65536); '' or None -> ()."""
    if not text:
        return ()
    out = []
    for part in text.split(","):
        part = part.strip().replace("_", "")
        if not (part.isascii() and part.isdigit()) or int(part) < 1:
            raise UsageError(f"--contexts takes comma-separated positive token counts, e.g. 7680,65536; got {text!r}")
        out.append(int(part))
    return tuple(out)


def _artifact_path(target: str | None) -> Path:
    if target is None:
        _log("no artifact given: benchmarking the demo model (tiny, RANDOM weights)")
        return demo_model(_log)
    path = Path(target)
    if path.is_dir():
        raise UsageError(f"{target} is a checkpoint directory; inferno bench takes a .ninfer artifact: "
                         f"convert it first with `inferno convert {target} OUT.ninfer`")
    if not path.is_file():
        raise UsageError(f"no such artifact: {target}")
    return path


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"


def _resolve_device(device: str) -> str:
    """cpu | cuda. cuda needs the GPU executor (else NotBuiltError, exit 3) and a visible GPU."""
    if device == "cpu":
        return device
    from inferno.cuda.device import gpu_count

    try:
        importlib.import_module("inferno.model.gpu")
    except ImportError as e:
        if device == "cuda":
            raise NotBuiltError(f"the GPU executor is not available ({e}); use --device cpu") from None
        _log("--device auto: the GPU executor is not available; using the numpy reference executor")
        return "cpu"
    if gpu_count() == 0:
        if device == "cuda":
            raise UsageError("no CUDA GPU is visible on this machine; use --device cpu")
        return "cpu"
    return "cuda"


@dataclass
class _Loaded:
    executor: object
    limits: Limits
    states: StateDtypes
    device: dict
    settings: BenchSettings
    skipped: list[dict]
    step_timer: StepTimer | None = None
    clocks: ClockSampler | None = None


def _load_cpu(path: Path, settings: BenchSettings) -> _Loaded:
    from inferno.artifact import model_source
    from inferno.model.reference import ReferenceExecutor

    _log(f"loading {path} on the numpy reference executor (fp32) ...")
    source = model_source(path)
    executor = ReferenceExecutor(source.config, source.weights)
    dev = {"kind": "cpu", "name": _cpu_name(), "arch": platform.machine(), "executor": "reference", "cuda_graph": None}
    return _Loaded(executor, cpu_limits(), StateDtypes("fp32", "fp32", "fp32"), dev, settings, [])


def _auto_chunk(model: tuple, max_context: int) -> int:
    """`--prefill-chunk auto` on the GPU: the largest chunk whose plan fits the free device memory."""
    from inferno.cuda import Device

    config, expected, fusion = model
    chunk = gpu_prefill_chunk(config, expected, fusion, 1, max_context, Device.open(0).free_mem())
    _log(f"--prefill-chunk auto: {chunk} tokens")
    return chunk


def _load_cuda(path: Path, settings: BenchSettings, cuda_graph: bool, model: tuple | None) -> _Loaded:
    """The GPU executor sized for the longest case that fits (longer contexts are skipped), then
    the same-run limits. `model` = (config, inventory, fusion plan) when the prefill chunk is
    `auto` (chosen per size tried), None when it was given. NotBuiltError when it cannot run this model."""
    from inferno.cuda.errors import OutOfMemoryError
    from inferno.model.gpu import GpuExecutor
    from inferno.model.gpu.profile import step_spans

    skipped = []
    _log(f"loading {path} on the GPU ...")
    while True:
        try:
            if model is not None:
                settings = replace(settings, prefill_chunk=_auto_chunk(model, settings.max_tokens))
            executor = GpuExecutor(path, max_seqs=1, max_context=settings.max_tokens, cuda_graph=cuda_graph,
                                   prefill_chunk=settings.prefill_chunk)
            break
        except OutOfMemoryError as e:
            longest = max(settings.cases)
            if longest == settings.prompt_tokens:
                raise
            _log(f"context {longest} does not fit on the GPU; skipping it")
            skipped.append({"prompt_tokens": longest, "reason": f"does not fit on the GPU: {e}"})
            settings = replace(settings, contexts=tuple(c for c in settings.contexts if c != longest))
    try:
        gpu = executor.device
        if gpu is None:
            raise NotBuiltError("the GPU executor did not open a CUDA device; use --device cpu")
        limits = measure_gpu_limits(gpu, _log)
    except BaseException:
        executor.close()
        raise
    gemm = "n/a" if limits.gemm_tflops is None else format(limits.gemm_tflops, ",.0f")
    _log(f"limits: copy {limits.copy_gbps:,.0f} GB/s, GEMM {gemm} TFLOP/s")
    states = getattr(executor, "state_dtypes", StateDtypes("bf16", "bf16", "fp32"))
    from inferno.model.gpu.residency import merge_mode, tiling_mode

    dev = {"kind": "cuda", "name": gpu.name, "arch": gpu.arch, "executor": "gpu",
           "cuda_graph": getattr(executor, "cuda_graph", None), "tiling": tiling_mode(),
           "pdl": os.environ.get("INFERNO_PDL", "1") != "0", "branches": os.environ.get("INFERNO_BRANCHES", "1") != "0",
           "fold_norm": os.environ.get("INFERNO_FOLD_NORM", "1") != "0", "merge_proj": merge_mode()}
    clocks, why = open_sampler(gpu.pci_bus_id)
    if clocks is None:
        dev["clocks_unavailable"] = why
    else:
        try:
            dev["gpu"] = clocks.identity()
        except RuntimeError as e:
            dev["clocks_unavailable"] = str(e)
            clocks.close()
            clocks = None
    return _Loaded(executor, limits, states, dev, settings, skipped, step_spans, clocks)


def _fit_positions(settings: BenchSettings, max_position: int) -> tuple[BenchSettings, list[dict]]:
    """Drop contexts longer than the model's positions (the prompt length itself must fit); a context
    that fits but leaves no room for the decode tokens (262,144 on a 262,144-position model) runs with
    the prompt shortened so that decoding ends at that context."""
    d = settings.decode_tokens
    if settings.prompt_tokens + d > max_position:
        raise UsageError(f"--prompt-tokens {settings.prompt_tokens} + --decode-tokens {d} exceeds the model's "
                         f"{max_position} positions")
    too_long = [c for c in settings.contexts if c > max_position or max_position - d < 1]
    skipped = [{"prompt_tokens": c, "reason": f"exceeds the model's {max_position} positions"} for c in too_long]
    kept = []
    for c in settings.contexts:
        if c in too_long:
            continue
        if c + d > max_position:
            _log(f"--contexts {c}: prompt {c - d} tokens, so that {d} decode tokens end at context {c} "
                 f"(the model's {max_position} positions)")
            c -= d
        kept.append(c)
    return replace(settings, contexts=tuple(kept)), skipped


def _given(value: int | None, default: int) -> int:
    return default if value is None else value


AB_SWITCHES = ("INFERNO_TILED", "INFERNO_PDL", "INFERNO_BRANCHES", "INFERNO_FOLD_NORM", "INFERNO_MERGE_PROJ")  # environment A/B switches the command records


def _command(target, device, s, json_out, kernel_table, no_cuda_graph) -> str:
    env = [f"{k}={os.environ[k]}" for k in AB_SWITCHES if os.environ.get(k)]
    parts = env + ["inferno bench"] + ([target] if target else []) + [
        f"--device {device}", f"--prompt-tokens {s.prompt_tokens}", f"--decode-tokens {s.decode_tokens}"]
    if s.contexts:
        parts.append("--contexts " + ",".join(map(str, s.contexts)))
    parts += [f"--reps {s.reps}", f"--warmup {s.warmup}", f"--prefill-chunk {s.prefill_chunk}"]
    if kernel_table:
        parts.append("--kernel-table")
    if no_cuda_graph:
        parts.append("--no-cuda-graph")
    if json_out:
        parts.append(f"--json {json_out}")
    return " ".join(parts)


def bench(
    target: Optional[str] = typer.Argument(None, help=".ninfer artifact (none: the random-weight demo model)"),
    device: str = typer.Option("auto", "--device", help="auto | cpu | cuda"),
    prompt_tokens: Optional[int] = typer.Option(None, "--prompt-tokens", help="prefill length (default: cuda 7680, cpu 64)"),
    decode_tokens: Optional[int] = typer.Option(None, "--decode-tokens", help="tokens generated (default: cuda 256, cpu 16)"),
    contexts: Optional[str] = typer.Option(None, "--contexts", help="more prompt lengths, e.g. 65536,262144 (one at the model's positions runs with the prompt shortened by the decode tokens; longer ones, or ones that do not fit the GPU, are skipped)"),
    reps: Optional[int] = typer.Option(None, "--reps", help="timed repetitions per case (default: cuda 5, cpu 3)"),
    warmup: int = typer.Option(1, "--warmup", help="untimed repetitions first"),
    prefill_chunk: str = typer.Option(
        "auto", "--prefill-chunk",
        help="prompt tokens per prefill call: auto (GPU: the largest of 1024..8192 that fits; CPU: 1024) or N"),
    json_out: Optional[str] = typer.Option(None, "--json", help="write the JSON report here ('-': stdout)"),
    kernel_table: bool = typer.Option(False, "--kernel-table", help="per-kernel times of one decode step and one prefill chunk"),
    no_cuda_graph: bool = typer.Option(False, "--no-cuda-graph", help="GPU executor: eager decode launches"),
) -> None:
    """Measure prefill and decode speed against the same run's copy-bandwidth and GEMM limits.

    GPU A/B switches (environment): INFERNO_TILED=head|all (groupwise-int matrices in tile16-v1 for
    the tensor-core GEMV: the output head only, or every decode matrix), INFERNO_PDL=0,
    INFERNO_BRANCHES=0, INFERNO_FOLD_NORM=0 (a separate RMSNorm launch before the GEMVs that read it),
    INFERNO_MERGE_PROJ=0 (a layer's input projections as two GEMVs).
    """
    if device not in DEVICES:
        raise UsageError(f"--device must be one of {', '.join(DEVICES)}, got {device!r}")
    extra = parse_contexts(contexts)
    chunk = parse_prefill_chunk(prefill_chunk)
    BenchSettings(_given(prompt_tokens, 1), _given(decode_tokens, 2), extra, _given(reps, 1), warmup,
                  chunk or NO_BUDGET_CHUNK)  # flag ranges, before anything is loaded
    if json_out not in (None, "-") and not Path(json_out).parent.is_dir():
        raise UsageError(f"--json {json_out}: folder {Path(json_out).parent} does not exist")

    path = _artifact_path(target)
    explicit_device = device
    device = _resolve_device(device)
    if explicit_device == "auto":
        _log(f"--device auto: {device}")
    artifact, spec, config, expected = open_checked(path)
    artifact.close()

    def settings_for(dev: str) -> tuple[BenchSettings, list[dict]]:
        p, d, r = DEFAULTS[dev]
        s = BenchSettings(_given(prompt_tokens, p), _given(decode_tokens, d), extra, _given(reps, r), warmup,
                          chunk or NO_BUDGET_CHUNK, kernel_table=kernel_table)
        return _fit_positions(s, config.max_position)

    settings, skipped = settings_for(device)
    if device == "cuda":
        try:
            loaded = _load_cuda(path, settings, not no_cuda_graph,
                                (config, expected, spec.plan) if chunk is None else None)
        except NotBuiltError as e:
            if explicit_device == "cuda":
                raise
            _log(f"--device auto: {e}; using the numpy reference executor")
            device = "cpu"
            settings, skipped = settings_for(device)
    if device == "cpu":
        loaded = _load_cpu(path, settings)
    try:
        acct = account(config, expected, loaded.states)
        result = run_bench(loaded.executor, acct, loaded.limits, loaded.settings, _log, loaded.step_timer,
                           loaded.clocks)
    finally:
        if loaded.clocks is not None:
            loaded.clocks.close()
        close = getattr(loaded.executor, "close", None)
        if close is not None:
            close()
    settings = loaded.settings
    report = build_report(
        date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        command=_command(target, device, settings, json_out, kernel_table, no_cuda_graph),
        device=loaded.device,
        model={"path": str(path), "identity": spec.name, "layers": config.n_layers,
               "attention_layers": len(config.attention_layers), "gdn_layers": len(config.gdn_layers),
               "hidden": config.hidden, "vocab": config.vocab, "moe": config.is_moe},
        settings={**asdict(settings), "contexts": list(settings.contexts), "prefill_chunk_auto": chunk is None,
                  "sampling": "greedy", "ignore_eos": True},
        limits=loaded.limits.to_json(), accounting=acct.summary(settings.prompt_tokens + 1),
        runs=result["runs"], skipped=skipped + loaded.skipped, host_overhead=result["host_overhead"],
        kernels=result["kernels"])
    out = sys.stderr if json_out == "-" else sys.stdout
    print(text_table(report), file=out)
    print("\n" + markdown_row(report), file=out)
    if json_out is not None:
        write_json(report, json_out)
        if json_out != "-":
            _log(f"wrote {json_out}")
