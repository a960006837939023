"""From a group's sends and receives to per-round p2p works (NCCL ``src/enqueue.cc``: ``scheduleP2pTasksToPlan``
and ``addP2pToPlan``).

Each round of the p2p schedule (``graph/p2p_schedule.py``) pairs this rank's send to ``send_rank`` with its receive from
``recv_rank``; the round's first queued send and first queued receive become one ``DevWorkP2p``.  Per direction
``add_p2p_to_plan`` picks how many of the peer's channels to stripe over (more for larger sizes, between
``n_channels_min`` and ``n_channels_max``), the protocol (LL when the bytes per channel are at most
NCCL_P2P_LL_THRESHOLD and the connection has LL buffers, never for a self-send), and the chunk size (a Simple
step is ``p2pChunkSize``, an LL step is half an LL FIFO slot of data; smaller over the network for small sizes;
NCCL_CHUNK_SIZE overrides), kept as NCCL keeps it, in 8 bits (``u32fp8``).  Then, per channel part, the steps the
proxy moves (``ncclProxyOp``'s ``nsteps``, ``nbytes``).
Where we differ on purpose: no work batches, budgets or epochs (a plan here never overflows a work FIFO), no
buffer registration, and an NCCL_CHUNK_SIZE larger than a FIFO slot is refused (NCCL would overrun the slot).
"""
from __future__ import annotations

from dataclasses import dataclass

from collectives.include.bitops import div_up, round_up, u32fp8_decode, u32fp8_encode
from collectives.include.device import NCCL_STEPS
from collectives.include.p2p_work import DevWorkP2p, p2p_channel_for_part, p2p_part_bounds
from collectives.misc.param import env_int

from .graph.p2p_schedule import P2pChannels

P2P_LL_THRESHOLD = 16384  # NCCL_P2P_LL_THRESHOLD: LL up to this many bytes per channel
LL_LINE_BYTES = 16        # sizeof(union ncclLLFifoLine)


@dataclass(frozen=True)
class P2pProxyOp:
    """``ncclProxyOp`` of one direction on one channel part (``pattern`` ncclPatternSend / ncclPatternRecv)."""
    channel: int
    is_send: bool
    peer: int
    proto: str
    nsteps: int
    nbytes: int       # bytes of one step (LL: lines, twice the data)
    chunk_size: int


def channel_range(p2p: P2pChannels, nranks: int) -> tuple[int, int]:
    """``scheduleP2pTasksToPlan``'s (nChannelsMin, nChannelsMax): every channel of the peer at most, and at first
    only as many as let every rank's op have channels of its own."""
    n_max = p2p.n_channels_per_peer
    n_min = n_max
    while n_min * nranks > p2p.n_channels and n_min > 1:
        n_min //= 2
    return n_min, n_max


def direction_channels(nbytes: int, step: int, nnodes: int, n_min: int, n_max: int) -> int:
    """How many channels one direction stripes over: parts of at least 1/8 step (1/2 across nodes), doubled while
    a part would exceed 32 steps (1 step across nodes).  A direction with nothing (-1) gets none; 0 bytes, one."""
    if nbytes == -1:
        return 0
    if nbytes == 0:
        return 1
    min_part = step // 2 if nnodes > 1 else step // 8
    max_part = step if nnodes > 1 else step * 32
    n = min(n_min, div_up(nbytes, min_part))
    part = max(min_part, div_up(nbytes, n))
    while part > max_part and n <= n_max // 2:
        n *= 2
        part = div_up(nbytes, n)
    return n


def add_p2p_to_plan(p2p: P2pChannels, rank: int, buff_sizes: dict, n_min: int, n_max: int, p2p_round: int,
                    send_rank: int, send_bytes: int, recv_rank: int, recv_bytes: int,
                    ll_buffers: tuple[bool, bool] = (True, True),
                    network: tuple[bool, bool] = (False, False)) -> tuple[DevWorkP2p, list[P2pProxyOp]]:
    """``addP2pToPlan`` for one round: the work and its proxy ops.  ``send_bytes`` / ``recv_bytes`` of -1: no op
    in that direction; ``ll_buffers`` and ``network`` per direction (recv, send), as NCCL reads them off the round's
    connectors (connIndex 1)."""
    self_send = send_rank == rank
    nbytes = (recv_bytes, send_bytes)  # NCCL's dir index: 0 recv, 1 send
    chunk_param = env_int("NCCL_CHUNK_SIZE", 0)
    threshold = env_int("NCCL_P2P_LL_THRESHOLD", P2P_LL_THRESHOLD)
    nch, ll, fp8, chunk = [0, 0], [False, False], [0, 0], [0, 0]
    for d in (0, 1):
        nch[d] = direction_channels(nbytes[d], p2p.chunk_size, p2p.nnodes, n_min, n_max)
        ll[d] = not self_send and ll_buffers[d]
        if nbytes[d] != -1:
            ll[d] = ll[d] and nbytes[d] <= nch[d] * threshold
        step = p2p.chunk_size if not ll[d] else buff_sizes["LL"] // NCCL_STEPS
        size = step
        if chunk_param:
            size = chunk_param
        elif network[d]:  # smaller chunks keep a small message pipelined over the network
            if not ll[d] and nbytes[d] < step:
                size //= 4
            elif nbytes[d] < 8 * step:
                size //= 2
        data = size // 2 if ll[d] else size  # an LL line carries 8 data bytes in 16
        fp8[d] = u32fp8_encode(data)
        data = u32fp8_decode(fp8[d])
        room = buff_sizes["LL"] // NCCL_STEPS // 2 if ll[d] else buff_sizes["Simple"] // NCCL_STEPS
        if data > room and nbytes[d] != -1:  # NCCL would write past the FIFO slot; we refuse, on every rank alike
            raise ValueError(f"NCCL_CHUNK_SIZE={chunk_param}: a p2p {'LL' if ll[d] else 'Simple'} chunk of {data} "
                             f"bytes exceeds its FIFO slot ({room} bytes)")
        chunk[d] = data * 2 if ll[d] else data
    base = p2p.channel_base_for_round(p2p_round)
    work = DevWorkP2p(p2p.n_channels, base, send_rank, recv_rank, max(send_bytes, 0), max(recv_bytes, 0),
                      nch[1], nch[0], fp8[1], fp8[0], ll[1], ll[0])
    ops = []
    if not self_send:  # a self-send is a copy in the kernel: no connection, no proxy
        for part in range(max(nch)):
            channel = p2p_channel_for_part(p2p.n_channels, base, part)
            for d in (0, 1):
                op = _proxy_op(work, d, part, channel, chunk[d])
                if op is not None:
                    ops.append(op)
    return work, ops


def _proxy_op(work: DevWorkP2p, d: int, part: int, channel: int, chunk_size: int) -> P2pProxyOp | None:
    """The steps of direction ``d`` on one part: one per chunk of the part's bytes, one for an empty op."""
    nparts = work.n_send_channels if d else work.n_recv_channels
    nbytes = work.send_bytes if d else work.recv_bytes
    ll = work.send_proto_ll if d else work.recv_proto_ll
    if nparts <= part:
        return None
    if nbytes == 0:
        nsteps, step_bytes = 1, 0
    else:
        chunk_data = u32fp8_decode(work.send_chunk_u32fp8 if d else work.recv_chunk_u32fp8)
        beg, end = p2p_part_bounds(nparts, part, nbytes)
        nsteps, step_bytes = div_up(end - beg, chunk_data), min(end - beg, chunk_data)
        if nsteps == 0:
            return None  # a part past the end of a small op: nothing on this channel
    if ll:
        step_bytes = round_up(step_bytes * 2, LL_LINE_BYTES)
    return P2pProxyOp(channel, bool(d), work.send_rank if d else work.recv_rank, "LL" if ll else "Simple", nsteps,
                      step_bytes, chunk_size)
