"""Memory ordering and waits on the GPU (NCCL ``src/device/op128.h``: ``ld_volatile_global``,
``st_relaxed_sys_global``, ``fence_acq_rel_sys``; ``src/device/primitives.h``: ``checkAbort`` and
``NCCL_SPINS_BEFORE_CHECK_ABORT``; ``src/device/prims_simple.h``: ``waitPeer``, ``postPeer``, ``barrier``).

NCCL's polling discipline, which these functions keep:

* **One thread polls per peer** (``waitPeer``'s ``RoleWaitRecv`` / ``RoleWaitSend``), with a volatile load
  (``load``, inline PTX ``ld.volatile.global``: a relaxed access at system scope, so a store by another GPU or by
  the host is seen); no atomic read-modify-write in any poll.
* **The others wait at a named barrier** (``group_sync``: ``barrier.red.or`` with the group's own id, NCCL's
  ``15 - group``), so that the two halves of ``runTreeSplit`` synchronise apart.  The barrier's OR carries the
  pollers' verdict: one failed wait stops the whole group at the same point.
* **The abort word is read by the polling thread only, every ``SPINS`` spins** (``checkAbort``: 10,000 on a GPU),
  with the deadline read at the same time; the first wait whose deadline passes writes ``[1, rank, channel,
  step, peer, what, group]`` there (its only atomic, after the spin loop has ended) and every poller leaves.
* **Publication** (``publish``): ``fence.acq_rel.sys`` then ``st.relaxed.sys``: the step's data, written by every
  thread of the group before the barrier, is visible to the peer (another GPU, or the host) before the counter.
* **Acquire after a poll** (``wait_ge``): the poller that saw a new tail or head issues ``fence.acq_rel.sys``
  before the barrier, so the plain loads of the FIFO that the group's threads make after it see the peer's data,
  never a stale L1 line.  Deliberate difference: NCCL skips that fence and loads the FIFO with volatile loads
  instead (``loadStepValue``'s comment); numba has no volatile load of an arbitrary element type.

Under numba's simulator the same functions are plain Python: a read is a real load (Python caches nothing), a
store is a store, and the group barrier counts arrivals in ``bars`` (the simulator has no named barriers).  Its
atomics are a read and a write under a lock of its own process, so over shared memory an atomic used as a load
would write a stale value back over another rank's store: the simulator never uses one as a load.
"""
from __future__ import annotations

from .numba_cuda import cuda

from .clock import SIMULATED, now_ns, pause

# abort[5]: what a timed-out wait waited for
WHAT_TAIL, WHAT_HEAD, WHAT_LL_FLAG, WHAT_LL128_FLAG = 0, 1, 2, 3
WHAT_NAMES = {WHAT_TAIL: "tail", WHAT_HEAD: "head", WHAT_LL_FLAG: "LL flag", WHAT_LL128_FLAG: "LL128 flag"}
ABORT_WORDS = 8
# NCCL_SPINS_BEFORE_CHECK_ABORT; the simulator checks every spin (a spin there is a Python loop turn, and the
# deadline test must end within its second)
SPINS = 1 if SIMULATED else 10000
# the named barrier of thread group g (NCCL: 15 - group; barrier 0 is __syncthreads)
BARRIER_BASE = 15

if SIMULATED:
    @cuda.jit(device=True)
    def load(arr, i):
        return arr[i]

    @cuda.jit(device=True)
    def store(arr, i, value):
        arr[i] = value

    @cuda.jit(device=True)
    def load2(arr, i):
        """Words ``(c, slot, w)`` and ``(c, slot, w + 1)`` of a FIFO (the GPU reads both in one access)."""
        c, s, w = i
        return arr[c, s, w], arr[c, s, w + 1]

    @cuda.jit(device=True)
    def store2(arr, i, lo, hi):
        c, s, w = i
        arr[c, s, w] = lo
        arr[c, s, w + 1] = hi

    @cuda.jit(device=True)
    def fence_sys():
        cuda.threadfence_system()

    @cuda.jit(device=True)
    def store_relaxed(arr, i, value):
        arr[i] = value

    @cuda.jit(device=True)
    def group_sync(bars, rl, channel, group, nthreads, failed, abort):
        """Counted barrier of the group's ``nthreads`` simulated threads (``bars[rl, channel, group]``: arrivals,
        generation); True when the launch has aborted (every failed wait has written the abort word)."""
        if nthreads > 1:
            gen = bars[rl, channel, group, 1]
            if cuda.atomic.add(bars, (rl, channel, group, 0), 1) == nthreads - 1:
                bars[rl, channel, group, 0] = 0
                bars[rl, channel, group, 1] = gen + 1
            else:
                while bars[rl, channel, group, 1] == gen and abort[0] == 0:
                    pause()
        return failed or abort[0] != 0
else:  # pragma: no cover - needs a GPU
    from . import ptx  # through the module, so that the kernels' disk-cache key is the same in every process

    @cuda.jit(device=True)
    def load(arr, i):
        return ptx.ld_volatile(arr, i)

    @cuda.jit(device=True)
    def store(arr, i, value):
        ptx.st_volatile(arr, i, value)

    @cuda.jit(device=True)
    def load2(arr, i):
        return ptx.ld_volatile2(arr, i)

    @cuda.jit(device=True)
    def store2(arr, i, lo, hi):
        ptx.st_volatile2(arr, i, lo, hi)

    @cuda.jit(device=True)
    def fence_sys():
        ptx.fence_acq_rel_sys()

    @cuda.jit(device=True)
    def store_relaxed(arr, i, value):
        ptx.st_relaxed_sys(arr, i, value)

    @cuda.jit(device=True)
    def group_sync(bars, rl, channel, group, nthreads, failed, abort):
        """The group's named barrier (``nthreads`` a multiple of 32); True on every thread when any failed."""
        return ptx.bar_red_or(BARRIER_BASE - group, nthreads, failed)


@cuda.jit(device=True)
def publish(arr, i, value):
    """``postPeer``'s publication (``fence_acq_rel_sys``, then ``st_relaxed_sys_global``): what this thread wrote
    before is visible at system scope before ``arr[i] = value`` is."""
    fence_sys()
    store_relaxed(arr, i, value)


@cuda.jit(device=True)
def aborted(abort):
    return load(abort, 0) != 0


@cuda.jit(device=True)
def set_abort(abort, rank, channel, step, peer, what, group):
    """The first failure wins (``abort[7]`` claims the record; the one atomic of the protocol, after a deadline
    passed); its details are stored before the flag that the other pollers read."""
    if cuda.atomic.cas(abort, 7, 0, 1) == 0:
        abort[1] = rank
        abort[2] = channel
        abort[3] = step
        abort[4] = peer
        abort[5] = what
        abort[6] = group
        publish(abort, 0, 1)


@cuda.jit(device=True)
def spin_check(abort, t0, timeout_ns):
    """``checkAbort`` every ``SPINS`` spins: 1 if the launch aborted, 2 if this wait's deadline passed, else 0."""
    if aborted(abort):
        return 1
    if now_ns() - t0 > timeout_ns:
        return 2
    return 0


@cuda.jit(device=True)
def check_abort(spins, abort, t0, timeout_ns):
    """``checkAbort``: count one spin of a poll; every ``SPINS`` spins, read the abort word and the deadline
    (``spin_check``).  Returns (the new spin count, the verdict: 0 go on, 1 the launch aborted, 2 the deadline
    passed)."""
    spins += 1
    verdict = 0
    if spins >= SPINS:
        spins = 0
        verdict = spin_check(abort, t0, timeout_ns)
    return spins, verdict


@cuda.jit(device=True)
def wait_ge(arr, i, target, abort, timeout_ns, rank, channel, step, peer, what, group):
    """The poll of one peer's head or tail: spin until ``arr[i] >= target`` (then acquire); False when the launch
    aborted (this wait's deadline, or anyone's)."""
    if load(arr, i) >= target:
        fence_sys()
        return True
    t0 = now_ns()
    spins = 0
    verdict = 0
    while load(arr, i) < target:
        spins, verdict = check_abort(spins, abort, t0, timeout_ns)
        if verdict != 0:
            break
        pause()
    if verdict == 2:
        set_abort(abort, rank, channel, step, peer, what, group)
    if verdict != 0:
        return False
    fence_sys()
    return True
