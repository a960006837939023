"""The five collectives, and the four point-to-point tests of nccl-tests, as one table (NCCL
``src/collectives.cc``: ``ncclAllReduce`` & co.; nccl-tests ``src/*.cu``: ``*GetCollByteCount``, ``*GetBw``,
``*RunColl``): for each, its NCCL name, the runner's name, whether it takes an op and a root, how nccl-tests sizes
its buffers and its bus bandwidth, how to call it on a communicator, and the reference that checks it.  The runner,
the soak and the test workers dispatch through ``COLLECTIVES``; the device side of each collective is
``collectives.device.launch.RING``.

The point-to-point ones (``P2P_TESTS``), as nccl-tests runs them:

* SendRecv (``sendrecv.cu``): in one group each rank sends ``count`` elements to rank + 1 and receives as many from
  rank - 1; busbw = algbw.  In place (one buffer for both) it runs, and nccl-tests reports no errors for it (N/A).
* AlltoAll (``alltoall.cu``): ``count`` = (bytes / size / nranks) aligned down to 16 bytes per peer, buffers of
  ``nranks * count``; algbw counts ``nranks * count`` elements, busbw = algbw * (n-1)/n.  NCCL has no in-place
  all-to-all and nccl-tests reports no errors for it; our ``all_to_all`` refuses it, so that column is N/A.
* Gather / Scatter (``gather.cu``, ``scatter.cu``): the same counts and bandwidths as AlltoAll, at root ``-r``; in
  place as AllGather / ReduceScatter lay it out (the root's block).  A non-root rank's Gather receive buffer must
  keep its bytes.

Deliberate difference: nccl-tests runs every root with ``-r -1``; here ``-r`` names one root.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from collectives import groups

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
    p2p: bool = False                 # sends and receives: no cost-model plan, no ring reference config
    in_place_runs: bool = True        # AlltoAll: no in-place form, the column is N/A
    in_place_checked: bool = True     # SendRecv / AlltoAll: nccl-tests reports no errors in place (N/A)

    def counts(self, nbytes: int, itemsize: int, nranks: int) -> tuple[int, int, int]:
        """(count, send count, receive count) for a message of ``nbytes`` (nccl-tests' ``*GetCollByteCount``: the
        per-rank block of AllGather/ReduceScatter is aligned down to 16 bytes)."""
        if not self.per_rank:
            return nbytes // itemsize, nbytes // itemsize, nbytes // itemsize
        per = (nbytes // itemsize // nranks) & ~(16 // itemsize - 1)
        if self.name == "AlltoAll":
            return per, per * nranks, per * nranks
        return (per, per, per * nranks) if self.name in ("AllGather", "Gather") else (per, per * nranks, per)

    def in_place(self, buf: np.ndarray, rank: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """(send, receive) views of one buffer for an in-place call, as nccl-tests lays them out: AllGather sends
        from the rank's block of the result, ReduceScatter receives into the rank's block of its input."""
        if self.name in ("AllGather", "Gather"):
            return buf[rank * count:(rank + 1) * count], buf
        if self.name in ("ReduceScatter", "Scatter"):
            return buf, buf[rank * count:(rank + 1) * count]
        return buf[:count], buf[:count]

    def call(self, comm, send: np.ndarray, out: np.ndarray, op: str = "sum", root: int = 0) -> np.ndarray:
        """Run it on ``comm``: ``send`` in, ``out`` out (in place when ``out`` is, or holds, ``send``)."""
        return self._call(comm, send, out, op, root)

    def reference(self, inputs: Sequence[np.ndarray], rank: int, op: str = "sum", root: int = 0,
                  **config) -> np.ndarray | None:
        """What rank ``rank`` must hold afterwards, in NCCL's summation order; None where NCCL defines nothing (a
        non-root rank of Reduce) or leaves the buffer as it was (a non-root rank of Gather)."""
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


def _sendrecv(comm, send: np.ndarray, out: np.ndarray) -> np.ndarray:
    """nccl-tests' ``SendRecvRunColl``: to rank + 1, from rank - 1, in one group."""
    n, r = comm.nranks, comm.rank
    with groups.group():
        comm.send(send, (r + 1) % n)
        comm.recv(out, (r - 1) % n)
    return out


P2P_TESTS = {c.name: c for c in (
    Collective("SendRecv", "sendrecv", False, False, False, lambda n: 1.0,
               lambda c, s, o, op, root: _sendrecv(c, s, o),
               lambda xs, r, op, root, kw: reference.sendrecv(xs, r), p2p=True, in_place_checked=False),
    Collective("AlltoAll", "alltoall", False, False, True, lambda n: (n - 1) / n,
               lambda c, s, o, op, root: c.all_to_all(s, out=o),
               lambda xs, r, op, root, kw: reference.alltoall(xs, r), p2p=True, in_place_runs=False,
               in_place_checked=False),
    Collective("Gather", "gather", False, True, True, lambda n: (n - 1) / n,
               lambda c, s, o, op, root: c.gather(s, root=root, out=o),
               lambda xs, r, op, root, kw: reference.gather(xs, r, root), p2p=True),
    Collective("Scatter", "scatter", False, True, True, lambda n: (n - 1) / n,
               lambda c, s, o, op, root: c.scatter(s, root=root, out=o),
               lambda xs, r, op, root, kw: reference.scatter(xs, r, root), p2p=True),
)}
BY_CLI = {c.cli: c for c in COLLECTIVES.values()}          # the collectives (the cost model's tools take these)
RUNS = {**BY_CLI, **{c.cli: c for c in P2P_TESTS.values()}}  # what the nccl-tests runner runs
