"""Chaos mode of the software verbs provider (``NCCLLAB_SIM_CHAOS=<seed>``): what real hardware may do and a
plugin must not depend on.

* Placement: a write lands in aligned 64-byte units (``NCCLLAB_SIM_CHAOS_UNIT``) in shuffled order, other threads
  running in between, so a reader polling the data (instead of waiting for the completion) sees holes.  A unit
  is whole when its last word is seen: the unit but its last 8 bytes is stored first, then those 8 bytes, and x86
  makes stores visible in that order (one ``memmove`` of the unit would not: glibc's AVX2 copy stores 128 bytes
  as four 32-byte stores, bytes 64-95 last).  So a 64-B CTS FIFO entry or a 16-B LL line cannot tear, and a 128-B
  LL128 line, whose flag is its last word, cannot either if units are 128 B (NCCL counts on NICs writing a 128-B
  line at once; see IB_WRITE_CHUNK_ALIGNMENT).
* Completions: delayed by up to a millisecond, per QP still in order and still after placement.
"""
from __future__ import annotations

import ctypes
import os
import random
import time

def seed() -> int | None:
    raw = os.environ.get("NCCLLAB_SIM_CHAOS", "").strip()
    return int(raw) if raw and raw != "0" else None


class Chaos:
    def __init__(self, seed_value: int, unit: int | None = None):
        self.rng = random.Random(seed_value ^ os.getpid())
        self.unit = unit or int(os.environ.get("NCCLLAB_SIM_CHAOS_UNIT", "64"))
        if self.unit < 64 or self.unit & (self.unit - 1):
            raise ValueError(f"NCCLLAB_SIM_CHAOS_UNIT={self.unit}: a power of two, at least 64")

    def place(self, addr: int, data: bytes) -> None:
        """Copy ``data`` to ``addr`` unit by unit in random order (units counted from the start of the write,
        which the plugin keeps aligned: FIFO entries, slot starts and split chunks)."""
        unit = self.unit
        spans = [(a, min(a + unit, len(data))) for a in range(0, len(data), unit)]
        self.rng.shuffle(spans)
        for i, (a, b) in enumerate(spans):
            last = max(a, b - 8)  # the unit's last word goes last: what a reader checks first
            if last > a:
                ctypes.memmove(addr + a, data[a:last], last - a)
            ctypes.memmove(addr + last, data[last:b], b - last)
            if i % 64 == 63:
                time.sleep(0)  # let a polling reader look at the half-placed buffer

    def delay(self) -> None:
        if self.rng.random() < 0.3:
            time.sleep(self.rng.random() * 1e-3)
