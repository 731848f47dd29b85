"""`inferno kernels build|list|check` as a user runs them (no GPU here)."""

import os
import subprocess
import sys

import pytest

from inferno.cuda.device import gpu_count


def _run(*args, env=None):
    return subprocess.run([sys.executable, "-m", "inferno", "kernels", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=300)


def test_check_without_gpu_says_so_and_exits_0():
    if gpu_count() > 0:
        pytest.skip("this machine has a GPU: `inferno kernels check` runs for real (tests/gpu)")
    r = _run("check")
    assert r.returncode == 0
    assert "no NVIDIA GPU" in r.stdout


def test_build_then_list(tmp_path):
    pytest.importorskip("cutlass.cute", reason="CuTe DSL not installed")
    r = _run("build", "--arch", "sm_120a", "--out", str(tmp_path), "--only", "silu_mul")
    assert r.returncode == 0, r.stderr
    assert "built sm_120a/silu_mul.cubin" in r.stderr
    assert (tmp_path / "sm_120a" / "silu_mul.cubin").is_file()
    r = _run("list", env={"INFERNO_KERNEL_DIR": str(tmp_path)})
    assert r.returncode == 0
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("silu_mul "))
    assert line.split()[2:4] == ["missing", "built"]  # sm_90a, sm_120a
    assert any(ln.startswith("gemm_wgmma ") and ln.split()[3] == "-" for ln in r.stdout.splitlines())


def test_build_in_parallel_processes(tmp_path):
    """--jobs 2: two spawned compiler processes build every asked (variant, arch), each reported once."""
    pytest.importorskip("cutlass.cute", reason="CuTe DSL not installed")
    r = _run("build", "--arch", "sm_90a", "--arch", "sm_120a", "--out", str(tmp_path), "--jobs", "2",
             "--only", "silu_mul", "--only", "embedding")
    assert r.returncode == 0, r.stderr
    built = sorted(ln.split()[1] for ln in r.stderr.splitlines() if ln.startswith("built "))
    assert built == [f"{a}/{n}.cubin" for a in ("sm_120a", "sm_90a") for n in ("embedding", "silu_mul")]
    assert all((tmp_path / a / f"{n}.json").is_file() for a in ("sm_90a", "sm_120a") for n in ("silu_mul", "embedding"))


@pytest.mark.parametrize("args,message", [
    (["build", "--only", "nope"], "no kernel variant 'nope'"),
    (["build", "--jobs", "-1", "--only", "silu_mul"], "--jobs -1"),
    (["build", "--arch", "sm_80"], "no kernel builds for --arch sm_80"),
    (["build", "--arch", "sm_120a", "--only", "gemm_wgmma"], "does not build for sm_120a"),
])
def test_bad_flags_are_one_line_errors(args, message, tmp_path):
    r = _run(*args, "--out", str(tmp_path))
    assert r.returncode == 2
    assert r.stderr.startswith("error: ") and message in r.stderr
    assert "Traceback" not in r.stderr
