"""Connection set-up (NCCL ``src/transport/net_ib/connect.cc``: ``ncclIbListen``, ``ncclIbConnectImpl``,
``ncclIbAcceptImpl``, ``ncclIbCreateQp``, ``ncclIbRtrQp``, ``ncclIbRtsQp``).

The sender connects to the receiver's listening socket (the handle), opens ``NCCL_IB_QPS_PER_CONNECTION`` RC
QPs (INIT) and sends its metadata: QP numbers, LID, GID, MTU, link layer, and the address and rkey of its CTS
FIFO.  The receiver opens as many QPs, moves them INIT -> RTR -> RTS towards the sender's, and answers with its
own metadata.  The sender moves its QPs the same way and sends "ready"; only then does the receiver post CTS
entries.  As in NCCL, the steps after the first message do not block: a comm that is not ready yet makes
``isend``/``irecv`` return no request (NCCL returns a NULL comm from connect/accept instead; our interface
returns the comm at once because every rank connects all its sends before accepting).
Every message is a fixed layout (``META``, NCCL's ``struct ncclIbConnectionMetadata`` with its
``NCCL_IB_MAX_QPS`` slots), and the OOB socket starts with the handshake (``ncclSocketTypeNetIb``) under a magic
that the listen handle carries (random per listener, as for NET/Socket: ``net_socket.socket_magic``); the listener
drops strangers and goes on accepting.
QP attributes are NCCL's: ``min_rnr_timer`` 12, ``max_dest_rd_atomic`` 1, ``timeout`` NCCL_IB_TIMEOUT,
``retry_cnt`` NCCL_IB_RETRY_CNT, ``rnr_retry`` 7, ``sq_sig_all`` 0; GRH with ``hop_limit`` 255 on RoCE.
"""
from __future__ import annotations

import socket
import struct

from collectives.misc import sockets
from collectives.misc.listener import SOCKET_TYPE_NET_IB, Listener, hello
from tracing import debug

from ..net_plugin import NetError
from ..net_socket import socket_magic
from .common import NCCL_IB_MAX_QPS, NCCL_NET_IB_MAX_RECVS, NET_IB_MAX_REQUESTS, SEND_FIFO, aligned_zeros

HANDLE = struct.Struct("<H16sQ")  # ncclIbHandle: the listener's port, IPv4 address and magic
# lid, mtu, link layer, ndevs, GID (text), CTS FIFO address and rkey, QP count, then NCCL_IB_MAX_QPS QP numbers
META = struct.Struct(f"<HIBB46sQIH{NCCL_IB_MAX_QPS}I")
from .reg import MrCache


def peer_name(sock: socket.socket) -> str:
    host, port = sock.getpeername()[:2]
    return f"{host}<{port}>"  # ncclSocketToString's form


class IbCommBase:
    """``struct ncclIbNetCommBase`` for one device: QPs, CQ, FIFO head, requests, MR cache."""

    def __init__(self, net, dev, sock: socket.socket, is_send: bool):
        self.net, self.V, self.dev, self.sock, self.is_send = net, net.V, dev, sock, is_send
        self.params = net.params
        self.peer = peer_name(sock)
        self.ready = False
        self.rx = bytearray()
        self.fifo_head = 0
        self.nqps = self.params.qps_per_conn
        self.n_data_qps = 1  # max(local ndevs, remote ndevs): one device each, no NIC merging
        self.split = self.params.split_data_on_qps
        self.reqs: list = [None] * NET_IB_MAX_REQUESTS
        self.mrs = MrCache(self.V, dev.pd)
        self.cq = self.V.CQ(dev.context, 2 * NET_IB_MAX_REQUESTS * self.nqps + 64, None, None, 0)
        self.qps: list = []
        self.trace = None  # (tracer, seq, channel, peer) set by the proxy when it traces
        self.stats = {"requests": 0, "cts": 0, "data_wrs": 0, "imm_wrs": 0, "chunks": []}

    def nqps_per_request(self) -> int:
        return self.nqps if self.split else self.n_data_qps

    def qp_for_request(self, rid: int, i: int) -> tuple[int, object]:
        """``ncclIbCommBaseGetQpForRequest``: request ``rid``'s ``i``-th QP, round-robin over the comm's QPs."""
        idx = (rid * self.nqps_per_request() + i) % self.nqps
        return idx, self.qps[idx]

    # --- QPs --------------------------------------------------------------------------------------------------
    def create_qp(self, access: int, max_send: int, max_recv: int):
        V, e = self.V, self.V.e
        cap = V.QPCap(max_send_wr=max_send, max_recv_wr=max_recv, max_send_sge=1, max_recv_sge=1,
                      max_inline_data=SEND_FIFO.itemsize if self.params.use_inline else 0)
        qp = V.QP(self.dev.pd, V.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq, cap=cap, sq_sig_all=0))
        attr = V.QPAttr(qp_state=e.IBV_QPS_INIT)
        attr.pkey_index, attr.port_num, attr.qp_access_flags = self.params.pkey, self.dev.port, access
        qp.modify(attr, e.IBV_QP_STATE | e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT | e.IBV_QP_ACCESS_FLAGS)
        self.qps.append(qp)
        return qp

    def rtr_rts(self, meta: dict) -> None:
        V, e, p, dev = self.V, self.V.e, self.params, self.dev
        for qp, rqpn in zip(self.qps, meta["qpn"]):
            attr = V.QPAttr(qp_state=e.IBV_QPS_RTR)
            attr.path_mtu = min(dev.mtu, meta["mtu"])
            attr.dest_qp_num, attr.rq_psn, attr.max_dest_rd_atomic, attr.min_rnr_timer = rqpn, 0, 1, 12
            if meta["link_layer"] == e.IBV_LINK_LAYER_ETHERNET:
                gr = V.GlobalRoute(dgid=V.GID(meta["gid"]), flow_label=0, sgid_index=dev.gid_index, hop_limit=255,
                                   traffic_class=p.tc)
                attr.ah_attr = V.AHAttr(port_num=dev.port, is_global=1, gr=gr, sl=p.sl)
            else:
                attr.ah_attr = V.AHAttr(dlid=meta["lid"], sl=p.sl, port_num=dev.port, is_global=0)
            qp.modify(attr, e.IBV_QP_STATE | e.IBV_QP_AV | e.IBV_QP_PATH_MTU | e.IBV_QP_DEST_QPN | e.IBV_QP_RQ_PSN
                      | e.IBV_QP_MAX_DEST_RD_ATOMIC | e.IBV_QP_MIN_RNR_TIMER)
            attr = V.QPAttr(qp_state=e.IBV_QPS_RTS)
            attr.timeout, attr.retry_cnt, attr.rnr_retry, attr.sq_psn, attr.max_rd_atomic = \
                p.timeout, p.retry_cnt, 7, 0, 1
            qp.modify(attr, e.IBV_QP_STATE | e.IBV_QP_TIMEOUT | e.IBV_QP_RETRY_CNT | e.IBV_QP_RNR_RETRY
                      | e.IBV_QP_SQ_PSN | e.IBV_QP_MAX_QP_RD_ATOMIC)

    def metadata(self, fifo_addr: int = 0, fifo_rkey: int = 0) -> bytes:
        """``struct ncclIbConnectionMetadata`` as bytes: this side's QPs and device, and its CTS FIFO."""
        dev, qpns = self.dev, [qp.qp_num for qp in self.qps]
        return META.pack(dev.lid, dev.mtu, dev.link_layer, 1, str(dev.gid).encode(), fifo_addr, fifo_rkey,
                         len(qpns), *qpns, *[0] * (NCCL_IB_MAX_QPS - len(qpns)))

    def parse_metadata(self, raw: bytes) -> dict:
        """The peer's metadata, checked against this comm before any QP is touched."""
        lid, mtu, link_layer, ndevs, gid, fifo_addr, fifo_rkey, nqps, *qpn = META.unpack(raw)
        if nqps != self.nqps:
            raise NetError(f"NET/IB : peer {self.peer} opened {nqps} QPs, this rank {self.nqps}: "
                           f"NCCL_IB_QPS_PER_CONNECTION must match")
        try:
            gid_text = gid.rstrip(b"\0").decode("ascii")
        except UnicodeDecodeError:
            raise NetError(f"NET/IB : peer {self.peer} sent a malformed GID") from None
        return {"qpn": qpn[:nqps], "lid": lid, "gid": gid_text, "mtu": mtu, "link_layer": link_layer,
                "ndevs": ndevs, "fifo_addr": fifo_addr, "fifo_rkey": fifo_rkey}

    # --- the non-blocking part of the handshake ---------------------------------------------------------------
    def _read_nonblocking(self, want: int) -> bool:
        """Accumulate bytes from the OOB socket without blocking; True once ``want`` bytes are there."""
        self.sock.setblocking(False)
        try:
            while len(self.rx) < want:
                chunk = self.sock.recv(want - len(self.rx))
                if not chunk:
                    raise NetError(f"NET/IB : connection to peer {self.peer} closed during setup")
                self.rx += chunk
        except (BlockingIOError, InterruptedError):
            return False
        finally:
            self.sock.setblocking(True)
        return True

    def log_stats(self) -> None:
        """One INFO line of this comm's counters (the figures' "provider counters")."""
        st, ch = self.stats, self.stats["chunks"]
        if self.is_send:
            aligned = all(c % 128 == 0 for i, c in enumerate(ch) if (i + 1) % self.nqps_per_request())
            what = (f"{st['requests']} sends, {st['data_wrs']} data WRs ({st['imm_wrs']} WRITE_WITH_IMM) on "
                    f"{self.nqps} QP(s) split={self.split}, chunks {min(ch, default=0)}..{max(ch, default=0)} B, "
                    f"non-last chunks 128-B multiples: {'yes' if aligned else 'no'}")
        else:
            what = f"{st['requests']} receives, {st['cts']} CTS writes"
        debug.info("NET", f"NET/IB : {'send' if self.is_send else 'recv'} comm with peer {self.peer}: {what}")

    def close(self) -> None:
        self.log_stats()
        for qp in self.qps:
            qp.close()
        self.qps = []
        self.mrs.close()
        try:
            self.sock.close()
        except OSError:
            pass


class IbSendComm(IbCommBase):
    """``struct ncclIbSendComm``: the CTS FIFO the receiver writes into, and the send requests by slot."""

    def __init__(self, net, dev, sock):
        super().__init__(net, dev, sock, True)
        e = self.V.e
        self.ar = dev.ar
        self.cts_fifo = aligned_zeros((NET_IB_MAX_REQUESTS, NCCL_NET_IB_MAX_RECVS), SEND_FIFO)
        self.fifo_idx = self.cts_fifo["idx"][:, 0]  # a view: the sender polls it
        self.fifo_mr = self.mrs.reg(self.cts_fifo.ctypes.data, self.cts_fifo.nbytes, owner=self.cts_fifo)
        for _ in range(self.nqps):
            self.create_qp(e.IBV_ACCESS_REMOTE_WRITE, 2 * NET_IB_MAX_REQUESTS, 0)

    def progress_connect(self) -> bool:
        if self.ready:
            return True
        if not self._read_nonblocking(META.size):
            return False
        self.rtr_rts(self.parse_metadata(bytes(self.rx)))
        self.sock.sendall(b"R")
        self.ready = True
        return True


class IbRecvComm(IbCommBase):
    """``struct ncclIbRecvComm``: QPs towards the sender, the shadow of its CTS FIFO (``remCtsFifo``)."""

    def __init__(self, net, dev, sock, raw_meta: bytes):
        super().__init__(net, dev, sock, False)
        e = self.V.e
        meta = self.parse_metadata(raw_meta)
        for _ in range(self.nqps):
            self.create_qp(e.IBV_ACCESS_REMOTE_WRITE, 2 * NET_IB_MAX_REQUESTS, NET_IB_MAX_REQUESTS)
        self.rtr_rts(meta)
        self.rem_fifo_addr, self.rem_fifo_rkey = meta["fifo_addr"], meta["fifo_rkey"]
        self.elems = aligned_zeros((NET_IB_MAX_REQUESTS, NCCL_NET_IB_MAX_RECVS), SEND_FIFO)
        self.elems_mr = self.mrs.reg(self.elems.ctypes.data, self.elems.nbytes, owner=self.elems)
        # pyverbs will not build a receive WR without an SGE (NCCL posts none): one 0-byte SGE, never written
        self.recv_sge = self.V.SGE(self.elems.ctypes.data, 0, self.elems_mr.lkey)

    def progress_connect(self) -> bool:
        if self.ready:
            return True
        if not self._read_nonblocking(1):
            return False
        self.ready = True
        return True


def listen(net, dev_index: int):
    """``ncclIbListen``: the OOB listener and its handle (address and magic)."""
    magic = socket_magic()
    srv = Listener(sockets.listen(net.addr), magic, SOCKET_TYPE_NET_IB, "NET/IB listener")
    host, port = srv.address()
    return HANDLE.pack(port, host.encode(), magic), (srv, dev_index)


def connect(net, dev_index: int, handle: bytes, deadline: float) -> IbSendComm:
    """``ncclIbConnect``: the OOB socket (handshake first), then this side's metadata."""
    if len(handle) != HANDLE.size:
        raise NetError(f"NET/IB : a connect handle of {len(handle)} bytes, expected {HANDLE.size}")
    port, host_raw, magic = HANDLE.unpack(handle)
    host = host_raw.rstrip(b"\0").decode("ascii", "replace")
    sock = sockets.connect((host, port), deadline, "NET/IB peer", hello(magic, SOCKET_TYPE_NET_IB))
    comm = IbSendComm(net, net.devs[dev_index], sock)
    sock.sendall(comm.metadata(fifo_addr=comm.cts_fifo.ctypes.data, fifo_rkey=comm.fifo_mr.rkey))
    return comm


def accept(net, listen_comm, deadline: float) -> IbRecvComm:
    """``ncclIbAccept``: the next connection that passed the handshake and sent a whole metadata message."""
    srv, dev_index = listen_comm
    sock, raw_meta, _ = srv.accept(deadline, "the NET/IB peer", first=META.size)
    comm = IbRecvComm(net, net.devs[dev_index], sock, raw_meta)
    sock.sendall(comm.metadata())
    sock.settimeout(None)
    return comm
