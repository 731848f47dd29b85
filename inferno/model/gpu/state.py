"""Sequence state on the device: the KV page pool and the GDN state slots, and `GpuState`.

Every sequence owns one GDN slot (its conv and recurrent state in every GDN layer) and a list
of KV pages (page i holds its tokens 64 i .. 64 i + 63 in every attention layer; layout in
inferno/kernels/kv_layout.py). Slots and pages are taken from fixed pools reserved at start-up,
so generating never allocates device memory; `release` returns them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from inferno.cuda.memory import DeviceBuffer
from inferno.errors import UsageError
from inferno.model.config import ModelConfig
from inferno.model.executor import State
from inferno.model.gpu.ops import Ops
from inferno.model.gpu.residency import ResidencyPlan


@dataclass
class GpuState(State):
    """A sequence of the GPU executor: its GDN slot and KV pages (the tensors stay on the device)."""

    slot: int = -1
    pages: list[int] = field(default_factory=list)
    sampled: bool = False  # the device holds a token sampled for it (queue_sample may take it as input)


class FreeList:
    """Ids 0..n-1, handed out lowest first."""

    def __init__(self, n: int, what: str, hint: str):
        self.n = n
        self.what = what
        self.hint = hint
        self._free = list(range(n - 1, -1, -1))

    def take(self) -> int:
        if not self._free:
            raise UsageError(f"all {self.n} {self.what} are in use; {self.hint}")
        return self._free.pop()

    def give(self, ids: list[int]) -> None:
        for i in ids:
            if not 0 <= i < self.n or i in self._free:
                raise AssertionError(f"{self.what}: id {i} returned twice or never taken")
        self._free.extend(sorted(ids, reverse=True))

    @property
    def available(self) -> int:
        return len(self._free)


class DeviceStates:
    """The KV pools and GDN state buffers of every layer, and the slot / page allocators."""

    def __init__(self, ops: Ops, config: ModelConfig, plan: ResidencyPlan):
        self.ops = ops
        self.plan = plan
        kv, gdn = plan.kv, plan.gdn
        self.kv: dict[int, DeviceBuffer] = {i: ops.alloc(f"kv/layer{i}", kv.layer_bytes) for i in config.attention_layers}
        self.conv: dict[int, DeviceBuffer] = {}
        self.recurrent: dict[int, DeviceBuffer] = {}
        for i in config.gdn_layers:
            self.conv[i] = ops.alloc(f"gdn/layer{i}/conv", gdn.slots * gdn.conv_slot_bytes)
            self.recurrent[i] = ops.alloc(f"gdn/layer{i}/recurrent", gdn.slots * gdn.recurrent_slot_bytes)
        self.slots = FreeList(gdn.slots, "sequence slots",
                              "release finished sequences or raise --max-concurrency")
        self.pages = FreeList(kv.n_pages, "KV pages", "release finished sequences or raise --max-context")

    def new(self) -> GpuState:
        """A fresh sequence: a slot whose GDN state is zeroed (queued on the ops stream), no pages."""
        slot = self.slots.take()
        g = self.plan.gdn
        for i in self.conv:
            self.ops.zero(self.conv[i].view(slot * g.conv_slot_bytes, g.conv_slot_bytes))
            self.ops.zero(self.recurrent[i].view(slot * g.recurrent_slot_bytes, g.recurrent_slot_bytes))
        return GpuState(kv={}, gdn={}, slot=slot)

    def reserve(self, state: GpuState, length: int) -> None:
        """Make sure `state` has KV pages for `length` tokens."""
        kv = self.plan.kv
        if length > kv.max_context:
            raise UsageError(f"the sequence would reach {length} tokens, more than --max-context "
                             f"{kv.max_context}; raise --max-context")
        while len(state.pages) * kv.page_tokens < length:
            state.pages.append(self.pages.take())

    def release(self, state: GpuState) -> None:
        """Return the state's pages and slot."""
        if state.slot >= 0:
            self.pages.give(state.pages)
            self.slots.give([state.slot])
        state.pages = []
        state.slot = -1
