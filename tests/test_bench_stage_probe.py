"""tools/bench_stage_probe.py's probe (cute_kernels/stage_probe.py): its variants build, and in SASS (where
cuobjdump is installed) the staging barrier waits for x's loads (each thread stores its sum to shared memory
before it) and the ring's copies are issued before griddepcontrol.wait."""

import importlib.util
import subprocess
from pathlib import Path

import pytest

from test_kernels_gemv_mma import _cuobjdump

spec = importlib.util.spec_from_file_location("bench_stage_probe",
                                              Path(__file__).parents[1] / "tools" / "bench_stage_probe.py")
bench_stage_probe = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench_stage_probe)


def test_configs_and_names():
    names = [bench_stage_probe.probe_variant(*c).name for c in bench_stage_probe.CONFIGS]
    assert len(set(names)) == len(names) == 18
    assert "stage_probe_34k_r132_ring" in names and "stage_probe_10k_r1" in names


def test_probe_sass(tmp_path):
    pytest.importorskip("cutlass")
    from cute_kernels.stage_probe import StageProbe
    from inferno.kernels.build import build_variant

    with pytest.raises(ValueError, match="stride >= nbytes"):
        StageProbe(nbytes=4096, stride=2048)

    v = bench_stage_probe.probe_variant(34816, 4, True)
    build_variant(v, "sm_90a", tmp_path)
    tool = _cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump not installed (pip install nvidia-cuda-cuobjdump)")
    sass = subprocess.run([tool, "-sass", str(tmp_path / "sm_90a" / f"{v.name}.cubin")], capture_output=True,
                          text=True, check=True).stdout
    wait, bar = sass.index("ACQBULK"), sass.index("BAR.SYNC")
    assert sass[:wait].count("LDGSTS") == 8  # the ring prologue: 2 stages of 2 KB a warp, 16 bytes a lane
    staging = sass[wait:bar]
    assert staging.count("LDG.E.128") == 5  # 34 KB over 512 threads: 5 rounds of 16 bytes
    assert staging.rindex("LDG.E.128") < staging.rindex("STS") and "GLOBALTIMER" in staging
