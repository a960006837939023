"""The persistent kernel (NCCL ``src/device/common.h``: ``ncclKernelMain``; ``src/device/all_reduce.h``,
``all_gather.h``, ``reduce_scatter.h``, ``broadcast.h``, ``reduce.h``: ``runRing``; ``all_reduce.h``:
``runTreeSplit``).  The algorithms are ``collectives/device/*.py``'s, call for call.

One kernel per (op, element type, protocol), as NCCL compiles one ``ncclDevKernel_*`` per function, type, op,
algorithm and protocol (here the algorithm and the collective are launch parameters): a protocol's code alone
keeps registers and compile time down, and the variants compile in parallel.  Every kernel is ``cache=True``:
numba keeps the compiled kernel under ``NUMBA_CACHE_DIR`` (``scripts/gpu_check.py`` points it into its output
folder), so a process that launches a variant another process has compiled loads it instead of compiling again.

One launch runs one collective: block ``c`` is channel ``c``, its threads share every copy and reduce.  A launch
may also carry several ranks (``prm[RANK_LO]`` onwards), a flat thread index ``v`` giving (rank, channel, thread):
under numba's simulator, which runs one launch at a time, the thread harness puts all ranks in one launch so
their threads spin side by side; on a GPU each rank launches its own kernel on its own stream.
``runTreeSplit``: the root's threads form one group; on any other rank the first ``split`` threads reduce up the
tree and the rest broadcast down it, each group with its own named barrier (NCCL's split: 384/256 Simple,
448/192 LL and LL128 of 640 threads; ``call.tree_split``).
Every primitive returns False once the launch aborted; the algorithm then returns at once.
"""
from __future__ import annotations

import numpy as np

from .numba_cuda import cuda
from .clock import SIMULATED
from .layout import T_DOWN, T_FROM_DOWN, T_FROM_UP, T_TO_DOWN, T_TO_UP, T_UP
from .prims import P_WORDS, div_up, imin, prims_finish, prims_init
from .prims_ll import make_ll_op
from .prims_ll128 import make_ll128_op
from .prims_simple import make_simple_op
from .reduce_kernel import make_ops

# prm[]: the launch's parameters
COLL, PROTO, NRANKS, ROOT, TIMEOUT, NTHREADS, RANK_LO, NCHANNELS, ALGO, SPC, SPS, SPLIT, ABSENT = range(13)
PRM_WORDS = 13
COLLS = {"Broadcast": 0, "Reduce": 1, "AllGather": 2, "ReduceScatter": 3, "AllReduce": 4}
PROTOS = {"Simple": 0, "LL": 1, "LL128": 2}
ALGOS = {"Ring": 0, "Tree": 1}
# the kernel's arguments, in order (call.kernel_args builds them); the per-rank ones are a launch's own rows
ARGS = ("prm", "work", "ring", "tree", "inp", "out", "fifo_s", "fifo_ll", "stage_t", "stage_u", "fifo_l128",
        "stg_t", "stg_w", "ctrl", "steps", "conns", "bars", "abort", "scal")
PER_RANK_ARGS = ("inp", "out", "stage_t", "stage_u", "stg_t", "stg_w", "bars")
# A, the tuple of arrays the kernel hands its device functions: the places of its arrays
(A_INP, A_OUT, A_FIFO_S, A_FIFO_LL, A_STAGE_T, A_STAGE_U, A_FIFO_L128, A_STG_T, A_STG_W, A_CTRL, A_CONNS, A_BARS,
 A_ABORT, A_SCAL, A_STEPS) = range(15)

# 640 threads (NCCL's maximum) x 96 registers fit a block's 64 K registers; unbounded, ptxas (sm_90) gives the float32
# kernels 128 (Simple), 136 (LL) and 178 (LL128) registers, and a block of 640 threads could not launch.  At 96
# they spill 140-520 bytes per thread to local memory (L1-cached); occupancy.check_launch reports the figures.
MAX_REGISTERS = 96

_cache: dict = {}


def get_kernel(op: str, kind: str, dtype, proto: str):
    """The kernel for one reduction op, element type (``kind`` its family) and protocol, made once."""
    key = (op, kind, np.dtype(dtype).name, proto)
    if key not in _cache:
        _cache[key] = _make_kernel(*make_ops(op, kind, dtype), proto, "_".join(key))
    return _cache[key]


def _prim(fn, premul, postdiv, proto: str):
    """The kernel's one primitive call site, for one protocol: its op on its own FIFO and staging arrays of ``A``
    (the kernel's arrays from ``inp`` on, ``A_*`` their places; Simple's op leaves the staging pair unused)."""
    make_op, fifo, stage_a, stage_b = {"Simple": (make_simple_op, A_FIFO_S, A_STAGE_T, A_STAGE_U),
                                       "LL": (make_ll_op, A_FIFO_LL, A_STAGE_T, A_STAGE_U),
                                       "LL128": (make_ll128_op, A_FIFO_L128, A_STG_T, A_STG_W)}[proto]
    op = make_op(fn, premul, postdiv)

    @cuda.jit(device=True)
    def prim(P, A, prm, src_ix, dst_ix, nelem, recv, send, post_op, from_output):
        return op(P, A[A_INP], A[A_OUT], A[fifo], A[stage_a], A[stage_b], A[A_CTRL], A[A_CONNS], A[A_BARS],
                  A[A_ABORT], A[A_SCAL], prm[NRANKS], prm[TIMEOUT], src_ix, dst_ix, nelem, recv, send, post_op,
                  from_output)
    return prim


def _make_kernel(fn, premul, postdiv, proto: str, name: str):
    prim = _prim(fn, premul, postdiv, proto)

    @cuda.jit(device=True)
    def ring_call(coll, k, n, ring_ix, ur, root, rank, base, cc, rem, count):
        """The k-th primitive of one loop of ``runRing`` as (src, dst, nelem, recv, send, post_op): the CPU
        algorithms (``collectives/device/*.py``) call for call, as a table, so that the kernel has one call site
        of the primitives (each call site inlines both protocols: 21 of them made ptxas take minutes)."""
        if coll == 4:  # AllReduce: send, n-2 recv_reduce_send, recv_reduce_copy_send, n-2 recv_copy_send, recv
            if k == 0:
                c = (ring_ix + n - 1) % n
            elif k < n - 1:
                c = (ring_ix + n - (k + 1)) % n
            elif k == n - 1:
                c = ring_ix
            elif k < 2 * n - 2:
                c = (ring_ix + n - (k - n + 1)) % n
            else:
                c = (ring_ix + 1) % n
            off, nel = base + c * cc, imin(cc, rem - c * cc)
            if k == 0:
                return off, -1, nel, False, True, False
            if k < n - 1:
                return off, -1, nel, True, True, False
            if k == n - 1:
                return off, off, nel, True, True, True
            if k < 2 * n - 2:
                return -1, off, nel, True, True, False
            return -1, off, nel, True, False, False
        if coll == 2:  # AllGather: copy_send our block, n-2 recv_copy_send, recv
            if k == 0:
                return base, base + ur[0] * count, cc, False, True, False
            if k < n - 1:
                return -1, base + ur[n - k] * count, cc, True, True, False
            return -1, base + ur[1] * count, cc, True, False, False
        if coll == 3:  # ReduceScatter: send, n-2 recv_reduce_send, recv_reduce_copy into our output
            if k == 0:
                return base + ur[n - 1] * count, -1, cc, False, True, False
            if k < n - 1:
                return base + ur[n - (k + 1)] * count, -1, cc, True, True, False
            return base + ur[0] * count, base, cc, True, False, True
        if coll == 0:  # Broadcast: a pipeline from the root
            if rank == root:
                return base, base, cc, False, True, False
            if ur[1 % n] == root:
                return -1, base, cc, True, False, False
            return -1, base, cc, True, True, False
        if ur[n - 1] == root:  # Reduce: a pipeline towards the root
            return base, -1, cc, False, True, False
        if rank == root:
            return base, base, cc, True, False, True
        return base, -1, cc, True, True, False

    @cuda.jit(device=True)
    def run_ring(P, A, prm, work, ring, rank, ch):
        """``runRing`` of every ring collective: loops over the channel's part; AllReduce's loop covers
        ``nranks * chunkCount`` elements and shrinks its last chunk to ``alignUp(divUp(rem, n), 16 / size)``."""
        n, coll, root = prm[NRANKS], prm[COLL], prm[ROOT]
        ring_ix = ring[rank, ch, 2]
        ur = ring[rank, ch, 3:]
        part_offset, part_count, chunk_count, count = work[ch, 0], work[ch, 1], work[ch, 2], work[ch, 3]
        align = 16 // A[A_OUT].itemsize
        calls = 2 * n - 1 if coll == 4 else (n if coll == 2 or coll == 3 else 1)
        stride = n * chunk_count if coll == 4 else chunk_count
        elem_offset = 0
        while elem_offset < part_count:
            rem = part_count - elem_offset
            cc = chunk_count
            if coll == 4:
                if rem < stride:
                    cc = div_up(div_up(rem, n), align) * align
            else:
                cc = imin(chunk_count, rem)
            for k in range(calls):
                src, dst, nel, rv, sd, post = ring_call(coll, k, n, ring_ix, ur, root, rank,
                                                        part_offset + elem_offset, cc, rem, count)
                if not prim(P, A, prm, src, dst, nel, rv, sd, post, False):
                    return False
            elem_offset += stride
        return True

    @cuda.jit(device=True)
    def tree_split(P, A, prm, work, tree, rank, ch, tid):
        """``runTreeSplit``: build this thread's group's primitives and walk the channel's chunks."""
        steps, ctrl = A[A_STEPS], A[A_CTRL]
        nth = prm[NTHREADS]
        is_root = tree[rank, ch, T_UP] < 0
        leaf = tree[rank, ch, T_DOWN] < 0
        if is_root:
            group, gtid, gth = 0, tid, nth
            prims_init(P, tree[rank, ch, T_FROM_DOWN], tree[rank, ch, T_FROM_DOWN + 1],
                       tree[rank, ch, T_FROM_DOWN + 2], tree[rank, ch, T_TO_DOWN], tree[rank, ch, T_TO_DOWN + 1],
                       tree[rank, ch, T_TO_DOWN + 2], steps, ctrl, 1, 1, group, gtid, gth, ch, rank,
                       rank - prm[RANK_LO], prm[PROTO] == 0, tid)
        elif tid < prm[SPLIT]:
            group, gtid, gth = 1, tid, prm[SPLIT]
            prims_init(P, tree[rank, ch, T_FROM_DOWN], tree[rank, ch, T_FROM_DOWN + 1],
                       tree[rank, ch, T_FROM_DOWN + 2], tree[rank, ch, T_TO_UP], -1, -1, steps, ctrl, 1, 1,
                       group, gtid, gth, ch, rank, rank - prm[RANK_LO], prm[PROTO] == 0, tid)
        else:
            group, gtid, gth = 2, tid - prm[SPLIT], nth - prm[SPLIT]
            prims_init(P, tree[rank, ch, T_FROM_UP], -1, -1, tree[rank, ch, T_TO_DOWN],
                       tree[rank, ch, T_TO_DOWN + 1], tree[rank, ch, T_TO_DOWN + 2], steps, ctrl, 1, 1,
                       group, gtid, gth, ch, rank, rank - prm[RANK_LO], prm[PROTO] == 0, tid)
        off, end, cc = work[ch, 0], work[ch, 0] + work[ch, 1], work[ch, 2]
        # root: recv_reduce_copy_send; reduce group: send (leaf) or recv_reduce_send; broadcast group: recv (leaf)
        # or recv_copy_send
        has_src = group < 2
        recv = group != 1 or not leaf
        send = group != 2 or not leaf
        ok = True
        while off < end and ok:
            ok = prim(P, A, prm, off if has_src else -1, off if group != 1 else -1, imin(cc, end - off), recv, send,
                      group == 0, False)
            off += cc
        if ok:
            prims_finish(P, steps)

    def kernel(prm, work, ring, tree, inp, out, fifo_s, fifo_ll, stage_t, stage_u, fifo_l128, stg_t, stg_w, ctrl,
               steps, conns, bars, abort, scal):
        nth, nch = prm[NTHREADS], prm[NCHANNELS]
        v = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        per_rank = nch * nth
        rank = prm[RANK_LO] + v // per_rank
        ch = (v % per_rank) // nth
        tid = v % nth
        if (prm[ABSENT] >> rank) & 1:  # a rank that never runs (the deadline test)
            return
        A = (inp, out, fifo_s, fifo_ll, stage_t, stage_u, fifo_l128, stg_t, stg_w, ctrl, conns, bars, abort, scal,
             steps)
        P = cuda.local.array(P_WORDS, np.int64)
        for i in range(P_WORDS):
            P[i] = 0
        if prm[ALGO] == 1:
            tree_split(P, A, prm, work, tree, rank, ch, tid)
            return
        prims_init(P, ring[rank, ch, 0], -1, -1, ring[rank, ch, 1], -1, -1, steps, ctrl, prm[SPC], prm[SPS], 0,
                   tid, nth, ch, rank, rank - prm[RANK_LO], prm[PROTO] == 0, tid)
        ok = run_ring(P, A, prm, work, ring, rank, ch)
        if ok:
            prims_finish(P, steps)

    # numba names a cached kernel's index file after its function's qualified name: one name per variant gives each
    # its own file, so the parallel compiles of gpu_check.py never overwrite each other's index
    kernel.__qualname__ = f"kernel_{name}"
    return cuda.jit(cache=True, **({} if SIMULATED else {"max_registers": MAX_REGISTERS}))(kernel)
