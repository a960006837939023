"""The persistent kernel (NCCL ``src/device/common.h``: ``ncclKernelMain``; ``src/device/all_reduce.h``,
``all_gather.h``, ``reduce_scatter.h``, ``broadcast.h``, ``reduce.h``: ``runRing``; ``all_reduce.h``:
``runTreeSplit``).  The algorithms are ``collectives/device/*.py``'s, call for call.

One launch runs one collective: block ``c`` is channel ``c``, its threads share every copy and reduce.  A launch
may also carry several ranks (``prm[RANK_LO]`` onwards), a flat thread index ``v`` giving (rank, channel, thread):
under numba's simulator, which runs one launch at a time, the thread harness puts all ranks in one launch so
their threads spin side by side; on a GPU each rank launches its own kernel on its own stream.
``runTreeSplit``: the root's threads form one group; on any other rank the first ``split`` threads reduce up the
tree and the rest broadcast down it, each group with its own barrier (NCCL: 384/256 Simple, 448/192 LL).
Every primitive returns False once the launch aborted; the algorithm then returns at once.
"""
from __future__ import annotations

import numpy as np

from .api import cuda
from .clock import SIMULATED
from .prims import P_WORDS, div_up, imin, prims_finish, prims_init
from .prims_ll import make_ll_op
from .prims_simple import make_simple_op
from .reduce import make_ops

# prm[]: the launch's parameters
COLL, PROTO, NRANKS, ROOT, TIMEOUT, NTHREADS, RANK_LO, NCHANNELS, ALGO, SPC, SPS, SPLIT, ABSENT = range(13)
PRM_WORDS = 13
COLLS = {"Broadcast": 0, "Reduce": 1, "AllGather": 2, "ReduceScatter": 3, "AllReduce": 4}
PROTOS = {"Simple": 0, "LL": 1}
ALGOS = {"Ring": 0, "Tree": 1}
# ring[rank, channel]: [recv conn, send conn, ring index, userRanks...]
# tree[rank, channel]: [up, down0..2, conn from up, conn to up, conns from down0..2, conns to down0..2]
T_UP, T_DOWN, T_FROM_UP, T_TO_UP, T_FROM_DOWN, T_TO_DOWN = 0, 1, 4, 5, 6, 9
TREE_WORDS = 12

# 640 threads (NCCL's maximum) x 96 registers fit a block's 64 K registers; unbounded, numba's kernel uses ~133
# (ptxas, sm_90), and a launch of more than 480 threads would fail.
MAX_REGISTERS = 96

_cache: dict = {}


def get_kernel(op: str, kind: str):
    """The kernel for one reduction op and element kind (compiled once; numba specialises it per dtype)."""
    key = (op, kind)
    if key not in _cache:
        _cache[key] = _make_kernel(*make_ops(op, kind))
    return _cache[key]


def _make_kernel(fn, premul, postdiv):
    simple_op = make_simple_op(fn, premul, postdiv)
    ll_op = make_ll_op(fn, premul, postdiv)

    @cuda.jit(device=True)
    def prim(P, A, prm, src_ix, dst_ix, nelem, recv, send, post_op, from_output):
        inp, out, fifo_s, fifo_ll, stage_t, stage_u, ctrl, conns, bars, abort, scal, steps = A
        if prm[PROTO] == 1:
            return ll_op(P, inp, out, fifo_ll, stage_t, stage_u, ctrl, conns, bars, abort, scal, prm[NRANKS],
                         prm[TIMEOUT], src_ix, dst_ix, nelem, recv, send, post_op, from_output)
        return simple_op(P, inp, out, fifo_s, ctrl, conns, bars, abort, scal, prm[NRANKS], prm[TIMEOUT],
                         src_ix, dst_ix, nelem, recv, send, post_op, from_output)

    @cuda.jit(device=True)
    def ring_all_reduce(P, A, prm, work, ring, rank, ch):
        n = prm[NRANKS]
        ring_ix = ring[rank, ch, 2]
        grid_offset, channel_count, chunk_count = work[ch, 0], work[ch, 1], work[ch, 2]
        align = 16 // A[1].itemsize
        loop_count = n * chunk_count
        elem_offset = 0
        while elem_offset < channel_count:
            rem = channel_count - elem_offset
            if rem < loop_count:
                chunk_count = div_up(div_up(rem, n), align) * align
            base = grid_offset + elem_offset
            c = (ring_ix + n - 1) % n                                   # step 0: push to next
            if not prim(P, A, prm, base + c * chunk_count, -1, imin(chunk_count, rem - c * chunk_count),
                        False, True, False, False):
                return False
            for j in range(2, n):                                       # reduce-and-forward
                c = (ring_ix + n - j) % n
                if not prim(P, A, prm, base + c * chunk_count, -1, imin(chunk_count, rem - c * chunk_count),
                            True, True, False, False):
                    return False
            c = ring_ix                                                 # our chunk is final
            if not prim(P, A, prm, base + c * chunk_count, base + c * chunk_count,
                        imin(chunk_count, rem - c * chunk_count), True, True, True, False):
                return False
            for j in range(1, n - 1):                                   # copy-and-forward
                c = (ring_ix + n - j) % n
                if not prim(P, A, prm, -1, base + c * chunk_count, imin(chunk_count, rem - c * chunk_count),
                            True, True, False, False):
                    return False
            c = (ring_ix + 1) % n                                       # final copy into the output
            if not prim(P, A, prm, -1, base + c * chunk_count, imin(chunk_count, rem - c * chunk_count),
                        True, False, False, False):
                return False
            elem_offset += loop_count
        return True

    @cuda.jit(device=True)
    def ring_all_gather(P, A, prm, work, ring, rank, ch):
        n = prm[NRANKS]
        count, elem_offset = work[ch, 3], 0
        while elem_offset < work[ch, 1]:
            nelem = imin(work[ch, 2], work[ch, 1] - elem_offset)
            data_offset = work[ch, 0] + elem_offset
            if not prim(P, A, prm, data_offset, data_offset + ring[rank, ch, 3] * count, nelem,
                        False, True, False, False):
                return False
            for j in range(1, n - 1):
                if not prim(P, A, prm, -1, data_offset + ring[rank, ch, 3 + n - j] * count, nelem,
                            True, True, False, False):
                    return False
            if not prim(P, A, prm, -1, data_offset + ring[rank, ch, 3 + 1] * count, nelem,
                        True, False, False, False):
                return False
            elem_offset += work[ch, 2]
        return True

    @cuda.jit(device=True)
    def ring_reduce_scatter(P, A, prm, work, ring, rank, ch):
        n = prm[NRANKS]
        count, elem_offset = work[ch, 3], 0
        while elem_offset < work[ch, 1]:
            nelem = imin(work[ch, 2], work[ch, 1] - elem_offset)
            data_offset = work[ch, 0] + elem_offset
            if not prim(P, A, prm, data_offset + ring[rank, ch, 3 + n - 1] * count, -1, nelem,
                        False, True, False, False):
                return False
            for j in range(2, n):
                if not prim(P, A, prm, data_offset + ring[rank, ch, 3 + n - j] * count, -1, nelem,
                            True, True, False, False):
                    return False
            if not prim(P, A, prm, data_offset + ring[rank, ch, 3] * count, data_offset, nelem,
                        True, False, True, False):
                return False
            elem_offset += work[ch, 2]
        return True

    @cuda.jit(device=True)
    def ring_broadcast(P, A, prm, work, ring, rank, ch):
        n, root = prm[NRANKS], prm[ROOT]
        next_rank = ring[rank, ch, 3 + 1 % n]
        elem_offset = 0
        while elem_offset < work[ch, 1]:
            offset = work[ch, 0] + elem_offset
            nelem = imin(work[ch, 2], work[ch, 1] - elem_offset)
            if rank == root:
                ok = prim(P, A, prm, offset, offset, nelem, False, True, False, False)
            elif next_rank == root:
                ok = prim(P, A, prm, -1, offset, nelem, True, False, False, False)
            else:
                ok = prim(P, A, prm, -1, offset, nelem, True, True, False, False)
            if not ok:
                return False
            elem_offset += work[ch, 2]
        return True

    @cuda.jit(device=True)
    def ring_reduce(P, A, prm, work, ring, rank, ch):
        n, root = prm[NRANKS], prm[ROOT]
        prev_rank = ring[rank, ch, 3 + n - 1]
        elem_offset = 0
        while elem_offset < work[ch, 1]:
            offset = work[ch, 0] + elem_offset
            nelem = imin(work[ch, 2], work[ch, 1] - elem_offset)
            if prev_rank == root:
                ok = prim(P, A, prm, offset, -1, nelem, False, True, False, False)
            elif rank == root:
                ok = prim(P, A, prm, offset, offset, nelem, True, False, True, False)
            else:
                ok = prim(P, A, prm, offset, -1, nelem, True, True, False, False)
            if not ok:
                return False
            elem_offset += work[ch, 2]
        return True

    @cuda.jit(device=True)
    def tree_split(P, A, prm, work, tree, rank, ch, tid):
        """``runTreeSplit``: build this thread's group's primitives and walk the channel's chunks."""
        steps, ctrl = A[11], A[6]
        nth = prm[NTHREADS]
        is_root = tree[rank, ch, T_UP] < 0
        leaf = tree[rank, ch, T_DOWN] < 0
        if is_root:
            group, gtid, gth = 0, tid, nth
            prims_init(P, tree[rank, ch, T_FROM_DOWN], tree[rank, ch, T_FROM_DOWN + 1],
                       tree[rank, ch, T_FROM_DOWN + 2], tree[rank, ch, T_TO_DOWN], tree[rank, ch, T_TO_DOWN + 1],
                       tree[rank, ch, T_TO_DOWN + 2], steps, ctrl, 1, 1, group, gtid, gth, ch, rank,
                       rank - prm[RANK_LO], prm[PROTO] == 0)
        elif tid < prm[SPLIT]:
            group, gtid, gth = 1, tid, prm[SPLIT]
            prims_init(P, tree[rank, ch, T_FROM_DOWN], tree[rank, ch, T_FROM_DOWN + 1],
                       tree[rank, ch, T_FROM_DOWN + 2], tree[rank, ch, T_TO_UP], -1, -1, steps, ctrl, 1, 1,
                       group, gtid, gth, ch, rank, rank - prm[RANK_LO], prm[PROTO] == 0)
        else:
            group, gtid, gth = 2, tid - prm[SPLIT], nth - prm[SPLIT]
            prims_init(P, tree[rank, ch, T_FROM_UP], -1, -1, tree[rank, ch, T_TO_DOWN],
                       tree[rank, ch, T_TO_DOWN + 1], tree[rank, ch, T_TO_DOWN + 2], steps, ctrl, 1, 1,
                       group, gtid, gth, ch, rank, rank - prm[RANK_LO], prm[PROTO] == 0)
        off, end, cc = work[ch, 0], work[ch, 0] + work[ch, 1], work[ch, 2]
        ok = True
        while off < end and ok:
            nelem = imin(cc, end - off)
            if group == 0:                          # root: reduce the children, send the result back down
                ok = prim(P, A, prm, off, off, nelem, True, True, True, False)
            elif group == 1:
                if leaf:
                    ok = prim(P, A, prm, off, -1, nelem, False, True, False, False)
                else:
                    ok = prim(P, A, prm, off, -1, nelem, True, True, False, False)
            else:
                if leaf:
                    ok = prim(P, A, prm, -1, off, nelem, True, False, False, False)
                else:
                    ok = prim(P, A, prm, -1, off, nelem, True, True, False, False)
            off += cc
        if ok:
            prims_finish(P, steps)

    @cuda.jit(**({} if SIMULATED else {"max_registers": MAX_REGISTERS}))
    def kernel(prm, work, ring, tree, inp, out, fifo_s, fifo_ll, stage_t, stage_u, ctrl, steps, conns, bars,
               abort, scal):
        nth, nch = prm[NTHREADS], prm[NCHANNELS]
        v = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        per_rank = nch * nth
        rank = prm[RANK_LO] + v // per_rank
        ch = (v % per_rank) // nth
        tid = v % nth
        if (prm[ABSENT] >> rank) & 1:  # a rank that never runs (the deadline test)
            return
        A = (inp, out, fifo_s, fifo_ll, stage_t, stage_u, ctrl, conns, bars, abort, scal, steps)
        P = cuda.local.array(P_WORDS, np.int64)
        for i in range(P_WORDS):
            P[i] = 0
        if prm[ALGO] == 1:
            tree_split(P, A, prm, work, tree, rank, ch, tid)
            return
        prims_init(P, ring[rank, ch, 0], -1, -1, ring[rank, ch, 1], -1, -1, steps, ctrl, prm[SPC], prm[SPS], 0,
                   tid, nth, ch, rank, rank - prm[RANK_LO], prm[PROTO] == 0)
        coll = prm[COLL]
        if coll == 4:
            ok = ring_all_reduce(P, A, prm, work, ring, rank, ch)
        elif coll == 3:
            ok = ring_reduce_scatter(P, A, prm, work, ring, rank, ch)
        elif coll == 2:
            ok = ring_all_gather(P, A, prm, work, ring, rank, ch)
        elif coll == 0:
            ok = ring_broadcast(P, A, prm, work, ring, rank, ch)
        else:
            ok = ring_reduce(P, A, prm, work, ring, rank, ch)
        if ok:
            prims_finish(P, steps)

    return kernel
