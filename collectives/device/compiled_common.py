"""What the compiled ring kernels share (``ll_compiled.run_ops`` for LL, ``simple_compiled.run_ops`` for Simple):
the control array's layout, raw memory access, the reduction ``fn``, and the waits of a blocked call.

A compiled call reads everything from one int64 control array (``ctl``): a header of parameters, then one row per
channel with the addresses of its FIFOs, head, tail, sleep marks, doorbells and step counters, and where the
channel stands (which recorded call, which slice or line, what it waits for).  The kernels map addresses with
``numba.carray(_ptr(addr), ...)``.  The waits mirror ``common.Kernel.run``'s policy for oversubscribed ranks
(yield, then mark the line and sleep on the futex word, bounded), so that a compiled call waits as the readable
path does.  NCCL has no counterpart: its kernels are compiled to begin with (see ``ll_compiled``'s docstring).
"""
from __future__ import annotations

import numba
import numpy as np
from numba.extending import intrinsic

from collectives.misc import futex

from . import kernel_cache

kernel_cache.install()  # before the first cached function: its stamp covers every file the kernels are built from

# Columns of one recorded call.
REC, SND, SRC, DST, NELEM, FROM_OUT, PRIM = range(7)
# The header.  SIG takes 6 words: [opCount + 1, function, count, datatype, op, root]; SLEEPS and YIELDS: with more
# ranks than cores, the futex sleeps before returning and the yields before one; SPC/SPS: Simple's slices per
# chunk and steps per slice; LL128: the LL kernel runs LL128's lines; MOVES: rounds in which something moved.
(STEP_BYTES, FLAG_MOD, CLEAN_MASK, OPCODE, MAX_IDLE, IS_FLOAT, NCH, MY_DESC, PROG, CANON, SIG) = range(11)
DESC_ROWS, DESC_COLS = SIG + 6, SIG + 7
SLEEPS, YIELDS, SPC, SPS, LL128, MOVES = (DESC_COLS + k for k in range(1, 7))
HEADER = 24
# One row per thread group: a ring's channel, or one of a tree channel's groups (``runTreeSplit``: the reduce and
# the broadcast, or the root's one).  First where it stands: the LL staging buffers, its recorded calls [FIRST, END)
# and PC among them, the line or slice it is at, whether its peers' status pages were checked, what it waits for
# (WAIT, WSTEP, on which peer: WPEER), LL's credit, and how many peers it receives from and sends to (NCCL's Fan:
# FanSymmetric<1> on a ring, FanAsymmetric<3, 1> and <1, 3> on a tree).
(RSTAGE, SSTAGE, FIRST, END, PC, LINES, CHECKED, WAIT, WSTEP, CREDIT, SLICE, NRECV, NSEND, WPEER) = range(14)
MAX_PEERS = 3  # NCCL_MAX_TREE_ARITY
# Then MAX_PEERS receive blocks of RB words: the connection's FIFO, its head (ours to write), its tail (the
# sender's), the sender's sleep mark on head and ours on tail, our doorbell, its step word, the sender's status page
# (0: a remote peer), the step it is at, and (Simple, registered buffers on a NET receive) its connFifo's address.
R0, RB = 14, 10
(RWORDS, RHEAD, RTAIL, R_HEADSLEEP, R_TAILSLEEP, R_DOORBELL, RSTEP_W, PDESC, RSTEP, RREG) = range(R0, R0 + RB)
# Then MAX_PEERS send blocks of SB words: the FIFO, the receiver's head, our tail, the receiver's sleep mark on
# tail, ours on head, the receiver's doorbell, the step word, connFifo's address for a proxy (0: none), the step,
# and (Simple) registered buffers on a NET send (1).
S0, SB = R0 + MAX_PEERS * RB, 10
(SWORDS, SHEAD, STAIL, S_TAILSLEEP, S_HEADSLEEP, S_DOORBELL, SSTEP_W, FIFO, SSTEP, SREG) = range(S0, S0 + SB)
COLS = S0 + MAX_PEERS * SB
WAIT_HEAD, WAIT_FLAG, WAIT_MISMATCH, WAIT_TAIL = 1, 2, 3, 4
DONE, BLOCKED, MISMATCH = 0, 1, 2
PRIMS = ["send", "send_from_output", "copy_send", "recv", "recv_reduce_send", "recv_reduce_copy",
         "recv_reduce_copy_send", "recv_copy_send"]
# libc's syscall(2), resolved by name when numba links (a ctypes pointer would stop numba caching the kernel).
_syscall = numba.types.ExternalFunction("syscall", numba.int64(*[numba.int64] * 7))
_sched_yield = numba.types.ExternalFunction("sched_yield", numba.int32())
_SYS_FUTEX = futex.SYS_FUTEX if futex.SYS_FUTEX is not None else -1  # numba wants an int constant


@intrinsic
def ptr(typingctx, addr):
    """An int64 address as a pointer, for ``numba.carray``."""
    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(numba.types.voidptr))
    return numba.types.voidptr(numba.types.int64), codegen


@intrinsic
def fence(typingctx):
    """A full memory fence (x86 ``mfence``), which the compiler does not move stores or loads across either.
    Sleeping needs it on both sides (Dekker): the poster stores its flag, tail or head then loads the sleep mark;
    the sleeper stores the mark (``Kernel._arm``) then loads the flags again.  Without it x86 may let each load
    pass its own store, both miss, and the sleeper waits out its timeout.  Simple also needs it between a slice's
    data and its tail (and between seeing a tail and reading the data): x86 keeps those in order, the compiler
    need not."""
    def codegen(context, builder, signature, args):
        builder.fence("seq_cst")
        return context.get_dummy_value()
    return numba.types.none(), codegen


@numba.njit(nogil=True, cache=True)
def wake(addr):
    _syscall(_SYS_FUTEX, addr, futex.FUTEX_WAKE, futex.WAKE_ALL, 0, 0, 0)


@numba.njit(nogil=True, cache=True)
def u32(addr):
    """The 32-bit word at ``addr`` (sleep marks, doorbells), as a one-element array."""
    return numba.carray(ptr(addr), 1, np.uint32)


@numba.njit(nogil=True, cache=True)
def i64(addr):
    return numba.carray(ptr(addr), 1, np.int64)


@numba.njit(nogil=True, cache=True)
def u64(addr):
    return numba.carray(ptr(addr), 1, np.uint64)


@numba.njit(nogil=True, cache=True)
def row(ctl, c):
    return ctl[HEADER + COLS * c:HEADER + COLS * (c + 1)]


@numba.njit(nogil=True, cache=True)
def publish(ctl, start_sig):
    """Publish this rank's call on its status page before any data moves (``health``'s signature table)."""
    ctl[SIG:SIG + 6] = start_sig
    rows, cols = ctl[DESC_ROWS], ctl[DESC_COLS]
    desc = numba.carray(ptr(ctl[MY_DESC]), rows * cols, np.int64)
    at = (start_sig[0] - 1) % rows * cols
    for k in range(1, 6):
        desc[at + k] = start_sig[k]
    desc[at] = start_sig[0]


@numba.njit(nogil=True, cache=True)
def begin(ctl, start_sig, chunk_steps):
    """A call starts: publish it, take its op from the signature, and put each channel at its first recorded call
    with its steps loaded from the connections' counters, rounded up to ``chunk_steps`` (the primitives'
    constructor: Simple's ``roundUp``, 1 for LL and LL128)."""
    publish(ctl, start_sig)
    ctl[OPCODE], ctl[MOVES] = start_sig[4], 0  # the signature's op is ncclRedOp_t's code (reduce_copy.OPS)
    for c in range(ctl[NCH]):
        st = row(ctl, c)
        st[PC], st[LINES], st[SLICE], st[WAIT], st[CREDIT], st[WPEER] = st[FIRST], 0, 0, 0, 0, 0
        st[CHECKED] = 1
        for b in range(st[NRECV]):
            at = b * RB
            if st[PDESC + at] != 0:  # a local peer's page to compare before its first data (remote: none)
                st[CHECKED] = 0
            st[RSTEP + at] = -(-i64(st[RSTEP_W + at])[0] // chunk_steps) * chunk_steps
        for b in range(st[NSEND]):
            at = b * SB
            st[SSTEP + at] = -(-i64(st[SSTEP_W + at])[0] // chunk_steps) * chunk_steps


@numba.njit(nogil=True, cache=True)
def peer_runs_same_call(ctl, st):
    """Before using the local peers' first data of this call: does each one's status page show the same call?
    False names the first that does not in ``WPEER``."""
    rows, cols = ctl[DESC_ROWS], ctl[DESC_COLS]
    at = (ctl[SIG] - 1) % rows * cols
    for b in range(st[NRECV]):
        if st[PDESC + b * RB] == 0:
            continue
        pdesc = numba.carray(ptr(st[PDESC + b * RB]), rows * cols, np.int64)
        for k in range(6):
            if pdesc[at + k] != ctl[SIG + k]:
                st[WPEER] = b
                return False
    return True


@numba.njit(nogil=True, cache=True)
def next_blocked(ctl, nch):
    """The first channel not done (what a blocked call sleeps on)."""
    for c in range(nch):
        st = row(ctl, c)
        if st[PC] < st[END]:
            return c
    return 0


@numba.njit(nogil=True, cache=True)
def _wait_words(ctl, c):
    """(the word row ``c`` sleeps on, its sleep mark): the head of the send peer it waits on for credit, the tail
    of the receive peer for Simple data, the reader's doorbell for LL flags."""
    st = row(ctl, c)
    if st[WAIT] == WAIT_HEAD:
        return st[SHEAD + st[WPEER] * SB], st[S_HEADSLEEP + st[WPEER] * SB]
    if st[WAIT] == WAIT_TAIL:
        return st[RTAIL + st[WPEER] * RB], st[R_TAILSLEEP + st[WPEER] * RB]
    return st[R_DOORBELL], st[R_TAILSLEEP]


@numba.njit(nogil=True, cache=True)
def _arm(ctl, c, w):
    """``Kernel._arm``: remember the word's value and the mark, then mark its line sleeping; the caller looks
    once more."""
    word, mark = _wait_words(ctl, c)
    w[ARMED], w[ARMED_VALUE], w[ARMED_WORD], w[ARMED_MARK] = c, u32(word)[0], word, mark
    u32(mark)[0] = np.uint32(1)
    fence()


@numba.njit(nogil=True, cache=True)
def unarm(w):
    """Take back the mark that was set, not the one the channel's wait names now: after a move it may wait on
    the other side (tail, then head), and clearing that one left the first set (CI saw such a stale mark)."""
    u32(w[ARMED_MARK])[0] = np.uint32(0)
    w[ARMED] = -1


@numba.njit(nogil=True, cache=True)
def _sleep(w):
    """``futex.wait``: block while the armed word still holds its value, for at most ``futex.SLEEP_NS``."""
    ts = np.empty(2, np.int64)
    ts[0], ts[1] = 0, futex.SLEEP_NS
    _syscall(_SYS_FUTEX, w[ARMED_WORD], futex.FUTEX_WAIT, w[ARMED_VALUE], ts.ctypes.data, 0, 0)


# The state of a blocked call's waiting, in a small int64 array: idle rounds, yields, sleeps, the armed channel
# (-1: none), the word it sleeps on, that word's value when armed, and the address of the mark it set.
IDLE, YIELDED, SLEPT, ARMED, ARMED_VALUE, ARMED_WORD, ARMED_MARK = range(7)


@numba.njit(nogil=True, cache=True)
def new_wait():
    w = np.zeros(7, np.int64)
    w[ARMED] = -1
    return w


@numba.njit(nogil=True, cache=True)
def moved(ctl, w):
    """A channel moved: start counting again, and take back a sleep mark (a stale one costs the poster a futex
    wake on every post)."""
    ctl[MOVES] += 1
    w[IDLE], w[YIELDED], w[SLEPT] = 0, 0, 0
    if w[ARMED] >= 0:
        unarm(w)


@numba.njit(nogil=True, cache=True)
def wait_on(ctl, st, kind, step, peer=0):
    """Record what a row waits for, on which of its peers (a block index); a change counts as a move (``MOVES``),
    so that the wait the kernel describes and sleeps on is never a stale one (credit taken, then waiting for the
    peer's data)."""
    if st[WAIT] != kind or st[WSTEP] != step or st[WPEER] != peer:
        ctl[MOVES] += 1
        st[WAIT], st[WSTEP], st[WPEER] = kind, step, peer


@numba.njit(nogil=True, cache=True)
def done(ctl, w):
    if w[ARMED] >= 0:
        unarm(w)


CONTINUE = -1


@numba.njit(nogil=True, cache=True)
def save_steps(st):
    """The primitives' destructor: a row that is done saves its step counters for the next collective."""
    for b in range(st[NRECV]):
        i64(st[RSTEP_W + b * RB])[0] = st[RSTEP + b * RB]
    for b in range(st[NSEND]):
        i64(st[SSTEP_W + b * SB])[0] = st[SSTEP + b * SB]


@numba.njit(nogil=True, cache=True)
def end_round(ctl, nch, w, remaining, progressed):
    """After a round over the channels: DONE, BLOCKED (``blocked``), or CONTINUE with another round."""
    if remaining == 0:
        done(ctl, w)
        return DONE
    if progressed:
        moved(ctl, w)
    elif blocked(ctl, nch, w):
        return BLOCKED
    return CONTINUE


@numba.njit(nogil=True, cache=True)
def blocked(ctl, nch, w):
    """A round in which nothing moved: True when the call should return BLOCKED to ``Kernel.run``.  After
    ``MAX_IDLE`` idle rounds, with more ranks than cores (``SLEEPS`` > 0), it waits here rather than in Python (a
    round trip through ``Kernel.run`` per try costs more than a hop): yield the core ``YIELDS`` times, then sleep
    on what the first blocked channel waits for, as ``Kernel.run`` would (mark, look once more, futex wait,
    bounded), ``SLEEPS`` times before returning."""
    w[IDLE] += 1
    if w[IDLE] < ctl[MAX_IDLE]:
        return False
    if ctl[SLEEPS] == 0 or (w[ARMED] < 0 and w[SLEPT] >= ctl[SLEEPS]):
        return True
    if w[ARMED] >= 0:
        _sleep(w)
        unarm(w)
        w[SLEPT] += 1
    elif w[YIELDED] < ctl[YIELDS]:
        w[YIELDED] += 1
        _sched_yield()
    else:
        _arm(ctl, next_blocked(ctl, nch), w)
    return False


# The loops index views from an unsigned counter: indexing the whole buffers at ``offset + e`` made numba check
# each signed index for wraparound, which kept the compiler from vectorising (9x slower at 4 MiB here).

@numba.njit(nogil=True, cache=True)
def copy(dst, d0, src, s0, n):
    dv, sv = dst[d0:d0 + n], src[s0:s0 + n]
    for e in range(np.uint64(n)):
        dv[e] = sv[e]


@numba.njit(nogil=True, cache=True)
def reduce(dst, d0, a, a0, b, b0, n, opcode, is_float, canon):
    """``dst = fn(a, b)`` over ``n`` elements; sum and product get loops of their own, which the compiler
    vectorises (the same single rounding per element, so the same bits as ``fn``)."""
    dv, av, bv = dst[d0:d0 + n], a[a0:a0 + n], b[b0:b0 + n]
    if opcode == 0:
        for e in range(np.uint64(n)):
            dv[e] = av[e] + bv[e]
    elif opcode == 1:
        for e in range(np.uint64(n)):
            dv[e] = av[e] * bv[e]
    else:
        for e in range(np.uint64(n)):
            dv[e] = fn(av[e], bv[e], opcode, is_float, canon)


@numba.njit(nogil=True, cache=True)
def reduce_slice(dst, d0, inp, out, rbuf, s0, r0, recv, has_src, from_out, n, opcode, is_float, canon):
    """``reduceCopy`` of ``n`` elements into ``dst``: fn(local, peer) with the local source at ``s0`` of ``inp`` (of
    ``out`` when ``from_out``: ``directSendFromOutput``) and the peer's at ``r0`` of ``rbuf``, or a copy of either."""
    if has_src and recv:
        reduce(dst, d0, inp, s0, rbuf, r0, n, opcode, is_float, canon)
    elif has_src and from_out:
        copy(dst, d0, out, s0, n)
    elif has_src:
        copy(dst, d0, inp, s0, n)
    else:
        copy(dst, d0, rbuf, r0, n)


@numba.njit(nogil=True, cache=True)
def fn(a, b, opcode, is_float, canon):
    """``fn(local, peer)`` exactly as ``reduce_copy`` computes it (fmin/fmax for floats, canonical NaN)."""
    if opcode == 0:
        return a + b
    if opcode == 1:
        return a * b
    if is_float:
        if a != a and b != b:
            return canon
        if a != a:
            return b
        if b != b:
            return a
        if a == 0 and b == 0:  # +0 against -0: by sign in either order (reduce_copy.signed_zero)
            return a + b if opcode == 2 else -(-a - b)
    if opcode == 2:
        return a if a > b else b
    return a if a < b else b
