"""The five collectives as one table (NCCL ``src/collectives.cc``: ``ncclAllReduce`` & co.; nccl-tests
``src/*.cu``: ``*GetCollByteCount``, ``*GetBw``): for each, its NCCL name, the runner's name, whether it takes an op
and a root, how nccl-tests sizes its buffers and its bus bandwidth, how to call it on a communicator, and the
NCCL-order reference that checks it.  The runner, the soak and the test workers dispatch through it; the device side
of each function is ``collectives.device.launch.RING``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from . import reference


@dataclass(frozen=True)
class Collective:
    name: str                         # NCCL's ncclFunc name, as in logs and NCCL_PROTO prefixes
    cli: str                          # the runner's --coll name
    reduces: bool                     # takes a reduction op
    rooted: bool                      # takes a root
    per_rank: bool                    # AllGather / ReduceScatter: the count is one rank's block, buffers n blocks
    bus_factor: Callable[[int], float]  # nccl-tests: busbw = algbw * factor(nranks)
    _call: Callable
    _reference: Callable

    def counts(self, nbytes: int, itemsize: int, nranks: int) -> tuple[int, int, int]:
        """(count, send count, receive count) for a message of ``nbytes`` (nccl-tests' ``*GetCollByteCount``: the
        per-rank block of AllGather/ReduceScatter is aligned down to 16 bytes)."""
        if not self.per_rank:
            return nbytes // itemsize, nbytes // itemsize, nbytes // itemsize
        per = (nbytes // itemsize // nranks) & ~(16 // itemsize - 1)
        return (per, per, per * nranks) if self.name == "AllGather" else (per, per * nranks, per)

    def in_place(self, buf: np.ndarray, rank: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """(send, receive) views of one buffer for an in-place call, as nccl-tests lays them out: AllGather sends
        from the rank's block of the result, ReduceScatter receives into the rank's block of its input."""
        if self.name == "AllGather":
            return buf[rank * count:(rank + 1) * count], buf
        if self.name == "ReduceScatter":
            return buf, buf[rank * count:(rank + 1) * count]
        return buf[:count], buf[:count]

    def call(self, comm, send: np.ndarray, out: np.ndarray, op: str = "sum", root: int = 0) -> np.ndarray:
        """Run it on ``comm``: ``send`` in, ``out`` out (in place when ``out`` is, or holds, ``send``)."""
        return self._call(comm, send, out, op, root)

    def reference(self, inputs: Sequence[np.ndarray], rank: int, op: str = "sum", root: int = 0,
                  **config) -> np.ndarray | None:
        """What rank ``rank`` must hold afterwards, in NCCL's summation order; None where NCCL defines nothing (a
        non-root rank of Reduce)."""
        return self._reference(inputs, rank, op, root, config)


COLLECTIVES = {c.name: c for c in (
    Collective("AllReduce", "allreduce", True, False, False, lambda n: 2 * (n - 1) / n,
               lambda c, s, o, op, root: c.all_reduce(s, op=op, out=o),
               lambda xs, r, op, root, kw: reference.all_reduce(xs, op, **kw)),
    Collective("AllGather", "allgather", False, False, True, lambda n: (n - 1) / n,
               lambda c, s, o, op, root: c.all_gather(s, out=o),
               lambda xs, r, op, root, kw: reference.all_gather(xs)),
    Collective("ReduceScatter", "reducescatter", True, False, True, lambda n: (n - 1) / n,
               lambda c, s, o, op, root: c.reduce_scatter(s, op=op, out=o),
               lambda xs, r, op, root, kw: reference.reduce_scatter(xs, r, op, **kw)),
    Collective("Broadcast", "broadcast", False, True, False, lambda n: 1.0,
               lambda c, s, o, op, root: c.broadcast(s, root=root, out=o),
               lambda xs, r, op, root, kw: reference.broadcast(xs, root)),
    Collective("Reduce", "reduce", True, True, False, lambda n: 1.0,
               lambda c, s, o, op, root: c.reduce(s, root=root, op=op, out=o),
               lambda xs, r, op, root, kw: reference.reduce(xs, root, op, **kw) if r == root else None),
)}
BY_CLI = {c.cli: c for c in COLLECTIVES.values()}
