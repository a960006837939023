"""The software provider's wire: RDMA writes carried over TCP between HCAs (threads), placed by rkey.

Requester side, one ``Link`` per remote HCA: a sender thread takes send WRs in post order, checks the local
SGEs against their lkeys, and sends a header plus the bytes; an ack thread reads the responder's verdicts, in
order, and completes the WRs.  Responder side, one thread per incoming link (``_respond``): it finds the QP,
checks the rkey (exists, same PD, remote write allowed on MR and QP, bounds), waits for a posted receive for a
WRITE_WITH_IMM (RNR: ``min_rnr_timer`` per try, ``rnr_retry`` tries, 7 meaning forever as in IB, bounded here by
``NCCLLAB_TIMEOUT``), places the bytes into registered memory, queues the receive completion, then acks.  So a
completion at either end implies placement.  Order: one TCP stream per HCA pair keeps each QP in order; nothing
is promised across QPs (chaos mode reorders placement within a write).

Each link starts with the lab's handshake (``collectives.misc.listener``: a magic, then the wire's socket type) before its
``HELLO``; the HCA's listener drops any other connection and goes on accepting.  The magic is this machine's
provider key (``wire_magic``): HCAs listen on loopback only, so the trust boundary is the host's user, as a key
file readable by that user alone makes it.
"""
from __future__ import annotations

import collections
import ctypes
import os
import queue
import secrets
import socket
import struct
import tempfile
import threading
import time

from collectives.misc import sockets
from collectives.misc.listener import SOCKET_TYPE_VERBS_WIRE, Listener, hello
from collectives.misc.param import timeout_s
from collectives.misc.sockets import BootstrapError

from . import enums as e
from .cq import WC

HELLO = struct.Struct("<I")                    # requester's LID
HDR = struct.Struct("<BIIQIQIQBBB")           # opcode, dst qpn, src qpn, seq, rkey, raddr, imm, length,
ACK = struct.Struct("<QB")                     # rnr_retry, timeout, retry_cnt | seq, status
RNR_TIMER_S = {0: 655.36e-3, 1: 0.01e-3, 12: 0.64e-3, 31: 491.52e-3}  # IB's min_rnr_timer codes (a few)


_magic: list[int] = []


def wire_magic() -> int:
    """The provider key every HCA of this user on this machine shares: a random 64-bit value kept in a file
    only this user can read (made on first use; ``NCCLLAB_VERBS_SIM_KEY`` names another file)."""
    if _magic:
        return _magic[0]
    path = os.environ.get("NCCLLAB_VERBS_SIM_KEY") or os.path.join(tempfile.gettempdir(),
                                                                   f"nccllab-verbs-sim-{os.getuid()}.key")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"{secrets.randbits(64):016x}\n")
    except FileExistsError:
        pass
    st = os.stat(path)
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise PermissionError(f"{path}: the verbs provider's key must belong to this user and be private (0600)")
    with open(path) as f:
        _magic.append(int(f.read().strip() or "0", 16))
    return _magic[0]


def _view(addr: int, length: int) -> memoryview:
    return memoryview((ctypes.c_char * length).from_address(addr)).cast("B")


def _recv_exact_into(sock: socket.socket, view: memoryview) -> None:
    pos = 0
    while pos < len(view):
        n = sock.recv_into(view[pos:])
        if n == 0:
            raise ConnectionError("link closed")
        pos += n


def _discard(sock: socket.socket, length: int) -> None:
    scratch = bytearray(min(length, 1 << 20) or 1)
    while length:
        n = sock.recv_into(memoryview(scratch)[:min(length, len(scratch))])
        if n == 0:
            raise ConnectionError("link closed")
        length -= n


# --- requester --------------------------------------------------------------------------------------------------

class Link:
    def __init__(self, hca, dlid: int):
        self.hca, self.dlid, self.dead = hca, dlid, False
        self.q: queue.Queue = queue.Queue()
        self.inflight: collections.deque = collections.deque()
        self.lock = threading.Lock()
        try:
            if dlid in hca.dead_lids:
                raise ConnectionError("peer HCA is gone")
            self.sock = sockets.connect((hca.ip, dlid), time.monotonic() + 5.0, f"HCA LID {dlid}",
                                        hello(wire_magic(), SOCKET_TYPE_VERBS_WIRE))
            self.sock.settimeout(None)
            self.sock.sendall(HELLO.pack(hca.lid))
        except Exception:  # noqa: BLE001  no route: every WR fails as retries exceeded
            self.sock, self.dead = None, True
        name = f"nccllab-sim-{hca.name}-lid{dlid}"
        threading.Thread(target=self._send_loop, name=name + "-tx", daemon=True).start()
        if self.sock is not None:
            threading.Thread(target=self._ack_loop, name=name + "-ack", daemon=True).start()

    def submit(self, op) -> None:
        self.q.put(op)

    def _send_loop(self) -> None:
        while True:
            op = self.q.get()
            qp = op.qp
            if self.dead:
                qp.complete_send(op, e.IBV_WC_RETRY_EXC_ERR)
                continue
            if qp.qp_state == e.IBV_QPS_ERR:
                qp.complete_send(op, e.IBV_WC_WR_FLUSH_ERR)
                continue
            views = []
            if op.inline is not None:
                views = [op.inline]
            else:
                for sge in op.sges:
                    if not sge.length:
                        continue  # a zero-length SGE touches no memory (mlx5 skips it too)
                    mr = self.hca.lkeys.get(sge.lkey)
                    if mr is None or mr.pd is not qp.pd or not mr.covers(sge.addr, sge.length):
                        views = None
                        break
                    views.append(_view(sge.addr, sge.length))
            if views is None:
                qp.complete_send(op, e.IBV_WC_LOC_PROT_ERR)
                continue
            hdr = HDR.pack(op.opcode, qp.dest_qp_num, qp.qp_num, op.seq, op.rkey, op.raddr, op.imm, op.length,
                           qp.rnr_retry, qp.timeout, qp.retry_cnt)
            with self.lock:
                self.inflight.append(op)
            try:
                self.sock.sendall(hdr)
                for v in views:
                    if len(v):
                        self.sock.sendall(v)
            except OSError:
                self._die()
            self.hca.stats["writes_imm" if op.opcode == e.IBV_WR_RDMA_WRITE_WITH_IMM else "writes"] += 1
            self.hca.stats["bytes"] += op.length

    def _ack_loop(self) -> None:
        buf = bytearray(ACK.size)
        try:
            while True:
                _recv_exact_into(self.sock, memoryview(buf))
                seq, status = ACK.unpack(buf)
                with self.lock:
                    op = self.inflight.popleft()
                assert op.seq == seq, (op.seq, seq)
                if self.hca.chaos is not None:
                    self.hca.chaos.delay()
                op.qp.complete_send(op, status)
        except (OSError, ConnectionError):
            self._die()

    def _die(self) -> None:
        """The peer HCA is unreachable: what is in flight fails as 'transport retry counter exceeded'."""
        if self.dead and not self.inflight:
            return
        self.dead = True
        with self.lock:
            lost, self.inflight = list(self.inflight), collections.deque()
        for op in lost:
            op.qp.complete_send(op, e.IBV_WC_RETRY_EXC_ERR)
        self.hca.peer_lost(self.dlid)


# --- responder --------------------------------------------------------------------------------------------------

def serve(hca) -> None:
    """The HCA's listener thread: each requester that passes the handshake gets a responder thread."""
    listener = Listener(hca.srv, wire_magic(), SOCKET_TYPE_VERBS_WIRE, f"verbs provider {hca.name}")
    while True:
        try:
            conn, first, _ = listener.accept(time.monotonic() + 3600.0, "a requester HCA", first=HELLO.size)
        except BootstrapError:
            continue  # an hour with no requester: keep listening
        except OSError:
            return  # the HCA's socket was closed
        (src_lid,) = HELLO.unpack(first)
        threading.Thread(target=_respond_loop, args=(hca, conn, src_lid), name=f"nccllab-sim-{hca.name}-rx",
                         daemon=True).start()


def _respond_loop(hca, conn: socket.socket, src_lid: int) -> None:
    try:
        hdr = bytearray(HDR.size)
        while True:
            _recv_exact_into(conn, memoryview(hdr))
            fields = HDR.unpack(hdr)
            status = _respond(hca, conn, *fields)
            conn.sendall(ACK.pack(fields[3], status))
    except (OSError, ConnectionError):
        hca.peer_lost(src_lid)
    finally:
        conn.close()


def _wait(cond, budget: float) -> bool:
    end = time.monotonic() + budget
    while not cond():
        if time.monotonic() > end:
            return False
        time.sleep(50e-6)
    return True


def _respond(hca, conn, opcode, dst_qpn, src_qpn, seq, rkey, raddr, imm, length, rnr_retry, timeout,
             retry_cnt) -> int:
    # a packet for a QP that is not (yet) ready to receive is dropped; the requester retries, then gives up
    retry_budget = min(4.096e-6 * (1 << timeout) * (retry_cnt + 1), timeout_s())
    ready = lambda: (q := hca.qps.get(dst_qpn)) is not None and q.qp_state in (  # noqa: E731
        e.IBV_QPS_RTR, e.IBV_QPS_RTS, e.IBV_QPS_ERR)
    if not _wait(ready, retry_budget):
        _discard(conn, length)
        return e.IBV_WC_RETRY_EXC_ERR
    qp = hca.qps[dst_qpn]
    if qp.qp_state == e.IBV_QPS_ERR or qp.rx_broken:
        _discard(conn, length)
        return e.IBV_WC_RETRY_EXC_ERR if qp.qp_state == e.IBV_QPS_ERR else e.IBV_WC_WR_FLUSH_ERR
    mr = hca.rkeys.get(rkey)
    if length and (mr is None or mr.pd is not qp.pd or not mr.access & e.IBV_ACCESS_REMOTE_WRITE
                   or not qp.access & e.IBV_ACCESS_REMOTE_WRITE or not mr.covers(raddr, length)):
        _discard(conn, length)
        hca.stats["errors"] += 1
        qp.to_error()  # a remote access violation breaks both ends of the connection
        return e.IBV_WC_REM_ACCESS_ERR
    wr_id = None
    if opcode == e.IBV_WR_RDMA_WRITE_WITH_IMM:
        wr_id = qp.take_recv()
        if wr_id is None:
            hca.stats["rnr_waits"] += 1
            tries = None if rnr_retry == 7 else rnr_retry
            tick = RNR_TIMER_S.get(qp.min_rnr_timer, 0.64e-3)
            budget = timeout_s() if tries is None else tick * (tries + 1)
            got = []
            _wait(lambda: got.append(qp.take_recv()) or got[-1] is not None, budget)
            wr_id = got[-1] if got else None
            if wr_id is None:
                _discard(conn, length)
                qp.rx_broken = True
                return e.IBV_WC_RNR_RETRY_EXC_ERR
    if length:
        if hca.chaos is not None:
            data = bytearray(length)
            _recv_exact_into(conn, memoryview(data))
            hca.chaos.place(raddr, bytes(data))
        else:
            _recv_exact_into(conn, _view(raddr, length))
    if wr_id is not None:
        if hca.chaos is not None:
            hca.chaos.delay()
        qp.rcq.push(WC(wr_id, e.IBV_WC_SUCCESS, e.IBV_WC_RECV_RDMA_WITH_IMM, qp.qp_num, length, imm,
                       e.IBV_WC_WITH_IMM, src_qpn))
    return e.IBV_WC_SUCCESS
