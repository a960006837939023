"""One collective as the persistent kernel takes it (NCCL ``src/enqueue.cc``: ``scheduleCollTasksToPlan`` fills
``ncclDevWorkColl`` and ``ncclLaunchKernel`` launches ``ncclDevKernel_*`` with it).

``make_call`` turns a schedule (``enqueue.schedule_coll``'s plan) into the kernel's parameter words, the work rows of
its channels, the pre-multiplier of ``avg``/``premulsum`` and the kernel specialised for the op and element kind.
Both ways of running ranks use it: threads of one process (``threads.py``) and one rank per process
(``rank.py``).  ``abort_line`` words a deadline the kernel hit, from the abort record.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from collectives.device.reduce_copy import RedOp
from collectives.misc.param import timeout_s

from . import kernel as K
from .clock import SIMULATED
from .reduce_kernel import kind_of
from .sync import WHAT_NAMES

GROUP_NAMES = {0: "", 1: " (tree reduce)", 2: " (tree broadcast)"}
BYTE_FUNCS = ("AllGather", "Broadcast")  # NCCL retypes these as int8: they move bytes


@dataclass
class Call:
    kernel: object
    prm: np.ndarray      # int64[K.PRM_WORDS]
    work: np.ndarray     # int64[nch, 4]: part offset, part count, chunk count, count
    scal: np.ndarray     # [1] of the kernel's element type: the pre-multiplier
    kdt: np.dtype        # the element type the kernel sees
    nch: int
    nthreads: int


def check(func: str, proto: str, algo: str) -> None:
    if func not in K.COLLS or proto not in K.PROTOS or algo not in K.ALGOS:
        raise ValueError(f"{func}/{algo}/{proto}: the GPU kernels run the five ring collectives and Tree "
                         f"AllReduce, protocols Simple, LL and LL128")
    if algo == "Tree" and func != "AllReduce":
        raise ValueError(f"{func}: only AllReduce has a Tree algorithm")


def kernel_dtype(func: str, dtype) -> np.dtype:
    """What the kernel computes in: bytes for AllGather and Broadcast, bfloat16's bits as uint16."""
    if func in BYTE_FUNCS:
        return np.dtype(np.uint8)
    return np.dtype(np.uint16) if kind_of(dtype) == "bf16" else np.dtype(dtype)


def tree_split(nthreads: int, proto: str) -> int:
    """``runTreeSplit``'s reduce group: Simple ``nthreads / 2`` (+ 64 from 256 on: 384 of 640), LL and LL128 70 %
    in whole warps (448 of 640).  The simulator's few threads keep the proportion without whole warps."""
    if proto == "Simple":
        half = nthreads // 2
        return max(1, half + 64 if half >= 256 else half)
    split = nthreads * 7 // (10 * 32) * 32
    return split if split > 0 else max(1, nthreads * 7 // 10)


def make_call(func: str, dtype, op: str, nranks: int, root: int, plan, chunk_slice: tuple[int, int],
              nthreads: int, rank_lo: int = 0, absent: tuple = ()) -> Call:
    """The launch of ``plan`` (one work per channel), for ranks ``rank_lo`` onwards; ``chunk_slice``: its
    ``calcCollChunking`` chunk and slice steps (``Plan.chunk_steps``, ``slice_steps``); ``nthreads``: the block
    size (``rank.block_threads``: NCCL's, on a GPU)."""
    check(func, plan.proto, plan.algo)
    dtype, kdt = np.dtype(dtype), kernel_dtype(func, dtype)
    work = np.array([[w.part_offset, w.part_count, w.chunk_count, w.count] for w in plan.works], np.int64)
    nch = plan.nchannels
    spc, sps = chunk_slice[0] // chunk_slice[1], chunk_slice[1]  # slices per chunk, steps per slice
    split = tree_split(nthreads, plan.proto)
    if not SIMULATED and (nthreads % 32 or (plan.algo == "Tree" and split % 32)):
        raise ValueError(f"{nthreads} threads per channel: the GPU kernels need whole warps (named barriers and "
                         f"LL128 work in multiples of 32)")
    prm = np.array([K.COLLS[func], K.PROTOS[plan.proto], nranks, root, int(timeout_s() * 1e9), nthreads, rank_lo,
                    nch, K.ALGOS[plan.algo], spc, sps, split, sum(1 << r for r in absent)], np.int64)
    redop = RedOp(op, dtype, nranks)
    scal = np.zeros(1, kdt)
    if func not in BYTE_FUNCS and redop.premul is not None:
        scal = np.array([redop.premul]).astype(dtype).view(kdt)
    kind = kind_of(dtype) if kdt != np.uint8 else "int"
    kern = K.get_kernel(op if func not in BYTE_FUNCS else "sum", kind, kdt, plan.proto)
    return Call(kern, prm, work, scal, kdt, nch, nthreads)


def kernel_args(call: Call, mem, pool: dict, inp, out, to_device) -> list:
    """The kernel's arguments after ``prm``, in ``kernel.ARGS``' order: the work rows, the tables, the user's
    buffers (rows of the kernel's element type), the pool's FIFOs, the launch's LL and LL128 staging, the pool's
    counters, the barriers, the abort record and the pre-multiplier.  ``mem``: ``layout.LaunchMemory``; ``pool``:
    ``PoolLayout.views``."""
    kdt = call.kdt
    return [to_device(call.work), mem.ring, mem.tree, inp, out, pool["fifo_s"].view(kdt), pool["fifo_ll"],
            mem.stage.view(kdt), mem.stage.view(np.uint32), pool["fifo_ll128"], mem.stage128.view(kdt),
            mem.stage128.view(np.uint64), pool["ctrl"], pool["steps"], mem.conns, mem.bars, pool["abort"],
            to_device(call.scal)]


def abort_line(func: str, op_count: int, abort, groups: dict | None = None) -> str:
    """The one-line error of a wait that ran past its deadline: ``abort`` is ``[1, rank, channel, step, peer,
    what, group, claimed]`` as ``sync.wait_ge`` wrote it; ``groups`` names the thread groups (the collectives'
    by default; SendRecv's need none: the wait says which side it is)."""
    rank, ch, step, peer, what, group = (int(v) for v in abort[1:7])
    label = (GROUP_NAMES if groups is None else groups).get(group, "")
    side = (f"head from rank {peer} (send credit)" if what == 1 else
            f"{WHAT_NAMES[what]} from rank {peer} (recv)")
    return (f"rank {rank}: {func} (opCount {op_count}) made no progress for {timeout_s():g} s "
            f"(NCCLLAB_TIMEOUT): channel {ch}{label} step {step} waiting for {side}")
