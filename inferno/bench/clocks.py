"""The GPU's clocks and power while a benchmark runs, read through NVML (the driver's libnvidia-ml).

The same build measures ~3 % apart on GPUs of one kind (docs/performance.md, sessions 26-29); a report that
names its GPU (UUID) and says at what SM and memory clock it ran, and why the driver held a clock down (NVML's
clock event reasons), lets those runs be told apart. Sampled on a thread every `period_s` while the timed
repetitions run. Where NVML cannot be loaded or does not know the device, the report says so and nothing else
changes.
"""

from __future__ import annotations

import ctypes
import statistics
import threading
from typing import Any

SM, MEM = 1, 2  # nvmlClockType_t: NVML_CLOCK_SM, NVML_CLOCK_MEM
REASONS = {  # nvmlClocksEventReasons bits
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
    0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}


def reason_names(bits: int) -> list[str]:
    """The names of the clock event reason bits set in `bits` (unknown bits as hex)."""
    names = [name for bit, name in REASONS.items() if bits & bit]
    rest = bits & ~sum(REASONS)
    return names + ([f"0x{rest:x}"] if rest else [])


class Nvml:
    """The few NVML calls the sampler makes, on one device found by its PCI bus id."""

    def __init__(self, lib: Any, pci_bus_id: str):
        self.lib = lib
        self._check(lib.nvmlInit_v2(), "nvmlInit_v2")
        self.handle = ctypes.c_void_p()
        try:
            self._check(lib.nvmlDeviceGetHandleByPciBusId_v2(pci_bus_id.encode(), ctypes.byref(self.handle)),
                        "nvmlDeviceGetHandleByPciBusId_v2")
        except RuntimeError:
            lib.nvmlShutdown()
            raise

    @classmethod
    def open(cls, pci_bus_id: str) -> "Nvml":
        """NVML on the device at `pci_bus_id`; RuntimeError if the library or the device is not there."""
        try:
            lib = ctypes.CDLL("libnvidia-ml.so.1")
        except OSError as e:
            raise RuntimeError(f"libnvidia-ml.so.1 not loadable: {e}") from None
        return cls(lib, pci_bus_id)

    @staticmethod
    def _check(rc: int, call: str) -> None:
        if rc != 0:
            raise RuntimeError(f"{call} returned NVML error {rc}")

    def _call(self, fn: str, *args: Any) -> None:
        f = getattr(self.lib, fn, None)
        if f is None:
            raise RuntimeError(f"{fn} is not in this driver's NVML")
        self._check(f(self.handle, *args), fn)

    def _uint(self, fn: str, *args: Any) -> int:
        v = ctypes.c_uint()
        self._call(fn, *args, ctypes.byref(v))
        return v.value

    def uuid(self) -> str:
        buf = ctypes.create_string_buffer(96)
        self._call("nvmlDeviceGetUUID", buf, 96)
        return buf.value.decode(errors="replace")

    def clock_mhz(self, which: int) -> int:
        return self._uint("nvmlDeviceGetClockInfo", which)

    def max_clock_mhz(self, which: int) -> int:
        return self._uint("nvmlDeviceGetMaxClockInfo", which)

    def power_w(self) -> float:
        return self._uint("nvmlDeviceGetPowerUsage") / 1000.0

    def event_reasons(self) -> int:
        v = ctypes.c_ulonglong()
        self._call("nvmlDeviceGetCurrentClocksEventReasons", ctypes.byref(v))
        return v.value

    def close(self) -> None:
        self.lib.nvmlShutdown()


def _spread(values: list) -> dict | None:
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


class ClockSampler:
    """`with sampler:` samples the SM and memory clocks, the power and the clock event reasons every `period_s`;
    `summary()` then gives their spreads over that span (each `with` starts a new one), `identity()` the GPU and
    its maximum clocks."""

    def __init__(self, nvml: Nvml, period_s: float = 0.25):
        self.nvml = nvml
        self.period_s = period_s
        self._samples: list[tuple[int | None, int | None, float | None, int | None]] = []
        self._errors: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def identity(self) -> dict:
        return {"uuid": self.nvml.uuid(), "sm_mhz_max": self.nvml.max_clock_mhz(SM),
                "mem_mhz_max": self.nvml.max_clock_mhz(MEM)}

    def _read(self, query: Any, *args: Any) -> Any:
        """One query's value, or None (its error said once in the summary; the other queries still sampled)."""
        try:
            return query(*args)
        except RuntimeError as e:
            if str(e) not in self._errors:
                self._errors.append(str(e))
            return None

    def sample(self) -> None:
        n = self.nvml
        self._samples.append((self._read(n.clock_mhz, SM), self._read(n.clock_mhz, MEM), self._read(n.power_w),
                              self._read(n.event_reasons)))

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.period_s)

    def __enter__(self) -> "ClockSampler":
        self._samples, self._errors = [], []
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="clock sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.sample()  # the state at the end, so even a span shorter than the period has a sample

    def summary(self) -> dict:
        s = self._samples
        bits = 0
        for *_, r in s:
            bits |= r or 0
        return {"samples": len(s), "period_s": self.period_s, "sm_mhz": _spread([x[0] for x in s]),
                "mem_mhz": _spread([x[1] for x in s]), "power_w": _spread([x[2] for x in s]),
                "clock_event_reasons": reason_names(bits), "errors": list(self._errors)}

    def close(self) -> None:
        self.nvml.close()


def open_sampler(pci_bus_id: str, period_s: float = 0.25) -> tuple[ClockSampler | None, str | None]:
    """(a sampler for the GPU at `pci_bus_id`, None), or (None, why not)."""
    try:
        return ClockSampler(Nvml.open(pci_bus_id), period_s), None
    except RuntimeError as e:
        return None, str(e)


def clock_line(c: dict) -> str:
    """One text line of a run's clock summary."""
    if not c.get("samples"):
        return "clocks: no samples"

    def mhz(what: str, d: dict | None) -> str:
        return f"{what} n/a" if d is None else f"{what} {d['median']:,.0f} MHz ({d['min']:,.0f}-{d['max']:,.0f})"

    pw = c["power_w"]
    power = "power n/a" if pw is None else f"power {pw['median']:,.0f} W (max {pw['max']:,.0f})"
    reasons = ", ".join(r for r in c["clock_event_reasons"] if r != "gpu_idle") or "none"
    return (f"clocks over {c['samples']} samples: {mhz('SM', c['sm_mhz'])}, {mhz('memory', c['mem_mhz'])}, {power}; "
            f"clock event reasons besides idle: {reasons}")
