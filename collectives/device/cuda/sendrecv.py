"""Point-to-point in the GPU kernel (NCCL ``src/device/sendrecv.h``: ``RunWorkBatch<ncclFuncSendRecv>::run``,
``runSend``, ``runRecv``; ``src/device/primitives.h``: ``Primitives``' ``directSend`` / ``directRecv`` with
``FanAsymmetric<0, 1>`` / ``<1, 0>``, LL or ``ProtoSimple<1, 1>``).  The host half (which works, which channel, which
part of the bytes) is ``collectives/p2p_threads.py``'s.

One kernel moves bytes (NCCL's SendRecv kernel is ``int8`` only): block ``c`` is channel ``c``; its rows of the
work table are this channel's parts of the rank's works, in the plan's order.  For each work the block's warps
split as ``run`` splits them for a work of its own: ``nWarpPerWork`` warps, of which ``(n - 1) / 2`` (``n / 2`` up
to 4) receive and the rest send, each half a thread group with its own barrier; a work in one direction gives that
direction every warp.  ``runSend`` / ``runRecv``: one primitives object per work on the round's connector
(connIndex 1), loaded from its saved step and saved back at the end, the part cut in chunks (the do-while: an empty
part still moves one empty step).  A send to oneself is ``reduceCopy`` of the part by all of the work's threads.
A channel barrier separates one work from the next (the next primitives load the steps the last ones saved).
Under the simulator a warp is one thread (as LL128's warps are, ``prims_ll128.py``).
Deliberate differences: a channel runs its works one after another, not the up to 8 of a batch side by side
(every rank meets its rounds in the same order, so nothing waits in a circle; ``collectives/p2p.py`` does the
same); the part bounds are computed on the host when the table is made (NCCL's warp 0 does it); no extra Simple
barrier group; a Simple FIFO slot keeps the connector's stride (``buffSize / NCCL_STEPS``) where NCCL strides by
``p2pChunkSize``, as on the CPU path.
"""
from __future__ import annotations

import numpy as np

from .numba_cuda import cuda
from .clock import SIMULATED
from .kernel import MAX_REGISTERS
from .prims import P_WORDS, imin, prims_finish, prims_init
from .prims_ll import make_ll_op
from .prims_simple import make_simple_op
from .reduce_kernel import make_ops
from .sync import group_sync

# prm[]: the launch's parameters
NRANKS, TIMEOUT, NTHREADS, RANK_LO, NCHANNELS, ABSENT, WARP = range(7)
PRM_WORDS = 7
# works[rank, channel, i]: one part of a work on this channel
(W_SEND, W_RECV, W_COPY, W_SEND_CONN, W_RECV_CONN, W_SEND_OFF, W_SEND_BYTES, W_RECV_OFF, W_RECV_BYTES,
 W_SEND_CHUNK, W_RECV_CHUNK, W_SEND_LL, W_RECV_LL) = range(13)
WORK_WORDS = 13
SEND_GROUP, RECV_GROUP, CHANNEL_GROUP = 0, 1, 2  # barrier groups: the work's halves, and the whole channel
ARGS = ("prm", "works", "nworks", "inp", "out", "fifo_s", "fifo_ll", "stage_t", "stage_u", "ctrl", "steps",
        "conns", "bars", "abort", "scal")
PER_RANK_ARGS = ("works", "nworks", "inp", "out", "stage_t", "stage_u", "bars")

_cache: dict = {}


def warp_split(nwarps: int) -> tuple[int, int]:
    """``run``'s (send warps, recv warps) of a work that has ``nwarps`` warps to itself."""
    nrecv = nwarps // 2 if nwarps <= 4 else (nwarps - 1) // 2
    return (nrecv if nwarps <= 4 else nrecv + 1), nrecv


def get_kernel():
    """The SendRecv kernel, made once."""
    if "k" not in _cache:
        _cache["k"] = _make_kernel()
    return _cache["k"]


def _make_kernel():
    fn, premul, postdiv = make_ops("sum", "int", np.uint8)  # one source: nothing is reduced
    simple = make_simple_op(fn, premul, postdiv)
    ll = make_ll_op(fn, premul, postdiv)
    split = cuda.jit(device=True)(warp_split)

    @cuda.jit(device=True)
    def run_dir(P, prm, inp, out, fifo_s, fifo_ll, stage_t, stage_u, ctrl, steps, conns, bars, abort, scal,
                is_send, use_ll, conn, off, nbytes, chunk, grp, gtid, gth, ch, rank, rl, tid):
        """``runSend`` (``directSend`` per chunk) or ``runRecv`` (``directRecv``) of one part; False on abort."""
        if is_send:
            prims_init(P, -1, -1, -1, conn, -1, -1, steps, ctrl, 1, 1, grp, gtid, gth, ch, rank, rl, not use_ll, tid)
        else:
            prims_init(P, conn, -1, -1, -1, -1, -1, steps, ctrl, 1, 1, grp, gtid, gth, ch, rank, rl, not use_ll, tid)
        src = off if is_send else -1
        dst = -1 if is_send else off
        cursor = 0
        while True:
            n = imin(chunk, nbytes - cursor)
            s = src + cursor if is_send else -1
            d = -1 if is_send else dst + cursor
            if use_ll:
                ok = ll(P, inp, out, fifo_ll, stage_t, stage_u, ctrl, conns, bars, abort, scal, prm[NRANKS],
                        prm[TIMEOUT], s, d, n, not is_send, is_send, False, False)
            else:
                ok = simple(P, inp, out, fifo_s, stage_t, stage_u, ctrl, conns, bars, abort, scal, prm[NRANKS],
                            prm[TIMEOUT], s, d, n, not is_send, is_send, False, False)
            if not ok:
                return False
            cursor += n
            if cursor >= nbytes:
                break
        prims_finish(P, steps)
        return True

    def kernel(prm, works, nworks, inp, out, fifo_s, fifo_ll, stage_t, stage_u, ctrl, steps, conns, bars, abort,
               scal):
        nth, nch, warp = prm[NTHREADS], prm[NCHANNELS], prm[WARP]
        v = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        per_rank = nch * nth
        rank = prm[RANK_LO] + v // per_rank
        rl = rank - prm[RANK_LO]
        ch = (v % per_rank) // nth
        tid = v % nth
        if (prm[ABSENT] >> rank) & 1:  # a rank that never runs (the deadline test)
            return
        P = cuda.local.array(P_WORDS, np.int64)
        for i in range(P_WORDS):
            P[i] = 0
        nsend_w, nrecv_w = split(nth // warp)
        for i in range(nworks[rl, ch]):
            has_send, has_recv = works[rl, ch, i, W_SEND] != 0, works[rl, ch, i, W_RECV] != 0
            ok = True
            if works[rl, ch, i, W_COPY] != 0:  # reduceCopy of the part, every thread of the work
                e = tid
                while e < works[rl, ch, i, W_SEND_BYTES]:
                    out[rl, works[rl, ch, i, W_RECV_OFF] + e] = inp[rl, works[rl, ch, i, W_SEND_OFF] + e]
                    e += nth
            else:
                is_send = not has_recv or (has_send and tid < nsend_w * warp)
                gtid, gth, grp = tid, nth, SEND_GROUP
                if has_send and has_recv:
                    if is_send:
                        gth = nsend_w * warp
                    else:
                        gtid, gth, grp = tid - nsend_w * warp, nrecv_w * warp, RECV_GROUP
                if gtid < gth:  # the warps past nWarpPerWork sit this work out
                    d = W_SEND if is_send else W_RECV
                    ok = run_dir(P, prm, inp, out, fifo_s, fifo_ll, stage_t, stage_u, ctrl, steps, conns, bars,
                                 abort, scal, is_send, works[rl, ch, i, W_SEND_LL + d] != 0,
                                 works[rl, ch, i, W_SEND_CONN + d], works[rl, ch, i, W_SEND_OFF + 2 * d],
                                 works[rl, ch, i, W_SEND_BYTES + 2 * d], works[rl, ch, i, W_SEND_CHUNK + d], grp,
                                 gtid, gth, ch, rank, rl, tid)
            if group_sync(bars, rl, ch, CHANNEL_GROUP, nth, not ok, abort):
                return

    kernel.__qualname__ = "kernel_sendrecv"  # its own disk-cache index file (see kernel.py)
    return cuda.jit(cache=True, **({} if SIMULATED else {"max_registers": MAX_REGISTERS}))(kernel)
