"""Memory ordering and waits on the GPU (NCCL ``src/device/op128.h``: ``ld_volatile_global``, ``st_relaxed_sys_global``,
``fence_acq_rel_sys``; ``src/device/primitives.h``'s ``barrier``; ``checkAbort`` in ``common.h``).

* ``load``: NCCL polls head, tail and LL lines with ``ld.volatile.global``.  numba has no volatile load, so we read
  with an atomic add of 0: it always goes to L2 (never a stale L1 copy), which is what the poll needs.  Deliberate
  difference: a read-modify-write costs more than a volatile load.
* ``publish``: ``fence.acq_rel.sys`` (``cuda.threadfence_system``) then the store (an atomic exchange), so the data
  of a step is visible to the peer before the counter that announces it.
* ``group_sync``: a barrier of one thread group.  NCCL uses named barriers (``bar.sync id, nthreads``) so that the
  two halves of ``runTreeSplit`` synchronise apart; numba has only ``syncthreads`` (the whole block), so we count
  arrivals with atomics and a generation word; a fence before arriving and after leaving makes it a
  release/acquire pair, so the data a group's poller saw announced is what its other threads then read.
* ``wait_ge``: a spin with a deadline.  Every spin also watches the abort word shared by all ranks of the launch;
  the first spin that runs out writes ``[1, rank, channel, step, peer, what, group]`` there and everyone returns.
"""
from __future__ import annotations

from .api import cuda

from .clock import SIMULATED, now_ns, pause

# abort[5]: what a timed-out wait waited for
WHAT_TAIL, WHAT_HEAD, WHAT_LL_FLAG = 0, 1, 2
WHAT_NAMES = {WHAT_TAIL: "tail", WHAT_HEAD: "head", WHAT_LL_FLAG: "LL flag"}
ABORT_WORDS = 8


if SIMULATED:
    # The simulator's atomics are a read and a write under a lock of its own process: an add of 0 writes the old
    # value back, and over shared memory it can undo a store that another rank's process made in between.  A
    # plain read there is a real load (Python caches nothing), and never writes.
    @cuda.jit(device=True)
    def load(arr, i):
        return arr[i]
else:
    @cuda.jit(device=True)
    def load(arr, i):
        return cuda.atomic.add(arr, i, 0)


@cuda.jit(device=True)
def publish(arr, i, value):
    cuda.threadfence_system()
    cuda.atomic.exch(arr, i, value)


@cuda.jit(device=True)
def aborted(abort):
    return load(abort, 0) != 0


@cuda.jit(device=True)
def set_abort(abort, rank, channel, step, peer, what, group):
    """The first failure wins; its details are written before the flag's readers act on them (they only exit)."""
    if cuda.atomic.cas(abort, 7, 0, 1) == 0:  # abort[7]: who claimed the report
        abort[1] = rank
        abort[2] = channel
        abort[3] = step
        abort[4] = peer
        abort[5] = what
        abort[6] = group
        cuda.threadfence_system()
        cuda.atomic.exch(abort, 0, 1)


@cuda.jit(device=True)
def timed_out(t0, timeout_ns):
    return now_ns() - t0 > timeout_ns


@cuda.jit(device=True)
def wait_ge(arr, i, target, abort, timeout_ns, rank, channel, step, peer, what, group):
    """Spin until ``arr[i] >= target``; False when the launch aborted (this wait's deadline, or anyone's)."""
    if load(arr, i) >= target:
        return True
    t0 = now_ns()
    while load(arr, i) < target:
        if aborted(abort):
            return False
        if timed_out(t0, timeout_ns):
            set_abort(abort, rank, channel, step, peer, what, group)
            return False
        pause()
    return True


@cuda.jit(device=True)
def group_sync(bars, rl, channel, group, nthreads, abort):
    """Barrier of the ``nthreads`` threads of one group; no deadline of its own (the group's peer waits have one),
    but it returns False as soon as the launch aborted."""
    if nthreads == 1:
        cuda.threadfence()
        return True
    cuda.threadfence()
    gen = load(bars, (rl, channel, group, 1))
    if cuda.atomic.add(bars, (rl, channel, group, 0), 1) == nthreads - 1:
        cuda.atomic.exch(bars, (rl, channel, group, 0), 0)
        cuda.threadfence()
        cuda.atomic.add(bars, (rl, channel, group, 1), 1)
        return True
    while load(bars, (rl, channel, group, 1)) == gen:
        if aborted(abort):
            return False
        pause()
    cuda.threadfence()  # acquire: the plain loads after the barrier (a FIFO slot) must not see stale L1 lines
    return True
