"""Point-to-point in the kernel (NCCL ``src/device/sendrecv.h``: ``RunWorkBatch<ncclFuncSendRecv>`` with ``runSend``
and ``runRecv``).

A channel finds its part of each work (``ncclP2pChannelToPart``, ``ncclP2pPartBounds``), then its send and its
receive run side by side as two thread groups: ``run_send`` pushes the part chunk by chunk through a
``FanAsymmetric<0, 1>`` primitives object, ``run_recv`` pulls it through a ``<1, 0>`` one, with LL or
``ProtoSimple<1, 1>`` (one slice of one step per chunk) as the work says.  Every call moves one step, so even an
empty part moves one (empty) step.  A send to oneself is a plain copy (``reduceCopy``), no connection involved.
Where we differ on purpose: the bytes are numpy uint8 views, and a Simple FIFO slot keeps the connector's
stride (``buffSize / NCCL_STEPS``) where NCCL strides by ``p2pChunkSize``: every chunk fits either way, so what
each step carries is the same.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np

from collectives.include.bitops import u32fp8_decode
from collectives.include.p2p_work import DevWorkP2p, p2p_channel_to_part, p2p_part_bounds
from tracing.events import now

from .prims_ll import PrimitivesLL
from .prims_simple import PrimitivesSimple
from .reduce_copy import RedOp, reduce_copy

COPY_OP = RedOp("sum", np.dtype(np.uint8), 1)  # what a self-send's reduceCopy applies: nothing (one source)
SEND_GROUP, RECV_GROUP = 4, 5                  # their thread groups, for the kernel's wait records


def _prims(kernel, ll: bool, channel: int, recv, send, sendbuff, recvbuff, group: int):
    if ll:
        return PrimitivesLL(kernel, channel, recv, send, sendbuff, recvbuff, COPY_OP, group)
    return PrimitivesSimple(kernel, channel, recv, send, sendbuff, recvbuff, COPY_OP, 1, 1, group)


def _chunks(nbytes: int, chunk_size: int) -> Iterator[tuple[int, int]]:
    """(offset, bytes) of each call over a part: whole chunks, the last one short, a single empty call for 0 bytes
    (the do-while of ``runSend`` / ``runRecv``)."""
    cursor = 0
    while True:
        n = min(chunk_size, nbytes - cursor)
        yield cursor, n
        cursor += n
        if cursor >= nbytes:
            break


def run_send(prims, nbytes: int, chunk_size: int) -> Iterator:
    """``runSend``: ``directSend`` of the part, one chunk per call."""
    for offset, n in _chunks(nbytes, chunk_size):
        yield from prims.send(offset, n)


def run_recv(prims, nbytes: int, chunk_size: int) -> Iterator:
    """``runRecv``: ``directRecv`` of the part, one chunk per call."""
    for offset, n in _chunks(nbytes, chunk_size):
        yield from prims.recv(offset, n)


def _copy(work: DevWorkP2p, beg: int, end: int) -> Iterator:
    reduce_copy(COPY_OP, [work.send_buff[beg:end]], [work.recv_buff[beg:end]], pre_op=False, post_op=False)
    return
    yield  # a generator like the others: the kernel steps it once


def channel_works(kernel, channel: int, rank: int, work: DevWorkP2p, send_conn, recv_conn) -> list[Iterator]:
    """The thread groups of ``channel`` for one work: its part of the send and of the receive (the connectors of
    the round's peers on this channel, connIndex 1), or of the copy for a self-send.  With tracing, each part is
    a ``p2p`` record: peer, direction, round, channel, byte range, protocol (``copy`` for a self-send)."""
    out = []
    for is_send in (True, False):
        nparts = work.n_send_channels if is_send else work.n_recv_channels
        part = p2p_channel_to_part(work.n_p2p_channels, work.channel_base, channel)
        if part >= nparts:
            continue
        beg, end = p2p_part_bounds(nparts, part, work.send_bytes if is_send else work.recv_bytes)
        if work.send_rank == rank:  # a copy: the send half does it, over the send's parts
            if is_send:
                out.append(_traced(_copy(work, beg, end), kernel, channel, rank, True, work, beg, end, "copy"))
            continue
        ll = work.send_proto_ll if is_send else work.recv_proto_ll
        chunk = u32fp8_decode(work.send_chunk_u32fp8 if is_send else work.recv_chunk_u32fp8)
        if is_send:
            buff = work.send_buff[beg:end]
            prims = _prims(kernel, ll, channel, None, send_conn, buff, buff, SEND_GROUP)
            gen = prims.finished(run_send(prims, end - beg, chunk))
        else:
            buff = work.recv_buff[beg:end]
            prims = _prims(kernel, ll, channel, recv_conn, None, buff, buff, RECV_GROUP)
            gen = prims.finished(run_recv(prims, end - beg, chunk))
        out.append(_traced(gen, kernel, channel, work.send_rank if is_send else work.recv_rank, is_send, work, beg,
                           end, "LL" if ll else "Simple"))
    return out


def _traced(gen: Iterator, kernel, channel: int, peer: int, is_send: bool, work: DevWorkP2p, beg: int, end: int,
            proto: str) -> Iterator:
    """Without a tracer, ``gen`` itself; with one, ``gen`` run and recorded as a ``p2p`` event of the plan the
    kernel is running (the id the tracer gives it when it ends)."""
    tracer = kernel.tracer
    if tracer is None:
        return gen
    return _record(gen, tracer, channel, peer, is_send, work.p2p_round, beg, end - beg, proto)


def _record(gen: Iterator, tracer, channel: int, peer: int, is_send: bool, rnd: int, offset: int, nbytes: int,
            proto: str) -> Iterator:
    t0 = now()
    yield from gen
    tracer.add("p2p", tracer.plans, channel, peer, is_send, rnd, offset, nbytes, proto, t0, now())
