"""The LL128 protocol on the GPU (NCCL ``src/device/prims_ll128.h``: ``GenericOp``, ``recvReduceSendCopy``,
``loadRegsBegin`` / ``loadRegsFinish`` / ``storeRegs``'s layout, ``waitSend``, ``postRecv``), the same step logic
as ``collectives/device/prims_ll128.py``.

A 128-byte line is 16 words; a warp moves a wire slice of 16 lines (2048 bytes) with 1920 data bytes, each lane
owning 16 bytes of four lines (``g = 0..3``: words ``64 g + 2 lane`` and ``+ 1``).  Lane ``8 k + 7`` is the flag
lane: the second word of each of its pairs is the line's flag, ``step + 1`` as a 64-bit value, in the line's last
8 bytes.  ``data_word`` is NCCL's register layout (``ix = 32 g - 4 (g / 2) + lane - (g % 2) (lane / 8)``; the
flag lane's odd groups carry the second half of its even group's 16 bytes), the inverse of the CPU path's
``ll_kernels.LL128_PERM``, so a slice's bytes sit where NCCL's kernel puts them.
A step: the sender's poller waits for credit (``waitSend``); every warp then takes slices ``warp, warp + nwarps,
...``: it polls each recv peer's 16 lines with 16-byte volatile loads until every flag lane sees the flag (a warp
vote, ``__any_sync``), loads the lines again (the data of a line whose flag is visible is visible too), reduces
with the user's data, and stores every line to each send peer with one 16-byte volatile store per lane, data and
flag together, so that the eight lanes of a line write it in one warp-wide instruction.  Barrier; the receiver
returns credit (``postRecv``).  No tail over P2P, as in NCCL.

Only hardware can check what this relies on: that a warp's 128-byte line store becomes visible at once, so a
reader that sees the flag word sees the 15 data words beside it (NVIDIA documents no such guarantee; NCCL's LL128
is enabled only where it has been validated).  The simulator runs the same code with one simulated thread playing
all 32 lanes of a warp (it has no warp votes), which checks the layout, the steps and the reduction bit for bit,
not the atomicity.
Deliberate difference: NCCL keeps a lane's words in registers; numba cannot reinterpret registers as another
element type, so each lane stages its 8 words in global memory it alone touches (``stg_w`` / ``stg_t``).
"""
from __future__ import annotations

import numpy as np

from collectives.include.device import NCCL_STEPS

from .numba_cuda import cuda
from .clock import SIMULATED, now_ns, pause
from .prims import BTID, CHANNEL, GROUP, GTHREADS, GTID, RANK, RECV, RL, RSTEP, SEND, SSTEP, \
    div_up, imin, make_load_src, op_begin, post_recv, wait_send
from .sync import SPINS, WHAT_LL128_FLAG, load2, set_abort, spin_check, store2

LINE_WORDS, SLICE_WORDS, SLICE_DATA_WORDS = 16, 256, 240   # NCCL_LL128_LINEELEMS, one warp's wire slice
LANE_WORDS = 8                                                # NCCL_LL128_SHMEM_ELEMS_PER_THREAD
SEND_SLOT = 3  # staging slot of the send data; 0..2 are the recv peers'
# On a GPU a thread is one lane; under the simulator one thread plays a whole warp's 32 lanes
LANES_PER_THREAD = 32 if SIMULATED else 1
THREADS_PER_WARP = 1 if SIMULATED else 32
FULL_MASK = 0xFFFFFFFF

if SIMULATED:
    @cuda.jit(device=True)
    def warp_any(pred):
        return pred
else:  # pragma: no cover - needs a GPU
    @cuda.jit(device=True)
    def warp_any(pred):
        return cuda.any_sync(FULL_MASK, pred)


@cuda.jit(device=True)
def data_word(g, h, lane):
    """The slice data word (0..239) that lane ``lane`` holds in word ``h`` of its group-``g`` pair; -1: the flag."""
    if lane % 8 == 7:
        if h == 1:
            return -1
        if g % 2 == 0:
            return 2 * (g * 32 - 4 * (g // 2) + lane)
        return 2 * ((g - 1) * 32 - 4 * ((g - 1) // 2) + lane) + 1
    return 2 * (g * 32 - 4 * (g // 2) + lane - (g % 2) * (lane // 8)) + h


@cuda.jit(device=True)
def wait_lines(fifo, c, slot, wire0, lane0, flag, abort, timeout_ns, rank, channel, step, peer, group):
    """``recvReduceSendCopy``'s wait: poll this warp's 16 lines of one slice until every flag lane sees ``flag``
    (the vote is the warp's); the abort word and the deadline are read by the warp's first lane every ``SPINS``
    spins, and the warp leaves together.  False when the launch aborted."""
    t0 = now_ns()
    spins = 0
    while True:
        need = False
        for li in range(LANES_PER_THREAD):
            lane = lane0 + li
            for g in range(4):
                lo, hi = load2(fifo, (c, slot, wire0 + 64 * g + 2 * lane))
                if lane % 8 == 7 and hi != flag:
                    need = True
        if not warp_any(need):
            return True
        spins += 1
        if spins >= SPINS:  # the same count on every lane: the vote below is the whole warp's
            spins = 0
            verdict = spin_check(abort, t0, timeout_ns) if lane0 == 0 else 0
            if warp_any(verdict != 0):
                if verdict == 2:
                    set_abort(abort, rank, channel, step, peer, WHAT_LL128_FLAG, group)
                return False
        pause()


def make_ll128_op(fn, premul, postdiv):
    load_src = make_load_src(premul)

    @cuda.jit(device=True)
    def ll128_op(P, inp, out, fifo, stg_t, stg_w, ctrl, conns, bars, abort, scal, nranks, timeout_ns,
                 src_ix, dst_ix, nelem, recv, send, post_op, from_output):
        """``GenericOp``: one step per call, even for nelem = 0 (``waitSend``; each warp's slices:
        ``recvReduceSendCopy``; ``postRecv``); False on abort."""
        gtid, gth, rl, ch, grp = P[GTID], P[GTHREADS], P[RL], P[CHANNEL], P[GROUP]
        nrecv, nsend, nelem = op_begin(P, nelem, recv, send)
        per_word = 8 // out.itemsize
        slice_elems = SLICE_DATA_WORDS * per_word
        lane0 = gtid % THREADS_PER_WARP
        warp, nwarps = gtid // THREADS_PER_WARP, gth // THREADS_PER_WARP
        bwarp = P[BTID] // THREADS_PER_WARP  # the warp's staging row: unique in the block across groups
        has_src, has_dst = src_ix >= 0, dst_ix >= 0
        if not wait_send(P, ctrl, conns, bars, abort, timeout_ns, nsend, gtid, gth, rl, ch, grp):  # and barrier()
            return False
        failed = False
        nslices = div_up(nelem, slice_elems)
        s = warp
        while s < nslices and not failed:
            base = s * slice_elems
            elt = imin(slice_elems, nelem - base)
            wire0 = s * SLICE_WORDS
            for j in range(nrecv):  # wait for every recv peer's slice, then load it again
                c, step = P[RECV + j], P[RSTEP + j]
                if not wait_lines(fifo, c, step % NCCL_STEPS, wire0, lane0, np.uint64(step + 1), abort, timeout_ns,
                                  P[RANK], ch, step, conns[c, 0], grp):
                    failed = True  # on to the group's last barrier, which every thread must reach
                    break
                for li in range(LANES_PER_THREAD):
                    lane = lane0 + li
                    for g in range(4):
                        lo, hi = load2(fifo, (c, step % NCCL_STEPS, wire0 + 64 * g + 2 * lane))
                        stg_w[rl, ch, j, bwarp, lane, 2 * g] = lo
                        stg_w[rl, ch, j, bwarp, lane, 2 * g + 1] = hi
            if failed:
                break
            for li in range(LANES_PER_THREAD):  # reduce and copy this lane's words, element by element
                lane = lane0 + li
                for p in range(LANE_WORDS):
                    k = data_word(p // 2, p % 2, lane)
                    if k < 0:
                        continue
                    if nsend:
                        stg_w[rl, ch, SEND_SLOT, bwarp, lane, p] = 0  # the padding of a partial slice
                    for q in range(per_word):
                        e = k * per_word + q
                        if e < elt:
                            x = p * per_word + q
                            kk = 0
                            if has_src:
                                v = load_src(inp, out, rl, src_ix + base + e, from_output, scal)
                            else:
                                v = stg_t[rl, ch, 0, bwarp, lane, x]
                                kk = 1
                            for j in range(kk, nrecv):
                                v = fn(v, stg_t[rl, ch, j, bwarp, lane, x])
                            if post_op:
                                v = postdiv(v, nranks)
                            if has_dst:
                                out[rl, dst_ix + base + e] = v
                            if nsend:
                                stg_t[rl, ch, SEND_SLOT, bwarp, lane, x] = v
            for j in range(nsend):  # store every line, its flag in the flag lane's second word
                c, step = P[SEND + j], P[SSTEP + j]
                flag = np.uint64(step + 1)
                for li in range(LANES_PER_THREAD):
                    lane = lane0 + li
                    for g in range(4):
                        hi = flag if lane % 8 == 7 else stg_w[rl, ch, SEND_SLOT, bwarp, lane, 2 * g + 1]
                        store2(fifo, (c, step % NCCL_STEPS, wire0 + 64 * g + 2 * lane),
                               stg_w[rl, ch, SEND_SLOT, bwarp, lane, 2 * g], hi)
            s += nwarps
        for j in range(nsend):
            P[SSTEP + j] += 1
        return post_recv(P, ctrl, bars, abort, nrecv, failed, gtid, gth, rl, ch, grp)  # barrier(), postRecv
    return ll128_op
