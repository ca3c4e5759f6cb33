"""GDN state slots: each running sequence owns one row of every GDN layer's conv and recurrent state tensors."""
from __future__ import annotations

from collections import deque


class StatePool:
    def __init__(self, num_slots: int):
        self.num_slots = num_slots
        self.free_slots: deque[int] = deque(range(num_slots))

    @property
    def num_free(self) -> int:
        return len(self.free_slots)

    def allocate(self) -> int:
        if not self.free_slots:
            raise RuntimeError("no free GDN state slot")
        return self.free_slots.popleft()

    def free(self, slot: int) -> None:
        self.free_slots.append(slot)
