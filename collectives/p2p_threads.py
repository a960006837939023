"""A group of sends and receives on every rank of a ``ThreadComm``, as one SendRecv launch (NCCL ``src/group.cc``:
``groupLaunch``; ``src/enqueue.cc``: ``scheduleP2pTasksToPlan``, ``addP2pToPlan``, ``ncclLaunchKernel``;
``src/transport.cc``: ``ncclTransportP2pConnect`` / ``ncclTransportP2pSetup``; ``src/collectives.cc``:
``ncclAlltoAll``, ``ncclGather``, ``ncclScatter`` as groups of sends and receives).

Nothing of NCCL's planning is redone here: each rank's queue goes through the CPU path's planner
(``collectives/p2p.py``'s ``P2p``: ``p2pTaskAppend``, ``scheduleP2pTasksToPlan`` over ``p2pSchedule`` with
``addP2pToPlan``'s channels, protocol and chunk size) and its connection rule (``P2p.missing``: every channel of a
new peer's round).  This module turns the resulting ``ncclDevWorkP2p`` list into the kernel's table: per rank and
channel the parts of its works (``ncclP2pChannelForPart``, ``ncclP2pPartBounds``), with the rows of the round's
connectors, the offsets of the user's bytes in the rank's packed send and receive rows, and the protocol and chunk
size of each direction (``u32fp8Decode``).
It sits above the device layer (``collectives/device/cuda/threads.py``'s ``ThreadComm`` holds the memory and
launches; this module plans with the communicator layer's ``P2p``), so the GPU wing's imports still point down.
An ``op`` is ``("send", array, peer)`` or ``("recv", array, peer)``; the arrays are host numpy arrays (a receive
buffer is written in place after the launch).
"""
from __future__ import annotations

import numpy as np

from collectives.include.bitops import u32fp8_decode
from collectives.include.device import NCCL_MAX_NTHREADS, WARP_SIZE
from collectives.include.p2p_work import DevWorkP2p, p2p_part_bounds
from collectives.misc.param import timeout_s
from collectives.p2p import P2p
from collectives.graph.p2p_schedule import P2pChannels

from collectives.device.common import CollectiveError
from collectives.device.cuda import sendrecv as S
from collectives.device.cuda.call import abort_line
from collectives.device.cuda.clock import SIMULATED
from collectives.device.cuda.p2p_conns import P2pConnectors


def _bytes(arr: np.ndarray) -> np.ndarray:
    """The user's buffer as a uint8 view of its own memory (a receive is written through it)."""
    if not isinstance(arr, np.ndarray) or not arr.flags.c_contiguous:
        raise ValueError("run_p2p: buffers are C-contiguous numpy arrays")
    return arr.reshape(-1).view(np.uint8)


def plan_rank(rank: int, nranks: int, channels: P2pChannels, schedule: list, buff: dict,
              ops: list) -> tuple[list[DevWorkP2p], list]:
    """One rank's works (the CPU planner's) and the (channel, sender, receiver) edges its peers need."""
    q = P2p(rank, nranks, channels, schedule, buff)
    for kind, arr, peer in ops:
        if kind not in ("send", "recv") or not 0 <= peer < nranks:
            raise ValueError(f"rank {rank}: bad p2p op ({kind!r}, peer {peer}) of {nranks} ranks")
        q.append(kind == "send", _bytes(arr), peer)
    edges = [(c, rank, peer) if d == "send" else (c, peer, rank)
             for peer, dirs in q.missing().items() for d, chans in dirs.items() for c in chans]
    return [w for w, _ in q.plan()], edges


class P2pTable:
    """The kernel's work table and packed buffers of one launch (host numpy)."""

    def __init__(self, nranks: int, nchannels: int, works: list[list[DevWorkP2p]], conns: P2pConnectors):
        self.n, self.nch = nranks, nchannels
        # the user's bytes, packed per rank: send buffers in one row, receive buffers in another
        self.inp_at: list[dict] = [{} for _ in range(nranks)]
        self.out_at: list[dict] = [{} for _ in range(nranks)]
        self.recv_buffs: list[list] = [[] for _ in range(nranks)]
        sizes = [[0, 0] for _ in range(nranks)]
        for r, ws in enumerate(works):
            for w in ws:
                for buff, at, k in ((w.send_buff, self.inp_at[r], 0), (w.recv_buff, self.out_at[r], 1)):
                    if buff is not None and id(buff) not in at:
                        at[id(buff)] = sizes[r][k]
                        sizes[r][k] += len(buff)
                        if k:
                            self.recv_buffs[r].append(buff)
        self.inp = np.zeros((nranks, max(1, max(s[0] for s in sizes))), np.uint8)
        self.out = np.full((nranks, max(1, max(s[1] for s in sizes))), 0xA5, np.uint8)
        for r, ws in enumerate(works):
            for w in ws:
                if w.send_buff is not None:
                    o = self.inp_at[r][id(w.send_buff)]
                    self.inp[r, o:o + len(w.send_buff)] = w.send_buff
        rows = [[[] for _ in range(nchannels)] for _ in range(nranks)]
        for r, ws in enumerate(works):
            for w in ws:
                for part in range(max(w.n_send_channels, w.n_recv_channels)):
                    c = (w.channel_base + part) & (w.n_p2p_channels - 1)  # ncclP2pChannelForPart
                    rows[r][c].append(self._row(r, c, part, w, conns))
        most = max(1, max(len(x) for per in rows for x in per))
        self.works = np.zeros((nranks, nchannels, most, S.WORK_WORDS), np.int64)
        self.nworks = np.zeros((nranks, nchannels), np.int64)
        for r in range(nranks):
            for c in range(nchannels):
                self.nworks[r, c] = len(rows[r][c])
                for i, row in enumerate(rows[r][c]):
                    self.works[r, c, i] = row

    def _row(self, rank: int, channel: int, part: int, w: DevWorkP2p, conns: P2pConnectors) -> np.ndarray:
        """One part of ``w`` on ``channel``: each direction's part bounds, connector, protocol and chunk."""
        row = np.zeros(S.WORK_WORDS, np.int64)
        copy = w.send_rank == rank
        row[S.W_COPY] = copy
        for d, (nparts, nbytes, buff, at) in enumerate(((w.n_send_channels, w.send_bytes, w.send_buff,
                                                         self.inp_at[rank]),
                                                        (w.n_recv_channels, w.recv_bytes, w.recv_buff,
                                                         self.out_at[rank]))):
            if part >= nparts or buff is None:
                continue
            beg, end = p2p_part_bounds(nparts, part, nbytes)
            row[S.W_SEND + d] = 1
            row[S.W_SEND_OFF + 2 * d] = at[id(buff)] + beg
            row[S.W_SEND_BYTES + 2 * d] = end - beg
            row[S.W_SEND_LL + d] = w.send_proto_ll if d == 0 else w.recv_proto_ll
            row[S.W_SEND_CHUNK + d] = u32fp8_decode(w.send_chunk_u32fp8 if d == 0 else w.recv_chunk_u32fp8)
            if not copy:
                row[S.W_SEND_CONN + d] = (conns.row(channel, rank, w.send_rank) if d == 0 else
                                          conns.row(channel, w.recv_rank, rank))
        if copy:  # the copy writes the receive buffer at the send part's offset (the same bytes on both sides)
            row[S.W_RECV_OFF] = self.out_at[rank][id(w.recv_buff)] + (row[S.W_SEND_OFF] - self.inp_at[rank][
                id(w.send_buff)])
        return row

    def write_back(self, out_host: np.ndarray) -> None:
        """Each receive buffer gets its bytes from the rank's packed row."""
        for r in range(self.n):
            for buff in self.recv_buffs[r]:
                o = self.out_at[r][id(buff)]
                buff[...] = out_host[r, o:o + len(buff)]


def _launch(tc, ops_per_rank: list[list], absent: tuple = ()) -> list[list[DevWorkP2p]]:
    """Plan every rank's group, connect the new pairs, run one SendRecv launch of all ranks, write the receive
    buffers; returns each rank's works (what the planner chose).  ``absent``: ranks whose kernel returns at once."""
    n, d = tc.n, tc.dev
    if len(ops_per_rank) != n:
        raise ValueError(f"run_p2p: {len(ops_per_rank)} op lists for {n} ranks")
    plans = [plan_rank(r, n, tc.p2p_channels, tc.p2p_schedules[r], tc.buff, ops_per_rank[r]) for r in range(n)]
    tc.p2p.connect([e for _, edges in plans for e in edges])
    works = [w for w, _ in plans]
    table = P2pTable(n, tc.p2p_channels.n_channels, works, tc.p2p)
    tc.op_count += 1
    if not table.nworks.any():
        return works
    nch = tc.p2p_channels.n_channels
    nth = tc.nthreads or NCCL_MAX_NTHREADS  # scheduleP2pTasksToPlan: NCCL_MAX_NTHREADS per block
    if nth // (1 if SIMULATED else WARP_SIZE) < 2:  # a work's send and recv halves need a warp each
        raise ValueError(f"SendRecv: {nth} threads per block leave a work's send or receive no warp "
                         f"(NCCLLAB_SIM_THREADS must be at least 2)")
    mem = tc.p2p_memory(nch)
    pool = tc.p2p.pool
    prm = np.array([n, int(timeout_s() * 1e9), nth, 0, nch, sum(1 << r for r in absent),
                    1 if SIMULATED else WARP_SIZE], np.int64)  # the simulator plays a warp per thread
    inp, out = d.to_device(table.inp), d.to_device(table.out)
    args = [d.to_device(table.works), d.to_device(table.nworks), inp, out, pool["fifo_s"], pool["fifo_ll"],
            mem.stage, mem.stage.view(np.uint32), pool["ctrl"], pool["steps"], tc.p2p.conns, mem.bars,
            pool["abort"], d.to_device(np.zeros(1, np.uint8))]
    pool["abort"][:] = 0
    mem.bars[:] = 0
    d.synchronize()
    kernel = S.get_kernel()
    if d.name == "cudasim":
        kernel[1, n * nch * nth](d.to_device(prm), *args)
    else:  # pragma: no cover - needs a GPU
        tc.launch_ranks(kernel, nch, nth, _per_rank(d, kernel, prm, args, n, nch, nth))
    abort = np.asarray(d.to_host(pool["abort"]))
    if abort[0]:
        raise CollectiveError(abort_line("SendRecv", tc.op_count - 1, abort, groups={}))
    table.write_back(np.asarray(d.to_host(out)))
    return works


def _per_rank(d, kernel, prm, args, n: int, nch: int, nth: int) -> list:  # pragma: no cover - needs a GPU
    """Each rank's stream and kernel arguments (its own rows of the per-rank arrays), after the residency check."""
    from collectives.device.cuda.occupancy import check_launch
    from collectives.device.cuda.threads import per_rank_args
    per_rank = per_rank_args(d, n, prm, args, S.RANK_LO, S.ARGS, S.PER_RANK_ARGS)
    check_launch(kernel, per_rank[0][2], n * nch, nth, f"{n} ranks as threads (SendRecv)")
    return per_rank


def all_to_all_ops(xs: list[np.ndarray]) -> tuple[list[list], list[np.ndarray]]:
    """``ncclAlltoAll``: block q of rank r's input to rank q, a send and a recv per peer, self included."""
    n = len(xs)
    count = xs[0].size // n
    outs = [np.full(x.size * x.itemsize, 0xA5, np.uint8).view(x.dtype) for x in xs]
    ops = [[op for q in range(n) for op in (("send", xs[r].reshape(-1)[q * count:(q + 1) * count], q),
                                              ("recv", outs[r][q * count:(q + 1) * count], q))] for r in range(n)]
    return ops, outs


def gather_ops(xs: list[np.ndarray], root: int) -> tuple[list[list], np.ndarray]:
    """``ncclGather``: every rank sends to ``root``, which receives rank r's at block r, itself included."""
    n, count = len(xs), xs[0].size
    out = np.full(n * count * xs[0].itemsize, 0xA5, np.uint8).view(xs[0].dtype)
    ops = [[("send", xs[r], root)] for r in range(n)]
    ops[root] += [("recv", out[r * count:(r + 1) * count], r) for r in range(n)]
    return ops, out


def scatter_ops(x: np.ndarray, root: int, n: int) -> tuple[list[list], list[np.ndarray]]:
    """``ncclScatter``: the root sends block r of ``x`` to rank r, itself included; each rank receives one."""
    count = x.size // n
    outs = [np.full(count * x.itemsize, 0xA5, np.uint8).view(x.dtype) for _ in range(n)]
    ops = [[("recv", outs[r], root)] for r in range(n)]
    ops[root] = [("send", x.reshape(-1)[r * count:(r + 1) * count], r) for r in range(n)] + ops[root]
    return ops, outs


def run_p2p(tc, ops_per_rank: list[list], absent: tuple = ()) -> list[list[DevWorkP2p]]:
    """Each rank's group of ``("send" | "recv", numpy array, peer)`` ops on ``ThreadComm`` ``tc`` as one SendRecv
    launch; receive buffers are written in place.  Returns each rank's ``DevWorkP2p`` list (the plan that ran)."""
    if tc.p2p is None:  # connIndex 1's connectors, made at the first p2p launch (``ncclTransportP2pSetup``)
        tc.p2p = P2pConnectors(tc.dev, tc.buff)
    return _launch(tc, ops_per_rank, absent)


def all_to_all(tc, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """``ncclAlltoAll`` over every rank's input (``n * count`` elements); each rank's output."""
    ops, outs = all_to_all_ops(inputs)
    run_p2p(tc, ops)
    return outs


def gather(tc, inputs: list[np.ndarray], root: int) -> np.ndarray:
    """``ncclGather``: the root's output, rank r's input at block r."""
    ops, out = gather_ops(inputs, root)
    run_p2p(tc, ops)
    return out


def scatter(tc, x: np.ndarray, root: int) -> list[np.ndarray]:
    """``ncclScatter`` of the root's ``x`` (``n * count`` elements); each rank's block."""
    ops, outs = scatter_ops(x, root, tc.n)
    run_p2p(tc, ops)
    return outs
