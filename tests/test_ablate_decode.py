"""tools/ablate_decode.py's operation classes and filter, on the emulated executor's decode body."""

import importlib.util
from pathlib import Path

import pytest

from inferno.model.gpu import GpuExecutor

spec = importlib.util.spec_from_file_location("ablate_decode", Path(__file__).parents[1] / "tools" / "ablate_decode.py")
ablate = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ablate)


@pytest.fixture(scope="module")
def executor(tmp_path_factory):
    from inferno.artifact.synth import synthesize_artifact

    path = synthesize_artifact("tiny-dense", tmp_path_factory.mktemp("ablate") / "tiny.ninfer", progress=False)
    ex = GpuExecutor(path, max_seqs=1, max_context=64, emulate=True, progress=False)
    yield ex
    ex.close()


def test_filter_leaves_out_one_class(executor):
    prog = executor.program
    st = executor.new_state()
    executor.prefill([1, 2, 3], st)
    executor._write_step(4, st)
    real = prog.ops
    everything = ablate.Filtering(real, lambda c: True)
    prog.ops = everything
    try:
        prog.body()
        assert everything.seen["gemv mlp/gate_up"] == executor.config.n_layers
        assert everything.seen["embedding"] == 1 and everything.seen["branches"] >= 1
        dropping = ablate.Filtering(real, lambda c: c != "gemv mlp/gate_up")
        calls = []
        real_gemv = real.gemv
        real.gemv = lambda *a, **k: (calls.append(ablate.op_class("gemv", a, k)), real_gemv(*a, **k))
        prog.ops = dropping
        prog.body()
        assert dropping.seen == everything.seen  # every call is seen, ...
        assert "gemv mlp/gate_up" not in calls and "gemv mlp/down" in calls  # ... the class is left out
    finally:
        prog.ops = real
        real.__dict__.pop("gemv", None)
        executor.release(st)
