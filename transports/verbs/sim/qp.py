"""Queue pairs (pyverbs ``pyverbs.qp``: ``QPCap``, ``QPInitAttr``, ``QPAttr``, ``QP``) of the software verbs
provider: RC only, with the verbs state machine.

RESET -> INIT -> RTR -> RTS, each with the attribute mask verbs requires; any state -> ERR or RESET.  Posting a
send needs RTS, posting a receive needs INIT or later; in ERR both are accepted and complete at once with
``WR_FLUSH_ERR``.  A full send queue (``max_send_wr`` WRs not yet freed by a polled completion) refuses the post.
"""
from __future__ import annotations

import collections
import itertools
import threading
from dataclasses import dataclass

from . import enums as e
from .cq import CQ, WC
from .device import PD
from .error import SimVerbsError


class QPCap:
    def __init__(self, max_send_wr: int = 1, max_recv_wr: int = 10, max_send_sge: int = 1, max_recv_sge: int = 1,
                 max_inline_data: int = 0):
        self.max_send_wr, self.max_recv_wr = max_send_wr, max_recv_wr
        self.max_send_sge, self.max_recv_sge, self.max_inline_data = max_send_sge, max_recv_sge, max_inline_data


class QPInitAttr:
    def __init__(self, qp_type: int = e.IBV_QPT_RC, qp_context=None, scq: CQ | None = None, rcq: CQ | None = None,
                 srq=None, cap: QPCap | None = None, sq_sig_all: int = 0):
        self.qp_type, self.scq, self.rcq, self.srq = qp_type, scq, rcq, srq
        self.cap, self.sq_sig_all = cap or QPCap(), sq_sig_all


class QPAttr:
    def __init__(self, qp_state: int = e.IBV_QPS_INIT, cur_qp_state: int = e.IBV_QPS_RESET):
        self.qp_state, self.cur_qp_state = qp_state, cur_qp_state
        self.pkey_index = self.qp_access_flags = self.dest_qp_num = self.rq_psn = self.sq_psn = 0
        self.port_num, self.path_mtu = 1, e.IBV_MTU_1024
        self.max_dest_rd_atomic = self.max_rd_atomic = self.min_rnr_timer = 0
        self.timeout, self.retry_cnt, self.rnr_retry = 0, 0, 0
        self.ah_attr = None


# state transition -> the mask bits verbs requires for it (ibv_modify_qp(3))
_REQUIRED = {
    (e.IBV_QPS_RESET, e.IBV_QPS_INIT): e.IBV_QP_STATE | e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT | e.IBV_QP_ACCESS_FLAGS,
    (e.IBV_QPS_INIT, e.IBV_QPS_INIT): e.IBV_QP_STATE,
    (e.IBV_QPS_INIT, e.IBV_QPS_RTR): e.IBV_QP_STATE | e.IBV_QP_AV | e.IBV_QP_PATH_MTU | e.IBV_QP_DEST_QPN
    | e.IBV_QP_RQ_PSN | e.IBV_QP_MAX_DEST_RD_ATOMIC | e.IBV_QP_MIN_RNR_TIMER,
    (e.IBV_QPS_RTR, e.IBV_QPS_RTS): e.IBV_QP_STATE | e.IBV_QP_TIMEOUT | e.IBV_QP_RETRY_CNT | e.IBV_QP_RNR_RETRY
    | e.IBV_QP_SQ_PSN | e.IBV_QP_MAX_QP_RD_ATOMIC,
    (e.IBV_QPS_RTS, e.IBV_QPS_RTS): e.IBV_QP_STATE,
}
STATE_NAMES = {0: "RESET", 1: "INIT", 2: "RTR", 3: "RTS", 4: "SQD", 5: "SQE", 6: "ERR"}


@dataclass
class SendOp:
    """A posted send WR as the wire thread carries it."""
    qp: "QP"
    seq: int
    wr_id: int
    opcode: int
    signaled: bool
    sges: list
    rkey: int
    raddr: int
    imm: int
    length: int
    inline: bytes | None


class QP:
    def __init__(self, creator: PD, init_attr: QPInitAttr, qp_attr: QPAttr | None = None, **_kw):
        if init_attr.qp_type != e.IBV_QPT_RC:
            raise SimVerbsError("the software provider implements RC QPs only")
        if init_attr.scq is None or init_attr.rcq is None:
            raise SimVerbsError("a QP needs a send and a receive CQ")
        self.pd, self.hca = creator, creator.hca
        self.qp_type, self.scq, self.rcq = init_attr.qp_type, init_attr.scq, init_attr.rcq
        self.cap, self.sq_sig_all = init_attr.cap, init_attr.sq_sig_all
        self.qp_state = e.IBV_QPS_RESET
        self.lock = threading.Lock()
        self.rq: collections.deque = collections.deque()      # posted receive wr_ids
        self.sq_busy: collections.deque = collections.deque()  # seqs of send WRs whose slot is not free yet
        self._seq = itertools.count()
        self.access = self.port_num = self.dlid = self.dest_qp_num = 0
        self.timeout = self.retry_cnt = self.rnr_retry = self.min_rnr_timer = 0
        self.rx_broken = False  # responder: a request from our peer failed; later ones are discarded
        self.qp_num = self.hca.add_qp(self)

    # --- state machine ---------------------------------------------------------------------------------------
    def modify(self, attr: QPAttr, attr_mask: int) -> None:
        new = attr.qp_state if attr_mask & e.IBV_QP_STATE else self.qp_state
        if new == e.IBV_QPS_ERR:
            self.to_error()
            return
        if new == e.IBV_QPS_RESET:
            with self.lock:
                self.qp_state, self.rq, self.sq_busy = e.IBV_QPS_RESET, collections.deque(), collections.deque()
            return
        need = _REQUIRED.get((self.qp_state, new))
        if need is None:
            raise SimVerbsError(f"QP {self.qp_num}: invalid transition {STATE_NAMES[self.qp_state]} -> "
                                f"{STATE_NAMES[new]} (EINVAL)")
        if attr_mask & need != need:
            raise SimVerbsError(f"QP {self.qp_num}: {STATE_NAMES[self.qp_state]} -> {STATE_NAMES[new]} misses "
                                f"attribute mask bits {need & ~attr_mask:#x} (EINVAL)")
        if attr_mask & e.IBV_QP_ACCESS_FLAGS:
            self.access = attr.qp_access_flags
        if attr_mask & e.IBV_QP_PORT:
            self.port_num = attr.port_num
        if attr_mask & e.IBV_QP_AV:
            self.dlid = attr.ah_attr.dlid
        if attr_mask & e.IBV_QP_DEST_QPN:
            self.dest_qp_num = attr.dest_qp_num
        if attr_mask & e.IBV_QP_MIN_RNR_TIMER:
            self.min_rnr_timer = attr.min_rnr_timer
        if attr_mask & e.IBV_QP_TIMEOUT:
            self.timeout = attr.timeout
        if attr_mask & e.IBV_QP_RETRY_CNT:
            self.retry_cnt = attr.retry_cnt
        if attr_mask & e.IBV_QP_RNR_RETRY:
            self.rnr_retry = attr.rnr_retry
        self.qp_state = new

    def to_error(self) -> None:
        """Move to ERR: posted receives flush now; send WRs flush as the wire thread meets them."""
        with self.lock:
            self.qp_state = e.IBV_QPS_ERR
            flushed, self.rq = list(self.rq), collections.deque()
        for wr_id in flushed:
            self.rcq.push(WC(wr_id, e.IBV_WC_WR_FLUSH_ERR, e.IBV_WC_RECV, self.qp_num))

    # --- posting ---------------------------------------------------------------------------------------------
    def post_send(self, wr, bad_wr=None) -> None:
        if self.qp_state not in (e.IBV_QPS_RTS, e.IBV_QPS_ERR):
            raise SimVerbsError(f"QP {self.qp_num}: post_send in state {STATE_NAMES[self.qp_state]} (EINVAL)")
        if wr.opcode not in (e.IBV_WR_RDMA_WRITE, e.IBV_WR_RDMA_WRITE_WITH_IMM):
            raise SimVerbsError(f"QP {self.qp_num}: opcode {wr.opcode} not implemented by the software provider")
        if wr.num_sge > self.cap.max_send_sge:
            raise SimVerbsError(f"QP {self.qp_num}: {wr.num_sge} SGEs > max_send_sge {self.cap.max_send_sge}")
        length = sum(s.length for s in wr.sg[:wr.num_sge])
        inline = None
        if wr.send_flags & e.IBV_SEND_INLINE:  # the data is copied at post time; no lkey is checked
            if length > self.cap.max_inline_data:
                raise SimVerbsError(f"QP {self.qp_num}: {length} B inline > max_inline_data")
            import ctypes
            inline = b"".join(ctypes.string_at(s.addr, s.length) for s in wr.sg[:wr.num_sge])
        with self.lock:
            if len(self.sq_busy) >= self.cap.max_send_wr:
                raise SimVerbsError(f"QP {self.qp_num}: send queue full ({self.cap.max_send_wr} WRs) (ENOMEM)")
            seq = next(self._seq)
            self.sq_busy.append(seq)
        signaled = bool(self.sq_sig_all or wr.send_flags & e.IBV_SEND_SIGNALED)
        op = SendOp(self, seq, wr.wr_id, wr.opcode, signaled, wr.sg[:wr.num_sge], wr.rkey, wr.remote_addr,
                    wr.imm_data & 0xFFFFFFFF, length, inline)
        self.hca.submit(op)

    def post_recv(self, wr, bad_wr=None) -> None:
        with self.lock:
            if self.qp_state == e.IBV_QPS_RESET:
                raise SimVerbsError(f"QP {self.qp_num}: post_recv in state RESET (EINVAL)")
            if len(self.rq) >= self.cap.max_recv_wr:
                raise SimVerbsError(f"QP {self.qp_num}: receive queue full ({self.cap.max_recv_wr} WRs) (ENOMEM)")
            if self.qp_state != e.IBV_QPS_ERR:
                self.rq.append(wr.wr_id)
                return
        self.rcq.push(WC(wr.wr_id, e.IBV_WC_WR_FLUSH_ERR, e.IBV_WC_RECV, self.qp_num))

    def take_recv(self):
        """Responder: consume the oldest posted receive (None when there is none: receiver not ready)."""
        with self.lock:
            return self.rq.popleft() if self.rq and self.qp_state in (e.IBV_QPS_RTR, e.IBV_QPS_RTS) else None

    # --- send completions ------------------------------------------------------------------------------------
    def complete_send(self, op: SendOp, status: int) -> None:
        """The wire thread's verdict on a send WR.  An error moves the QP to ERR (its error completion first,
        then every later WR flushes); success completes only signaled WRs."""
        if self.qp_state == e.IBV_QPS_ERR:
            status = e.IBV_WC_WR_FLUSH_ERR  # only the first error is reported as itself
        elif status != e.IBV_WC_SUCCESS:
            self.to_error()
        if status != e.IBV_WC_SUCCESS or op.signaled:
            self.scq.push(WC(op.wr_id, status, e.IBV_WC_RDMA_WRITE, self.qp_num, op.length, qp=self, seq=op.seq))

    def retire_send(self, seq: int) -> None:
        with self.lock:
            while self.sq_busy and self.sq_busy[0] <= seq:
                self.sq_busy.popleft()

    def close(self) -> None:
        self.hca.remove_qp(self)
        self.qp_state = e.IBV_QPS_RESET
