"""Chaos mode of the software verbs provider (``NCCLLAB_SIM_CHAOS=<seed>``): what real hardware may do and a
plugin must not depend on.

* Placement: a write lands in aligned 64-byte units in shuffled order, other threads running in between, so a
  reader polling the data (instead of waiting for the completion) sees holes.
* Completions: delayed by up to a millisecond, per QP still in order and still after placement.
"""
from __future__ import annotations

import ctypes
import os
import random
import time

UNIT = 64


def seed() -> int | None:
    raw = os.environ.get("NCCLLAB_SIM_CHAOS", "").strip()
    return int(raw) if raw and raw != "0" else None


class Chaos:
    def __init__(self, seed_value: int):
        self.rng = random.Random(seed_value ^ os.getpid())

    def place(self, addr: int, data: bytes) -> None:
        """Copy ``data`` to ``addr`` unit by unit in random order (units aligned on the target address)."""
        cuts = list(range(0, len(data), UNIT))
        first = (-addr) % UNIT
        if first:
            cuts = [0] + list(range(first, len(data), UNIT))
        spans = [(a, (cuts[i + 1] if i + 1 < len(cuts) else len(data))) for i, a in enumerate(cuts)]
        self.rng.shuffle(spans)
        for i, (a, b) in enumerate(spans):
            ctypes.memmove(addr + a, data[a:b], b - a)
            if i % 64 == 63:
                time.sleep(0)  # let a polling reader look at the half-placed buffer

    def delay(self) -> None:
        if self.rng.random() < 0.3:
            time.sleep(self.rng.random() * 1e-3)
