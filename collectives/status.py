"""Per-rank status page in shared memory: NCCL's ``comm->abortFlag`` plus the collective each rank is running.

NCCL's kernels poll ``*comm->abortFlag``; here every local rank maps every other rank's page, so a rank that fails
(bad input, timeout) raises the flag with its reason and its peers stop waiting at once and report it.  A rank
that destroys its communicator marks its page with the number of collectives it completed, so a peer still
waiting in a later one knows at once that it will never come (ours: NCCL would wait forever).
Deliberate addition: each collective's signature (opCount, function, count, datatype, op, root) is published
before any data moves, and a rank compares its predecessor's before consuming its data, so a count, dtype or op
mismatch is a clear error instead of a silent wrong result or a hang.  NCCL does not check this.
"""
from __future__ import annotations

import os

import numpy as np

from collectives.misc.shm_segment import ShmSegment

SIZE = 8192
MSG_OFFSET, MSG_BYTES = 64, 960
DESC_OFFSET, DESC_SLOTS, DESC_WORDS = 1024, 64, 8
FUNC_CODES = {"Broadcast": 0, "Reduce": 1, "AllGather": 2, "ReduceScatter": 3, "AllReduce": 4}


class StatusPage:
    def __init__(self, seg: ShmSegment):
        self.seg = seg
        self.words = seg.i64(0, 4)  # abort flag, pid, destroyed flag, collectives completed when destroyed
        self.desc = seg.i64(DESC_OFFSET, DESC_SLOTS * DESC_WORDS).reshape(DESC_SLOTS, DESC_WORDS)

    @classmethod
    def create(cls, name: str) -> "StatusPage":
        page = cls(ShmSegment(name, SIZE, create=True))
        page.words[1] = os.getpid()
        return page

    @classmethod
    def attach(cls, name: str) -> "StatusPage":
        return cls(ShmSegment(name, SIZE, create=False))

    def close(self) -> None:
        """Unmap the page (its views first: an mmap cannot close under them).  A peer keeps its own mapping of
        it, so what this rank wrote last (the destroyed mark) stays readable there."""
        self.words = self.desc = None
        self.seg.close()

    # --- abort flag ---
    def abort(self, message: str) -> None:
        raw = message.encode()[:MSG_BYTES - 1]
        self.seg.array[MSG_OFFSET:MSG_OFFSET + MSG_BYTES] = 0
        self.seg.array[MSG_OFFSET:MSG_OFFSET + len(raw)] = np.frombuffer(raw, np.uint8)
        self.words[0] = 1  # flag after message, like data before tail

    @property
    def aborted(self) -> bool:
        return bool(self.words[0])

    @property
    def message(self) -> str:
        return bytes(self.seg.array[MSG_OFFSET:MSG_OFFSET + MSG_BYTES]).rstrip(b"\0").decode(errors="replace")

    # --- destroyed ---
    def mark_destroyed(self, completed: int) -> None:
        self.words[3] = completed
        self.words[2] = 1  # flag after count

    @property
    def destroyed(self) -> bool:
        return bool(self.words[2])

    @property
    def completed(self) -> int:
        return int(self.words[3])

    # --- collective signatures ---
    def publish(self, op_count: int, signature: tuple) -> None:
        row = self.desc[op_count % DESC_SLOTS]
        row[1:1 + len(signature)] = signature
        row[0] = op_count + 1  # written last: a reader seeing op_count+1 sees the whole signature

    def signature(self, op_count: int) -> tuple | None:
        row = self.desc[op_count % DESC_SLOTS]
        if int(row[0]) != op_count + 1:
            return None
        return tuple(int(v) for v in row[1:6])


def describe(sig: tuple, dtype_names: dict) -> str:
    func = next(k for k, v in FUNC_CODES.items() if v == sig[0])
    op = ("sum", "prod", "max", "min", "avg")[sig[3]]
    return f"{func}(count={sig[1]}, datatype={dtype_names[sig[2]]}, op={op}, root={sig[4]})"
