"""The Simple protocol's compiled kernel (NCCL ``src/device/prims_simple.h``: ``genericOp`` with ``waitPeer``,
``reduceCopy`` and ``postPeer``, per slice), run by ``compiled.py`` over the primitive calls it recorded from our
``run_ring``.

For each recorded call ``run_ops`` does what ``PrimitivesSimple.generic_op`` does, slice by slice
(``SlicePerChunk`` slices of ``StepPerSlice`` steps, ``sliceSize = max(divUp(nelem, 16 * SlicePerChunk) * 16,
stepSize * StepPerSlice / 32)``): the receiver waits for ``tail >= step + StepPerSlice`` and the sender for credit,
``head + NCCL_STEPS >= step + StepPerSlice``; a proxied sender writes the slice's size into ``connFifo``; the slice
is reduced straight between the user buffers and the FIFO slots (``fn(local, peer)``, then stored to the output
and the send slot); then ``step += StepPerSlice``, the receiver stores it into ``head`` and the sender into the
peer's ``tail``, after the data.  Empty trailing slices still wait and post.  Each connection's step starts
rounded up to ``SlicePerChunk * StepPerSlice``, and the receiver returns the skipped credit at once.  With
registered buffers on a NET peer (``NetRegMode``: ``ctl`` row's RREG/SREG, see ``prims_simple``'s docstring) the
peer's slice is read from the output and what goes to it is left there for the proxy.  A row may receive from and
send to several peers (a tree's thread groups, NCCL's ``FanAsymmetric<3, 1>`` and ``<1, 3>``): it waits for every
receive peer's tail and every send peer's credit, reduces ``fn`` over [local input, peer 0, 1, 2] into the first
destination (the output, else send peer 0's slot) and copies that to the other send slots, as ``reduceCopy`` does,
and each connection keeps its own step.  Same memory, counters and summation order as the readable path, so results
are bitwise its results (``tests/test_simple_compiled.py``, ``tests/test_net_reg.py``, ``tests/test_compiled.py``'s
trees).
"""
from __future__ import annotations

import numba
import numpy as np

from collectives.include.device import NCCL_STEPS

from .compiled_common import (CANON, CHECKED, CONTINUE, DST, END, FIFO, FROM_OUT, IS_FLOAT, MISMATCH, NCH, NELEM,
                              NRECV, NSEND, OPCODE, PC, PROG, RB, REC, RHEAD, RREG, RSTEP, RTAIL, RWORDS, R_HEADSLEEP,
                              SB, SHEAD, SLICE, SND, SPC, SPS, SREG, SRC, SSTEP, STAIL, STEP_BYTES, SWORDS,
                              S_TAILSLEEP, WAIT, WAIT_HEAD, WAIT_MISMATCH, WAIT_TAIL, begin, copy, end_round, fence,
                              new_wait, peer_runs_same_call, ptr, reduce, reduce_slice, row, save_steps, u32, u64,
                              wait_on, wake)


@numba.njit(nogil=True, cache=True)
def _post_head(st, b):
    """``postPeer`` of a receiver on receive peer ``b``: free the slots up to its step, wake the sender if it
    sleeps on head."""
    at = b * RB
    u64(st[RHEAD + at])[0] = np.uint64(st[RSTEP + at])
    fence()
    if u32(st[R_HEADSLEEP + at])[0]:
        wake(st[RHEAD + at])


@numba.njit(nogil=True, cache=True)
def _post_tails(st, nsend, sps):
    """``postPeer`` of a sender: after the data (the fence), each send peer's tail moves on; then wake the ones
    that sleep on it."""
    fence()
    for b in range(nsend):
        at = b * SB
        st[SSTEP + at] += sps
        u64(st[STAIL + at])[0] = np.uint64(st[SSTEP + at])
    fence()
    for b in range(nsend):
        if u32(st[S_TAILSLEEP + b * SB])[0]:
            wake(st[STAIL + b * SB])


@numba.njit(nogil=True, cache=True)
def _peers_ready(ctl, st, recv, send, nrecv, nsend, sps):
    """``waitPeer``: every receive peer has filled this slice (tail) and every send peer has room for it (head);
    False records the first that has not (``wait_on``)."""
    if recv:
        for b in range(nrecv):
            at = b * RB
            if u64(st[RTAIL + at])[0] < np.uint64(st[RSTEP + at] + sps):
                wait_on(ctl, st, WAIT_TAIL, st[RSTEP + at], b)
                return False
    if send:
        for b in range(nsend):
            at = b * SB
            if u64(st[SHEAD + at])[0] + np.uint64(NCCL_STEPS) < np.uint64(st[SSTEP + at] + sps):
                wait_on(ctl, st, WAIT_HEAD, st[SSTEP + at], b)
                return False
    return True


@numba.njit(nogil=True, cache=True)
def _reduce_from_peer(dst, d0, inp, out, rbuf, s0, r0, peer_in_out, at, recv, has_src, from_out, n, opcode,
                      is_float, canon):
    """``reduce_slice`` with the peer's slice from its FIFO slot at ``r0`` of ``rbuf``, or (``peer_in_out``,
    NetRegMode) from the output at ``at``, where the proxy received it.  Two calls rather than one array chosen
    at run time: the slot and the output then keep each their own (contiguous) type."""
    if peer_in_out:
        reduce_slice(dst, d0, inp, out, out, s0, at, recv, has_src, from_out, n, opcode, is_float, canon)
    else:
        reduce_slice(dst, d0, inp, out, rbuf, s0, r0, recv, has_src, from_out, n, opcode, is_float, canon)


@numba.njit(nogil=True, cache=True)
def _fan_into(dst, d0, st, inp, out, src, from_out, nrecv, n, step_elems, opcode, is_float, canon):
    """The first destination of a row with several peers: ``fn`` over [the local source (if any), receive peer 0,
    1, 2] in that order, as ``reduceCopy``'s sources."""
    r0 = (st[RSTEP] % NCCL_STEPS) * step_elems
    rbuf = numba.carray(ptr(st[RWORDS]), NCCL_STEPS * step_elems, dst.dtype)
    reduce_slice(dst, d0, inp, out, rbuf, src, r0, nrecv > 0, src >= 0, from_out, n, opcode, is_float, canon)
    for b in range(1, nrecv):
        at = b * RB
        peer = numba.carray(ptr(st[RWORDS + at]), NCCL_STEPS * step_elems, dst.dtype)
        reduce(dst, d0, dst, d0, peer, (st[RSTEP + at] % NCCL_STEPS) * step_elems, n, opcode, is_float, canon)


@numba.njit(nogil=True, cache=True)
def _fan_slice(st, inp, out, src, dst, from_out, nrecv, nsend, n, step_elems, opcode, is_float, canon):
    """``reduceCopy`` of one slice for a row with several peers (no registered buffers on a tree): into the
    output if the call has one, else into send peer 0's slot, then copied to every other send peer's slot."""
    if dst >= 0:
        _fan_into(out, dst, st, inp, out, src, from_out, nrecv, n, step_elems, opcode, is_float, canon)
        for b in range(nsend):
            slot = numba.carray(ptr(st[SWORDS + b * SB]), NCCL_STEPS * step_elems, out.dtype)
            copy(slot, (st[SSTEP + b * SB] % NCCL_STEPS) * step_elems, out, dst, n)
    else:
        slot0 = numba.carray(ptr(st[SWORDS]), NCCL_STEPS * step_elems, out.dtype)
        s0 = (st[SSTEP] % NCCL_STEPS) * step_elems
        _fan_into(slot0, s0, st, inp, out, src, from_out, nrecv, n, step_elems, opcode, is_float, canon)
        for b in range(1, nsend):
            slot = numba.carray(ptr(st[SWORDS + b * SB]), NCCL_STEPS * step_elems, out.dtype)
            copy(slot, (st[SSTEP + b * SB] % NCCL_STEPS) * step_elems, slot0, s0, n)


@numba.njit(nogil=True, cache=True)
def run_ops(ctl, inp, out, start_sig):
    """Execute every row's recorded calls, round-robin, until all are done (DONE), none has moved for
    ``MAX_IDLE`` rounds (BLOCKED: each row says what it waits for), or a peer runs another call (MISMATCH).
    ``start_sig`` (empty when resuming): the call's signature; publish it and load the step counters first."""
    spc, sps = ctl[SPC], ctl[SPS]
    if len(start_sig) > 0:
        begin(ctl, start_sig, spc * sps)  # published before any data moves; steps rounded up to a chunk
    step_bytes, opcode, is_float, nch = ctl[STEP_BYTES], ctl[OPCODE], ctl[IS_FLOAT], ctl[NCH]
    esize = out.itemsize
    step_elems = step_bytes // esize
    min_slice = step_elems * sps // 32
    canon = numba.carray(ptr(ctl[CANON:].ctypes.data), 1, out.dtype)[0]
    prog = numba.carray(ptr(ctl[PROG]), (row(ctl, nch - 1)[END], 7), np.int64)
    if len(start_sig) > 0:
        for c in range(nch):
            st = row(ctl, c)
            if st[RREG]:  # NetRegMode: the call has started, the proxy may write into the user's buffer
                numba.carray(ptr(st[RREG]), NCCL_STEPS, np.int64)[st[RSTEP] % NCCL_STEPS] = 0
            for b in range(st[NRECV]):
                _post_head(st, b)  # the credit of the steps skipped
    fence()
    w = new_wait()
    while True:
        remaining, progressed = 0, False
        for c in range(nch):
            st = row(ctl, c)
            if st[PC] >= st[END]:
                continue
            nrecv, nsend = st[NRECV], st[NSEND]
            fan = nrecv > 1 or nsend > 1  # a tree group with several peers on one side
            rbuf = numba.carray(ptr(st[RWORDS]), NCCL_STEPS * step_elems, out.dtype)
            sbuf = numba.carray(ptr(st[SWORDS]), NCCL_STEPS * step_elems, out.dtype)
            rreg, sreg = st[RREG] != 0, st[SREG] != 0
            while st[PC] < st[END]:
                op = prog[st[PC]]
                recv, send, src, dst, nelem, from_out = op[REC], op[SND], op[SRC], op[DST], op[NELEM], op[FROM_OUT]
                slice_size = max(-(-nelem // (16 * spc)) * 16, min_slice)
                while st[SLICE] < spc:
                    offset = st[SLICE] * slice_size
                    real = max(0, min(slice_size, nelem - offset))
                    if not _peers_ready(ctl, st, recv, send, nrecv, nsend, sps):
                        break
                    if recv and st[CHECKED] == 0:  # the peers' first data: are they running the same call?
                        if not peer_runs_same_call(ctl, st):
                            st[WAIT] = WAIT_MISMATCH
                            return MISMATCH
                        st[CHECKED] = 1
                    if send:
                        for b in range(nsend):  # a proxy sends this slice: tell it the size
                            if st[FIFO + b * SB]:
                                numba.carray(ptr(st[FIFO + b * SB]), NCCL_STEPS, np.int64)[
                                    st[SSTEP + b * SB] % NCCL_STEPS] = real * esize
                    fence()  # the tails seen before the slice is read
                    if real > 0 and fan:
                        _fan_slice(st, inp, out, src + offset if src >= 0 else -1, dst + offset if dst >= 0 else -1,
                                   from_out, nrecv if recv else 0, nsend if send else 0, real, step_elems, opcode,
                                   is_float, canon)
                    elif real > 0:  # reduceCopy: to the output if any, else to the send slot; then the other
                        r0 = (st[RSTEP] % NCCL_STEPS) * step_elems
                        s0 = (st[SSTEP] % NCCL_STEPS) * step_elems
                        # NetRegMode: the peer's slice is in the output at the chunk's offset, and a registered
                        # send leaves its slice there (or in the input) for the proxy; no slot is touched
                        at = (src if src >= 0 else dst) + offset
                        peer_in_out = recv and rreg
                        in_output = peer_in_out and src < 0  # nothing to reduce: it already sits at ``at``
                        to_slot = send and not sreg
                        if (dst >= 0 or (recv and send and sreg)) and not in_output:
                            d = dst + offset if dst >= 0 else at
                            _reduce_from_peer(out, d, inp, out, rbuf, src + offset, r0, peer_in_out, at, recv,
                                              src >= 0, from_out, real, opcode, is_float, canon)
                            if to_slot:
                                copy(sbuf, s0, out, d, real)
                        elif to_slot:
                            _reduce_from_peer(sbuf, s0, inp, out, rbuf, src + offset, r0, peer_in_out, at, recv,
                                              src >= 0, from_out, real, opcode, is_float, canon)
                    if recv:
                        for b in range(nrecv):
                            st[RSTEP + b * RB] += sps
                            _post_head(st, b)
                    if send:  # postPeer: the data, then the peers' tails
                        _post_tails(st, nsend, sps)
                    st[SLICE] += 1
                    progressed = True
                if st[SLICE] < spc:
                    break
                st[PC] += 1
                st[SLICE] = 0
            if st[PC] < st[END]:
                remaining += 1
            else:
                save_steps(st)
        status = end_round(ctl, nch, w, remaining, progressed)
        if status != CONTINUE:
            return status
