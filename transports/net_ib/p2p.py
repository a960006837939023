"""The data path (NCCL ``src/transport/net_ib/p2p.cc``: ``ncclIbIrecv``, ``ncclIbPostFifo``, ``ncclIbIsend``,
``ncclIbMultiSend``, ``ncclIbTest``).

Receiver, ``irecv``: post one receive WR (wr_id = slot) on every QP the request will use, fill the local shadow of
FIFO slot ``fifoHead % 256`` with ``{addr, size, rkey, nreqs, tag, idx = fifoHead + 1}`` and RDMA-write it into
the sender's CTS FIFO (on the comm's first QP, signaled only for slot 0 so the send queue drains).
Sender, ``isend``: no request until that slot's ``idx`` reads ``fifoHead + 1``; then match the tag, clamp the size
to the receive size, and write the data: on one QP per request chosen round-robin, or (``NCCL_IB_SPLIT_DATA_ON_QPS``)
cut over all QPs in chunks rounded up to 128 bytes.  On each QP the last WR is an RDMA_WRITE_WITH_IMM whose
immediate is the size (big-endian); with adaptive routing on and more than ``NCCL_IB_AR_THRESHOLD`` bytes, the
data goes as RDMA_WRITE followed by a zero-byte WRITE_WITH_IMM, so the immediate cannot overtake the data.
``test`` polls the CQ: one completion per QP used ends a request; a receive completion's immediate gives the size;
a bad status is NCCL's ``Got completion from peer`` WARN and an error.
We post WRs one by one (NCCL chains them), and implement one receive per irecv (NCCL up to 8, ``nreqs``).
"""
from __future__ import annotations

import time

from tracing import debug

from ..net_plugin import NetError
from ..verbs import WC_OPCODE_STR, WC_STATUS_STR
from .common import (IB_WRITE_CHUNK_ALIGNMENT, NCCL_NET_IB_MAX_RECVS, NET_IB_MAX_REQUESTS, REQ_RECV, REQ_SEND,
                     SEND_FIFO, IbRequest, be32toh, htobe32)
from .reg import address_of


def _trace(comm, event: str, slot: int, qp: int, nbytes: int) -> None:
    if comm.trace is not None:
        tracer, seq, channel, peer = comm.trace
        t = time.monotonic_ns()
        tracer.add("net_ib", seq, channel, peer, comm.is_send, event, slot, qp, nbytes, t, t)


def irecv(comm, bufs: list, sizes: list, tags: list, mhandles: list):
    if not comm.progress_connect():
        return None
    n = len(bufs)
    if n != 1:
        raise NetError(f"NET/IB : {n} receives in one irecv: only 1 is implemented (NCCL allows "
                       f"{NCCL_NET_IB_MAX_RECVS})")
    slot = comm.fifo_head % NET_IB_MAX_REQUESTS
    if comm.reqs[slot] is not None:
        return None  # all 256 requests in use
    V = comm.V
    req = IbRequest(comm, comm.fifo_head, REQ_RECV, n)
    comm.reqs[slot] = req
    for i in range(comm.nqps_per_request()):
        _, qp = comm.qp_for_request(req.id, i)
        qp.post_recv(V.RecvWR(wr_id=slot, num_sge=1, sg=[comm.recv_sge]))
        req.events += 1
    mr = mhandles[0] if mhandles[0] is not None else comm.mrs.lookup(bufs[0])
    elem = comm.elems[slot]
    # an empty view has no address: NCCL's empty slice of a registered buffer points at the channel's start of
    # it (recvbuff + gridOffset); for 0 bytes any address inside the MR does, so we give the MR's base
    elem["addr"][0], elem["size"][0], elem["nreqs"][0], elem["tag"][0] = address_of(bufs[0]) or mr.buf, sizes[0], n, \
        tags[0]
    elem["rkeys"][0, 0] = mr.rkey
    elem["idx"][0] = comm.fifo_head + 1
    post_fifo(comm, req, slot)
    comm.stats["requests"] += 1
    comm.fifo_head += 1
    return req


def post_fifo(comm, req: IbRequest, slot: int) -> None:
    """``ncclIbPostFifo``: RDMA-write our FIFO entry into the sender's CTS FIFO."""
    V, e = comm.V, comm.V.e
    offset = slot * NCCL_NET_IB_MAX_RECVS * SEND_FIFO.itemsize
    flags = e.IBV_SEND_INLINE if comm.params.use_inline else 0
    if slot == 0:  # NCCL: slot == devIndex; our comm has one device, index 0
        flags |= e.IBV_SEND_SIGNALED
    sge = V.SGE(comm.elems.ctypes.data + offset, req.nreqs * SEND_FIFO.itemsize, comm.elems_mr.lkey)
    wr = V.SendWR(wr_id=slot, opcode=e.IBV_WR_RDMA_WRITE, num_sge=1, sg=[sge], send_flags=flags)
    wr.set_wr_rdma(comm.rem_fifo_rkey, comm.rem_fifo_addr + offset)
    comm.qps[0].post_send(wr)
    comm.stats["cts"] += 1
    _trace(comm, "cts_posted", slot, 0, SEND_FIFO.itemsize)


def isend(comm, buf: memoryview, size: int, tag: int, mhandle):
    if not comm.progress_connect():
        return None
    slot = comm.fifo_head % NET_IB_MAX_REQUESTS
    idx = comm.fifo_head + 1
    if int(comm.fifo_idx[slot]) != idx:
        return None  # the receiver has not posted this receive yet
    cts = comm.cts_fifo[slot]
    nreqs = int(cts["nreqs"][0])
    if nreqs != 1:
        raise NetError(f"NET/IB : peer {comm.peer} posted a {nreqs}-receive request: only 1 is implemented")
    if comm.reqs[slot] is not None or int(cts["tag"][0]) != tag:
        return None
    size = min(size, int(cts["size"][0]))
    addr, rkey = int(cts["addr"][0]), int(cts["rkeys"][0, 0])
    if addr == 0 or rkey == 0:
        raise NetError(f"NET/IB : req 0/{nreqs} tag {tag:x} peer {comm.peer} posted incorrect receive info: size "
                       f"{int(cts['size'][0])} addr {addr:x} rkeys[0]={rkey:x}")
    _trace(comm, "cts_seen", slot, 0, size)
    req = IbRequest(comm, comm.fifo_head, REQ_SEND, nreqs)
    mr = mhandle if mhandle is not None else comm.mrs.lookup(buf)
    req.size, req.addr, req.lkey = size, address_of(buf) or mr.buf, mr.lkey  # an empty view has no address
    req.events = comm.nqps_per_request()
    comm.reqs[slot] = req
    multi_send(comm, slot, req, addr, rkey)
    comm.stats["requests"] += 1
    comm.fifo_head += 1
    return req


def multi_send(comm, slot: int, req: IbRequest, raddr: int, rkey: int) -> None:
    """``ncclIbMultiSend`` for one receive: the data WRs on each QP the request uses, the last with the IMM."""
    V, e = comm.V, comm.V.e
    nqps = comm.nqps_per_request()
    chunk = -(-(-(-req.size // nqps)) // IB_WRITE_CHUNK_ALIGNMENT) * IB_WRITE_CHUNK_ALIGNMENT
    imm = htobe32(req.size)
    use_ar = comm.ar and req.size > comm.params.ar_threshold
    offset = 0
    for i in range(nqps):
        qpi, qp = comm.qp_for_request(req.id, i)
        length = min(req.size - offset, chunk)
        sge = V.SGE(req.addr + offset, length, req.lkey)
        if use_ar:
            wr = V.SendWR(wr_id=slot, opcode=e.IBV_WR_RDMA_WRITE, num_sge=1, sg=[sge], send_flags=0)
            wr.set_wr_rdma(rkey, raddr + offset)
            qp.post_send(wr)
            sge = V.SGE(req.addr, 0, req.lkey)  # the zero-byte write that carries the immediate
            last = V.SendWR(wr_id=slot, opcode=e.IBV_WR_RDMA_WRITE_WITH_IMM, num_sge=1, imm_data=imm, sg=[sge],
                            send_flags=e.IBV_SEND_SIGNALED)
            last.set_wr_rdma(0, 0)
            comm.stats["data_wrs"] += 1
        else:
            last = V.SendWR(wr_id=slot, opcode=e.IBV_WR_RDMA_WRITE_WITH_IMM, num_sge=1, imm_data=imm, sg=[sge],
                            send_flags=e.IBV_SEND_SIGNALED)
            last.set_wr_rdma(rkey, raddr + offset)
        qp.post_send(last)
        comm.stats["data_wrs"] += 1
        comm.stats["imm_wrs"] += 1
        comm.stats["chunks"].append(length)
        _trace(comm, "wr_posted", slot, qpi, length)
        offset += length


def test(req: IbRequest) -> tuple[bool, int]:
    comm = req.comm
    e = comm.V.e
    while req.events > 0:
        n, wcs = comm.cq.poll(4)
        if not n:
            return False, 0
        for wc in wcs:
            if wc.status != e.IBV_WC_SUCCESS:
                msg = (f"NET/IB : Got completion from peer {comm.peer} with status="
                       f"{WC_STATUS_STR.get(wc.status, 'unknown')}({wc.status}) opcode="
                       f"{WC_OPCODE_STR.get(wc.opcode, '?')}({wc.opcode}) vendor_err={wc.vendor_err} "
                       f"hca {comm.dev.name}")
                debug.warn(msg)
                raise NetError(msg)
            _completion(comm, wc)
    comm.reqs[req.slot] = None
    return True, req.size


def _completion(comm, wc) -> None:
    """``ncclIbCompletionEventProcess``: which request a completion belongs to, and what it says."""
    e = comm.V.e
    if comm.is_send:
        r = comm.reqs[wc.wr_id & 0xFF]
    elif wc.opcode == e.IBV_WC_RECV_RDMA_WITH_IMM:
        r = comm.reqs[wc.wr_id]
        if r is not None:
            r.size = be32toh(wc.imm_data)
    else:
        return  # the completion of a signaled CTS write
    if r is None:
        raise NetError(f"NET/IB : completion from peer {comm.peer} matches no request (wr_id {wc.wr_id})")
    r.events -= 1
    _trace(comm, "completion", r.slot, wc.qp_num, r.size)
