"""The bench's GPU clock sampling (NVML through ctypes), against fakes: no GPU or driver needed."""

from __future__ import annotations

import ctypes
import time

import pytest

from inferno.bench import clocks as C
from inferno.bench.report import markdown_row, text_table


class FakeLib:
    """The NVML entry points the sampler calls, writing through the byref pointers as libnvidia-ml does."""

    def __init__(self, sm=1980, mem=3201, power_mw=612345, reasons=0x1, missing=(), failing=()):
        self.values = {C.SM: sm, C.MEM: mem}
        self.power_mw, self.reasons, self.failing = power_mw, reasons, failing
        self.shut = 0
        for name in missing:
            setattr(self, name, None)

    def nvmlInit_v2(self):
        return 0

    def nvmlShutdown(self):
        self.shut += 1
        return 0

    def nvmlDeviceGetHandleByPciBusId_v2(self, bus, handle):
        return 0 if bus == b"0000:00:06.0" else 13  # NVML_ERROR_NOT_FOUND

    def nvmlDeviceGetUUID(self, handle, buf, n):
        buf.value = b"GPU-test-uuid"
        return 0

    def nvmlDeviceGetClockInfo(self, handle, which, out):
        if "clock" in self.failing:
            return 3  # NVML_ERROR_NOT_SUPPORTED
        out._obj.value = self.values[which]
        return 0

    def nvmlDeviceGetMaxClockInfo(self, handle, which, out):
        out._obj.value = self.values[which] + 100
        return 0

    def nvmlDeviceGetPowerUsage(self, handle, out):
        out._obj.value = self.power_mw
        return 0

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle, out):
        out._obj.value = self.reasons
        return 0


def test_reason_names_name_the_bits_and_keep_unknown_ones():
    assert C.reason_names(0) == []
    assert C.reason_names(0x1 | 0x4 | 0x40) == ["gpu_idle", "sw_power_cap", "hw_thermal_slowdown"]
    assert C.reason_names(0x8 | 0x10000) == ["hw_slowdown", "0x10000"]


def test_nvml_reads_through_the_pointers_and_refuses_an_unknown_bus():
    lib = FakeLib()
    n = C.Nvml(lib, "0000:00:06.0")
    assert (n.uuid(), n.clock_mhz(C.SM), n.clock_mhz(C.MEM), n.max_clock_mhz(C.SM)) == ("GPU-test-uuid", 1980, 3201, 2080)
    assert n.power_w() == pytest.approx(612.345) and n.event_reasons() == 0x1
    n.close()
    assert lib.shut == 1
    other = FakeLib()
    with pytest.raises(RuntimeError, match="nvmlDeviceGetHandleByPciBusId_v2 returned NVML error 13"):
        C.Nvml(other, "0000:00:07.0")
    assert other.shut == 1  # shut down again after the failed lookup


def test_open_sampler_says_why_when_nvml_is_missing(monkeypatch):
    def no_lib(name):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(ctypes, "CDLL", no_lib)
    sampler, why = C.open_sampler("0000:00:06.0")
    assert sampler is None and "libnvidia-ml.so.1 not loadable" in why


def test_sampler_summarises_each_span_and_survives_a_missing_query():
    s = C.ClockSampler(C.Nvml(FakeLib(reasons=0x1 | 0x4), "0000:00:06.0"), period_s=0.005)
    assert s.identity() == {"uuid": "GPU-test-uuid", "sm_mhz_max": 2080, "mem_mhz_max": 3301}
    with s:
        time.sleep(0.05)
    first = s.summary()
    assert first["samples"] >= 3 and first["errors"] == []
    assert first["sm_mhz"] == {"median": 1980, "min": 1980, "max": 1980}
    assert first["mem_mhz"]["median"] == 3201 and first["power_w"]["max"] == pytest.approx(612.345)
    assert first["clock_event_reasons"] == ["gpu_idle", "sw_power_cap"]
    s.nvml.lib.values[C.SM] = 1500
    with s:  # a new span: the first one's samples are gone
        pass
    assert s.summary()["samples"] >= 1 and s.summary()["sm_mhz"]["max"] == 1500

    lacking = C.ClockSampler(C.Nvml(FakeLib(missing=("nvmlDeviceGetCurrentClocksEventReasons",), failing=("clock",)),
                                    "0000:00:06.0"), period_s=0.005)
    with lacking:
        time.sleep(0.02)
    out = lacking.summary()
    assert out["sm_mhz"] is None and out["mem_mhz"] is None and out["power_w"]["median"] == pytest.approx(612.345)
    assert out["clock_event_reasons"] == []
    assert out["errors"] == ["nvmlDeviceGetClockInfo returned NVML error 3",
                             "nvmlDeviceGetCurrentClocksEventReasons is not in this driver's NVML"]
    assert "SM n/a" in C.clock_line(out) and "power 612 W" in C.clock_line(out)


def test_run_case_samples_the_timed_repetitions_and_the_table_prints_them():
    from fake_executor import FakeExecutor
    from inferno.artifact.identities import lookup
    from inferno.bench.accounting import account
    from inferno.bench.limits import cpu_limits
    from inferno.bench.report import build_report
    from inferno.bench.runner import BenchSettings, run_bench
    from inferno.checkpoint.presets import get_preset
    from inferno.model.config import ModelConfig

    config = ModelConfig.from_hf({**get_preset("tiny-dense").text})
    acct = account(config, lookup("inferno-test-tiny-dense", "groupwise-int").expected(config))
    sampler = C.ClockSampler(C.Nvml(FakeLib(reasons=0x20), "0000:00:06.0"), period_s=0.005)
    out = run_bench(FakeExecutor(delay=0.002), acct, cpu_limits(), BenchSettings(8, 5, contexts=(12,), reps=2, warmup=1),
                    lambda m: None, clocks=sampler)
    assert [r["clocks"]["sm_mhz"]["median"] for r in out["runs"]] == [1980, 1980]
    assert all(r["clocks"]["samples"] >= 2 for r in out["runs"])
    report = build_report(date="2026-12-03T17:00:00+00:00", command="inferno bench x.ninfer",
                          device={"kind": "cuda", "name": "NVIDIA H200", "executor": "gpu", "gpu": sampler.identity()},
                          model={"identity": "inferno-test-tiny-dense/groupwise-int"}, settings={},
                          limits=cpu_limits().to_json(), accounting=acct.summary(9), runs=out["runs"], skipped=[],
                          host_overhead={"available": False, "reason": "test"}, kernels=None)
    table = text_table(report)
    assert "GPU GPU-test-uuid (SM up to 2,080 MHz, memory 3,301 MHz)" in table
    assert "SM 1,980 MHz (1,980-1,980)" in table and "besides idle: sw_thermal_slowdown" in table
    assert markdown_row(report).startswith("| 2026-12-03 | NVIDIA H200 (GPU-test-uui, SM 1,980 MHz) | `inferno bench")
    assert "clocks" not in run_bench(FakeExecutor(), acct, cpu_limits(), BenchSettings(8, 5, reps=1, warmup=0),
                                     lambda m: None)["runs"][0]
