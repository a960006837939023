"""The wire floor of each protocol on this machine: what one hop of a small message costs when nothing but its
memory moves between two cores, measured beside ``latency.py``'s AllReduce so that its protocol order can be read
against the hardware.

A hop of an 8-byte message is, in each protocol's own layout (``src/device/prims_ll.h``, ``prims_ll128.h``,
``prims_simple.h``):

* LL: one 16-byte line, data and flag in each 8-byte half, stored together; the reader polls the line;
* LL128: a whole 2048-byte wire slice (NCCL's warp writes all 16 of its 128-byte lines even for 8 bytes: 15 data
  words, then the flag word of each line); the reader polls the 16 flag words, then reads the data;
* Simple: the data, a fence, then ``tail`` on its own cache line; the reader polls ``tail``, then reads the data.

Two ranks (mpirun -n 2) ping-pong ``iters`` messages through an MPI shared-memory window in a numba loop, each
message answered by the same protocol; a hop is half a round trip.  On a GPU LL128 sits between LL and Simple
because Simple pays a system-scope fence and a separate volatile tail per slice; on a CPU both cost next to
nothing, and the 32 cache lines LL128 moves for 8 bytes are what is left.
"""
from __future__ import annotations

import time

import numba
import numpy as np
from mpi4py import MPI

from collectives.device.compiled_common import fence

WIRE_WORDS = 256          # an LL128 wire slice: 16 lines of 16 words
BOX = 2 * WIRE_WORDS      # words per mailbox: the slice, then Simple's tail on a line of its own
TAIL = WIRE_WORDS + 16


@numba.njit(nogil=True, cache=True)
def _wait_word(box, at, want):
    while box[at] != want:
        fence()  # a fresh load each time round: nothing may be hoisted out of the spin


@numba.njit(nogil=True, cache=True)
def _ll(mine, theirs, k, sending):
    flag = np.uint64(k) << np.uint64(32)
    if sending:
        mine[0], mine[1] = np.uint64(7) | flag, np.uint64(0) | flag
        return np.uint64(0)
    while (theirs[0] >> np.uint64(32)) != np.uint64(k) or (theirs[1] >> np.uint64(32)) != np.uint64(k):
        fence()
    return theirs[0] & np.uint64(0xFFFFFFFF)


@numba.njit(nogil=True, cache=True)
def _ll128(mine, theirs, k, sending):
    if sending:
        for line in range(16):
            for w in range(15):
                mine[line * 16 + w] = np.uint64(k + w)
        fence()
        for line in range(16):
            mine[line * 16 + 15] = np.uint64(k)
        return np.uint64(0)
    for line in range(16):
        _wait_word(theirs, line * 16 + 15, np.uint64(k))
    fence()
    acc = np.uint64(0)
    for line in range(16):
        for w in range(15):
            acc += theirs[line * 16 + w]
    return acc


@numba.njit(nogil=True, cache=True)
def _simple(mine, theirs, k, sending):
    if sending:
        mine[0] = np.uint64(k)
        fence()
        mine[TAIL] = np.uint64(k)
        return np.uint64(0)
    _wait_word(theirs, TAIL, np.uint64(k))
    fence()
    return theirs[0]


@numba.njit(nogil=True, cache=True)
def _pingpong(words, me, proto, first, iters):
    """Rank 0 sends message k and waits for the answer k; rank 1 answers each.  Returns a checksum of what was
    read (so the reads are not optimised away)."""
    mine, theirs = words[me * BOX:(me + 1) * BOX], words[(1 - me) * BOX:(2 - me) * BOX]
    acc = np.uint64(0)
    for k in range(first, first + iters):
        for sending in ((True, False) if me == 0 else (False, True)):
            if proto == 0:
                acc += _ll(mine, theirs, k, sending)
            elif proto == 1:
                acc += _ll128(mine, theirs, k, sending)
            else:
                acc += _simple(mine, theirs, k, sending)
    return acc


PROTOS = ("LL", "LL128", "Simple")


def hop_times(world, iters: int = 20000, rounds: int = 5) -> dict:
    """Microseconds per hop of an 8-byte message in each protocol's layout, the median of ``rounds`` alternating
    rounds of ``iters`` round trips; on ranks 0 and 1 of ``world`` (the others only wait), which must share a
    node."""
    node = world.Split_type(MPI.COMM_TYPE_SHARED)  # the window must be shared memory
    win = None
    try:
        me = node.rank
        nbytes = 2 * BOX * 8 if me == 0 else 0
        win = MPI.Win.Allocate_shared(nbytes, 8, comm=node)
        buf, _ = win.Shared_query(0)
        words = np.ndarray(2 * BOX, np.uint64, buf)
        if me == 0:
            words[:] = 0
        node.Barrier()
        times: dict = {p: [] for p in PROTOS}
        first = 1
        for p in PROTOS:  # compiled, and the pages touched, before anything is timed
            node.Barrier()
            if me < 2:
                _pingpong(words, me, PROTOS.index(p), first, 100)
            first += 100
        for r in range(rounds):
            for p in (PROTOS if r % 2 == 0 else PROTOS[::-1]):
                node.Barrier()
                if me < 2:
                    t0 = time.perf_counter()
                    _pingpong(words, me, PROTOS.index(p), first, iters)
                    times[p].append((time.perf_counter() - t0) / iters / 2 * 1e6)
                first += iters
        node.Barrier()
        out = {p: float(np.median(t)) if t else 0.0 for p, t in times.items()}
        return node.bcast(out, root=0)
    finally:
        if win is not None:
            win.Free()
        node.Free()
