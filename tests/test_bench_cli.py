"""`inferno bench` end to end (subprocess) on the tiny synthetic artifact with the reference executor."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from inferno.artifact.synth import synthesize_artifact
from inferno.bench.report import SCHEMA
from inferno.errors import NotBuiltError


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("bench-cache")


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    return synthesize_artifact("tiny-dense", tmp_path_factory.mktemp("bench") / "tiny.ninfer", progress=False)


def bench(*args, cache):
    env = {**os.environ, "INFERNO_CACHE": str(cache)}
    return subprocess.run([sys.executable, "-m", "inferno", "bench", *map(str, args)],
                          capture_output=True, text=True, env=env, timeout=120)


def test_demo_cpu_run_writes_valid_json(cache, tmp_path):
    out = tmp_path / "bench.json"
    r = bench("--device", "cpu", "--prompt-tokens", 8, "--decode-tokens", 3, "--reps", 2, "--warmup", 0,
              "--kernel-table", "--json", out, cache=cache)
    assert r.returncode == 0, r.stderr
    assert "RANDOM weights" in r.stderr and "synthesizing the demo model" in r.stderr
    assert (cache / "demo.ninfer").is_file()
    assert not [p for p in cache.iterdir() if ".tmp-" in p.name]
    d = json.loads(out.read_text())
    assert d["schema"] == SCHEMA
    assert d["device"]["kind"] == "cpu" and d["device"]["executor"] == "reference"
    assert d["model"]["identity"] == "inferno-test-tiny-dense/groupwise-int"
    assert d["settings"]["prompt_tokens"] == 8 and d["settings"]["decode_tokens"] == 3 and d["settings"]["reps"] == 2
    assert d["limits"]["copy_gbps"] is None and d["limits"]["gemm_tflops"] is None
    (run,) = d["runs"]
    assert run["prefill"]["tok_s"]["n"] == 2 and run["decode"]["tok_s"]["median"] > 0
    assert [s["completion_tokens"] for s in run["samples"]] == [3, 3]
    for key in ("decode_roofline_tok_s", "decode_roofline_ratio", "prefill_mma_ratio"):
        assert run[key] is None
    assert d["accounting"]["kv_dtype"] == "fp32" and d["accounting"]["weights_per_decode_step"]["total"] > 0
    assert d["kernels"]["available"] is False and "ReferenceExecutor" in d["kernels"]["reason"]
    assert d["host_overhead"] == {"available": False, "reason": "ReferenceExecutor has no device step timer"}
    assert d["settings"]["prefill_chunk"] == 1024 and d["settings"]["prefill_chunk_auto"] is True
    assert d["command"].startswith("inferno bench --device cpu --prompt-tokens 8 --decode-tokens 3")
    assert "prefill tok/s" in r.stdout and "kernel table: not available" in r.stdout
    assert "host overhead per decode step: not measured" in r.stdout
    assert "| n/a (no measured limit) |" in r.stdout.splitlines()[-1]
    again = bench("--device", "cpu", "--prompt-tokens", 4, "--decode-tokens", 2, "--reps", 1, cache=cache)
    assert again.returncode == 0 and "synthesizing" not in again.stderr


def test_artifact_contexts_and_json_to_stdout(artifact, cache):
    r = bench(artifact, "--device", "cpu", "--prompt-tokens", 6, "--decode-tokens", 2, "--contexts", "10,300000,6",
              "--reps", 1, "--prefill-chunk", 4, "--json", "-", cache=cache)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)  # only the JSON on stdout; the table went to stderr
    assert [x["prompt_tokens"] for x in d["runs"]] == [6, 10]
    assert d["skipped"] == [{"prompt_tokens": 300000, "reason": "exceeds the model's 262144 positions"}]
    assert d["model"]["path"] == str(artifact) and d["settings"]["prefill_chunk"] == 4
    assert d["settings"]["prefill_chunk_auto"] is False and "--prefill-chunk 4" in d["command"]
    assert "prefill tok/s" in r.stderr


@pytest.mark.parametrize("args, message", [
    (["--device", "tpu"], "--device must be one of"),
    (["--contexts", "12,abc"], "--contexts takes comma-separated"),
    (["--decode-tokens", "1"], "--decode-tokens must be >= 2"),
    (["--reps", "0"], "--reps must be >= 1"),
    (["--warmup", "-1"], "--warmup must be >= 0"),
    (["--prompt-tokens", "262144", "--device", "cpu"], "exceeds the model's 262144 positions"),
    (["--json", "/nonexistent-dir/x.json"], "does not exist"),
    (["--prefill-chunk", "0"], "--prefill-chunk takes 'auto' or a token count 1..65535"),
    (["--prefill-chunk", "big"], "--prefill-chunk takes 'auto' or a token count 1..65535"),
    (["--prefill-chunk", "70000"], "--prefill-chunk takes 'auto' or a token count 1..65535"),
    (["--bogus"], "No such option"),
    (["/nonexistent.ninfer"], "no such artifact"),
])
def test_bad_flags_exit_2(args, message, cache):
    r = bench(*args, cache=cache)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert message in r.stderr and "Traceback" not in r.stderr


def test_checkpoint_directory_is_refused(tmp_path, cache):
    r = bench(tmp_path, cache=cache)
    assert r.returncode == 2 and "inferno convert" in r.stderr


def test_cuda_without_gpu_executor_is_not_built(monkeypatch):
    from inferno.cli import bench as cli

    monkeypatch.setitem(sys.modules, "inferno.model.gpu", None)  # import fails
    with pytest.raises(NotBuiltError) as e:
        cli._resolve_device("cuda")
    assert e.value.exit_code == 3 and "--device cpu" in str(e.value)
    assert cli._resolve_device("auto") == "cpu"


def test_cuda_without_gpu_exits_2(cache):
    from inferno.cuda.device import gpu_count

    if gpu_count() > 0:
        pytest.skip("this machine has a GPU")
    r = bench("--device", "cuda", cache=cache)
    assert r.returncode == 2 and "no CUDA GPU is visible" in r.stderr


def test_gpu_contexts_that_do_not_fit_are_skipped_longest_first(monkeypatch, artifact):
    """`_load_cuda` retries with the longest context dropped until the executor's plan fits."""
    from inferno.bench.limits import Limits
    from inferno.bench.runner import BenchSettings
    from inferno.cli import bench as cli
    from inferno.cuda.errors import OutOfMemoryError

    made = []

    class Gpu:
        name, arch, pci_bus_id = "Fake GPU", "sm_90a", "0000:00:06.0"

    class FakeGpuExecutor:
        cuda_graph = True
        device = Gpu()

        def __init__(self, path, *, max_seqs, max_context, cuda_graph, prefill_chunk):
            made.append(max_context)
            if max_context > 5000:
                raise OutOfMemoryError(f"needs more for {max_context}", name="gpu executor", requested=1, used=0,
                                       capacity=1, free=0)

    import inferno.model.gpu as gpu_pkg

    monkeypatch.setattr(gpu_pkg, "GpuExecutor", FakeGpuExecutor)
    monkeypatch.setattr(cli, "measure_gpu_limits", lambda device, log: Limits(copy_gbps=1.0))
    s = BenchSettings(1000, 8, contexts=(65536, 4000, 262144), reps=1)
    loaded = cli._load_cuda(artifact, s, cuda_graph=True, model=None)
    assert made == [262144 + 8, 65536 + 8, 4000 + 8]
    assert loaded.settings.cases == (1000, 4000)
    assert [x["prompt_tokens"] for x in loaded.skipped] == [262144, 65536]
    assert loaded.device["name"] == "Fake GPU" and loaded.states.kv == "bf16" and loaded.limits.copy_gbps == 1.0
    assert loaded.clocks is None and loaded.device["clocks_unavailable"]  # no NVML for a fake GPU's bus id
    with pytest.raises(OutOfMemoryError):  # the prompt length itself does not fit: the error stands
        cli._load_cuda(artifact, BenchSettings(6000, 8, reps=1), cuda_graph=True, model=None)


def test_gpu_auto_prefill_chunk_is_chosen_per_size_tried(monkeypatch, artifact):
    """`--prefill-chunk auto`: `_load_cuda` sizes the chunk for each executor size it tries, from the
    free device memory, and the executor, the settings and the report get that chunk."""
    from inferno.bench.limits import Limits
    from inferno.bench.runner import BenchSettings
    from inferno.cli import bench as cli
    from inferno.cuda.errors import OutOfMemoryError
    from inferno.model.gpu.profile import step_spans

    made, asked = [], []

    class Gpu:
        name, arch, pci_bus_id = "Fake GPU", "sm_90a", "0000:00:06.0"

        def free_mem(self):
            return 123 << 30

    class FakeGpuExecutor:
        cuda_graph = True
        device = Gpu()

        def __init__(self, path, *, max_seqs, max_context, cuda_graph, prefill_chunk):
            made.append((max_context, prefill_chunk))
            if max_context > 5000:
                raise OutOfMemoryError("too big", name="gpu executor", requested=1, used=0, capacity=1, free=0)

    def fake_rule(config, expected, fusion, max_seqs, max_context, free):
        asked.append((config, expected, fusion, max_seqs, max_context, free))
        return min(max_context, 4096)

    import inferno.cuda as cuda_pkg
    import inferno.model.gpu as gpu_pkg

    monkeypatch.setattr(gpu_pkg, "GpuExecutor", FakeGpuExecutor)
    monkeypatch.setattr(cuda_pkg.Device, "open", classmethod(lambda cls, ordinal=0: Gpu()))
    monkeypatch.setattr(cli, "gpu_prefill_chunk", fake_rule)
    monkeypatch.setattr(cli, "measure_gpu_limits", lambda device, log: Limits(copy_gbps=1.0))
    s = BenchSettings(1000, 8, contexts=(65536, 3000), reps=1)
    loaded = cli._load_cuda(artifact, s, cuda_graph=True, model=("config", "inventory", "nvfp4"))
    assert made == [(65536 + 8, 4096), (3000 + 8, 3008)]
    assert asked == [("config", "inventory", "nvfp4", 1, 65536 + 8, 123 << 30),
                     ("config", "inventory", "nvfp4", 1, 3000 + 8, 123 << 30)]
    assert loaded.settings.prefill_chunk == 3008 and loaded.step_timer is step_spans


def test_command_records_the_ab_switches_set(monkeypatch):
    """A/B switches set in the environment lead the recorded command, so benchmark rows describe themselves."""
    from inferno.bench.runner import BenchSettings
    from inferno.cli.bench import AB_SWITCHES, _command

    for k in AB_SWITCHES:
        monkeypatch.delenv(k, raising=False)
    s = BenchSettings(prompt_tokens=8, decode_tokens=3, contexts=(), reps=1, warmup=0, prefill_chunk=8, seed=0)
    assert _command("m.ninfer", "cuda", s, "", False, False).startswith("inferno bench m.ninfer --device cuda")
    monkeypatch.setenv("INFERNO_TILED", "head")
    monkeypatch.setenv("INFERNO_BRANCHES", "0")
    assert _command("m.ninfer", "cuda", s, "", True, False).startswith(
        "INFERNO_TILED=head INFERNO_BRANCHES=0 inferno bench m.ninfer --device cuda")


def test_full_context_runs_with_a_shorter_prompt(capsys):
    """A context equal to the model's positions runs with the prompt shortened by the decode tokens;
    longer ones are skipped."""
    from inferno.bench.runner import BenchSettings
    from inferno.cli.bench import _fit_positions

    s, skipped = _fit_positions(BenchSettings(7680, 128, (65536, 262144, 300000), 1, 0, 1024), 262144)
    assert s.contexts == (65536, 262016) and s.max_tokens == 262144
    assert skipped == [{"prompt_tokens": 300000, "reason": "exceeds the model's 262144 positions"}]
    assert "prompt 262016 tokens, so that 128 decode tokens end at context 262144" in capsys.readouterr().err
