"""The LL and LL128 protocols' compiled kernel (NCCL ``src/device/prims_ll.h``: ``LLGenericOp`` with
``readLL``/``storeLL``, ``waitSend``, ``postRecv`` and ``incSend``'s cleanup; ``src/device/prims_ll128.h``, whose
steps move the same way with 128-byte lines), run by ``compiled.py`` over the primitive calls it recorded from our
``run_ring``.

For each recorded call ``run_ops`` does what ``PrimitivesLL.generic_op`` does: ``waitSend`` on head, then reading
the recv slot until every line carries the step's flag (LL: both 32-bit flags of each 16-byte line; LL128: word 15
of all 16 lines of each 2048-byte wire slice, then the slice's 240 data words in NCCL's warp layout), the reduction
``fn(local, peer)``, the store to the output, writing the send slot with the step's flag (LL: ``storeLL`` and
``incSend``'s cleanup on clean-mask steps; LL128: the data words of whole zero-padded slices, a fence, then the
flag words, and ``tail`` for a proxied connection), ``connFifo`` for a proxied connection, the reader's doorbell,
then ``postRecv`` on head.  Same memory, flags, step counters and summation order as the readable path, so
results are bitwise its results (``tests/test_ll_compiled.py``, ``tests/test_simple_compiled.py``).  It runs ring
rows only (one receive and one send peer, ``compiled_common``'s block 0): Tree/LL takes the readable primitives.
"""
from __future__ import annotations

import numba
import numpy as np

from collectives.include.device import NCCL_STEPS

from .compiled_common import (CANON, CHECKED, CLEAN_MASK, CONTINUE, CREDIT, DST, END, FIFO, FLAG_MOD, FROM_OUT,
                              IS_FLOAT, LINES, LL128, MISMATCH, NCH, NELEM, OPCODE, PC, PROG, REC, RHEAD, RSTAGE, RSTEP,
                              RWORDS, R_HEADSLEEP, SHEAD, SND, SRC, SSTAGE, SSTEP, STAIL, STEP_BYTES, SWORDS,
                              S_DOORBELL, S_TAILSLEEP, WAIT, WAIT_FLAG, WAIT_HEAD, WAIT_MISMATCH, begin, copy,
                              end_round, fence, new_wait, peer_runs_same_call, ptr, reduce_slice, row, save_steps, u32,
                              u64, wait_on, wake)
from .ll_kernels import LL128_DATA_WORDS, LL128_PERM, LL128_WIRE_WORDS

LL128_SLICE_DATA = LL128_DATA_WORDS * 8  # data bytes of a 2048-byte wire slice (prims_ll128.SLICE_DATA)


@numba.njit(nogil=True, cache=True)
def _ll128_slice_ready(rwords, base, s, flag):
    """All 16 lines of wire slice ``s`` carry the step's flag in word 15."""
    for line in range(16):
        if rwords[base + (s * 16 + line) * 16 + 15] != flag:
            return False
    return True


@numba.njit(nogil=True, cache=True)
def run_ops(ctl, inp, out, start_sig):
    """Execute every channel's recorded calls, round-robin, until all are done (DONE), none has moved for
    ``MAX_IDLE`` rounds (BLOCKED: each channel's row says what it waits for), or a peer runs another call
    (MISMATCH).  ``start_sig`` (empty when resuming): the call's signature; publish it and load the step counters
    first.  ``ctl[LL128]``: the lines are LL128's (``prims_ll128.h``) rather than LL's."""
    if len(start_sig) > 0:
        begin(ctl, start_sig, 1)  # this rank's call published before any data moves
    step_bytes, flag_mod, clean_mask = ctl[STEP_BYTES], ctl[FLAG_MOD], ctl[CLEAN_MASK]
    opcode, is_float, nch, ll128 = ctl[OPCODE], ctl[IS_FLOAT], ctl[NCH], ctl[LL128] != 0
    words_per_slot, lines_per_slot = step_bytes // 8, step_bytes // 16
    esize = out.itemsize
    nwords = step_bytes // 2048 * LL128_DATA_WORDS if ll128 else words_per_slot // 2  # staging: one step's data
    low, sh = np.uint64(0xFFFFFFFF), np.uint64(32)
    canon = numba.carray(ptr(ctl[CANON:].ctypes.data), 1, out.dtype)[0]
    prog = numba.carray(ptr(ctl[PROG]), (row(ctl, nch - 1)[END], 7), np.int64)
    fence()  # a sleeper's mark, stored before this call, is visible before we look at the flags again
    w = new_wait()
    while True:
        remaining, progressed = 0, False
        for c in range(nch):
            st = row(ctl, c)
            if st[PC] >= st[END]:
                continue
            rwords = numba.carray(ptr(st[RWORDS]), NCCL_STEPS * words_per_slot, np.uint64)
            swords = numba.carray(ptr(st[SWORDS]), NCCL_STEPS * words_per_slot, np.uint64)
            shead = u64(st[SHEAD])
            rst = numba.carray(ptr(st[RSTAGE]), nwords, np.uint64)
            sst = numba.carray(ptr(st[SSTAGE]), nwords, np.uint64)
            rt = numba.carray(ptr(st[RSTAGE]), nwords * 8 // esize, out.dtype)
            stt = numba.carray(ptr(st[SSTAGE]), nwords * 8 // esize, out.dtype)
            while st[PC] < st[END]:
                op = prog[st[PC]]
                recv, send, src, dst, nelem, from_out = op[REC], op[SND], op[SRC], op[DST], op[NELEM], op[FROM_OUT]
                nbytes = nelem * esize
                nlines = (nbytes + 7) // 8  # LL: 8 data bytes a line
                nslices = (nbytes + LL128_SLICE_DATA - 1) // LL128_SLICE_DATA  # LL128: 1920 data bytes a slice
                if send and st[CREDIT] == 0:  # waitSend: at most NCCL_STEPS steps ahead of the reader
                    if shead[0] + np.uint64(NCCL_STEPS) < np.uint64(st[SSTEP] + 1):
                        wait_on(ctl, st, WAIT_HEAD, st[SSTEP])
                        break
                    st[CREDIT] = 1
                if recv:
                    step = st[RSTEP]
                    base = (step % NCCL_STEPS) * words_per_slot
                    i = st[LINES]
                    if ll128:  # a wire slice is taken when all 16 of its lines carry step + 1, then unpacked
                        while i < nslices and _ll128_slice_ready(rwords, base, i, np.uint64(step + 1)):
                            fence()  # the flags before the data
                            for j in range(LL128_DATA_WORDS):
                                rst[i * LL128_DATA_WORDS + j] = rwords[base + i * LL128_WIRE_WORDS + LL128_PERM[j]]
                            i += 1
                        waiting = i < nslices
                    else:  # readLL: every line carries the step's flag in both halves
                        flag = np.uint64((step + 1) % flag_mod)
                        while i < nlines:
                            w0 = rwords[base + 2 * i]
                            w1 = rwords[base + 2 * i + 1]
                            if (w0 >> sh) != flag or (w1 >> sh) != flag:
                                break
                            rst[i] = (w0 & low) | (w1 << sh)
                            i += 1
                        waiting = i < nlines
                    st[LINES] = i
                    if waiting:
                        wait_on(ctl, st, WAIT_FLAG, step)
                        break
                    if nbytes > 0 and st[CHECKED] == 0:  # the peer's first data: is it running the same call?
                        if not peer_runs_same_call(ctl, st):
                            st[WAIT] = WAIT_MISMATCH
                            return MISMATCH
                        st[CHECKED] = 1
                # reduceCopy: fn(local, peer) to the output if any, else to the send staging; then the other
                if send:  # the padding of the last unit (8-byte word; LL128 slice) goes out as zeros
                    for k in range(nbytes // 8, nslices * LL128_DATA_WORDS if ll128 else nlines):
                        sst[k] = 0
                if nelem > 0:
                    if dst >= 0:
                        reduce_slice(out, dst, inp, out, rt, src, 0, recv, src >= 0, from_out, nelem, opcode,
                                     is_float, canon)
                        if send:
                            copy(stt, 0, out, dst, nelem)
                    elif send:
                        reduce_slice(stt, 0, inp, out, rt, src, 0, recv, src >= 0, from_out, nelem, opcode,
                                     is_float, canon)
                if send:
                    step = st[SSTEP]
                    base = (step % NCCL_STEPS) * words_per_slot
                    if ll128:  # the data words of whole slices, then (after a fence) every line's flag word
                        if st[FIFO]:
                            numba.carray(ptr(st[FIFO]), NCCL_STEPS, np.int64)[step % NCCL_STEPS] = nslices * 2048
                        for k in range(nslices):
                            for j in range(LL128_DATA_WORDS):
                                swords[base + k * LL128_WIRE_WORDS + LL128_PERM[j]] = sst[k * LL128_DATA_WORDS + j]
                        fence()
                        for line in range(nslices * 16):
                            swords[base + line * 16 + 15] = np.uint64(step + 1)
                        if st[FIFO]:  # proxied: the proxy waits for tail too (fence, then tail = step + 1)
                            fence()
                            u64(st[STAIL])[0] = np.uint64(step + 1)
                    else:  # storeLL, and incSend's cleanup on clean-mask steps
                        flag = np.uint64((step + 1) % flag_mod) << sh
                        clean = (step & clean_mask) == clean_mask
                        if st[FIFO]:
                            numba.carray(ptr(st[FIFO]), NCCL_STEPS, np.int64)[step % NCCL_STEPS] = \
                                step_bytes if clean else nlines * 16
                        for k in range(nlines):
                            v64 = sst[k]
                            swords[base + 2 * k] = (v64 & low) | flag
                            swords[base + 2 * k + 1] = (v64 >> sh) | flag
                        if clean:
                            for k in range(nlines, lines_per_slot):
                                swords[base + 2 * k] = flag
                                swords[base + 2 * k + 1] = flag
                    fence()  # the flags are visible before we read whether the reader sleeps
                    if u32(st[S_TAILSLEEP])[0]:  # its doorbell
                        u32(st[S_DOORBELL])[0] += np.uint32(1)
                        wake(st[S_DOORBELL])
                    st[SSTEP] += 1
                if recv:  # postRecv: free the slot, wake the sender if it sleeps on head
                    st[RSTEP] += 1
                    u64(st[RHEAD])[0] = np.uint64(st[RSTEP])
                    fence()
                    if u32(st[R_HEADSLEEP])[0]:
                        wake(st[RHEAD])
                st[PC] += 1
                st[LINES] = 0
                st[CREDIT] = 0
                progressed = True
            if st[PC] < st[END]:
                remaining += 1
            else:
                save_steps(st)
        status = end_round(ctl, nch, w, remaining, progressed)
        if status != CONTINUE:
            return status
