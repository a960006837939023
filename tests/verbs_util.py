"""Helpers for the verbs tests: a connected RC pair on whatever ``transports.verbs.load()`` gives."""
import time

import numpy as np


def rc_qp(V, ctx, pd, cq, max_send_wr=64, max_recv_wr=64):
    e = V.e
    cap = V.QPCap(max_send_wr=max_send_wr, max_recv_wr=max_recv_wr, max_send_sge=1, max_recv_sge=1)
    qp = V.QP(pd, V.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap, sq_sig_all=0))
    a = V.QPAttr(qp_state=e.IBV_QPS_INIT)
    a.pkey_index, a.port_num = 0, 1
    a.qp_access_flags = e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_LOCAL_WRITE
    qp.modify(a, e.IBV_QP_STATE | e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT | e.IBV_QP_ACCESS_FLAGS)
    return qp


def to_rts(V, qp, dlid, dqpn, rnr_retry=7, timeout=20, retry_cnt=7):
    e = V.e
    a = V.QPAttr(qp_state=e.IBV_QPS_RTR)
    a.path_mtu, a.dest_qp_num, a.rq_psn, a.max_dest_rd_atomic, a.min_rnr_timer = e.IBV_MTU_4096, dqpn, 0, 1, 12
    a.ah_attr = V.AHAttr(dlid=dlid, sl=0, port_num=1)
    qp.modify(a, e.IBV_QP_STATE | e.IBV_QP_AV | e.IBV_QP_PATH_MTU | e.IBV_QP_DEST_QPN | e.IBV_QP_RQ_PSN
              | e.IBV_QP_MAX_DEST_RD_ATOMIC | e.IBV_QP_MIN_RNR_TIMER)
    a = V.QPAttr(qp_state=e.IBV_QPS_RTS)
    a.timeout, a.retry_cnt, a.rnr_retry, a.sq_psn, a.max_rd_atomic = timeout, retry_cnt, rnr_retry, 0, 1
    qp.modify(a, e.IBV_QP_STATE | e.IBV_QP_TIMEOUT | e.IBV_QP_RETRY_CNT | e.IBV_QP_RNR_RETRY | e.IBV_QP_SQ_PSN
              | e.IBV_QP_MAX_QP_RD_ATOMIC)


def write_wr(V, wr_id, mr, addr, length, rkey, raddr, imm=None, signaled=True):
    e = V.e
    op = e.IBV_WR_RDMA_WRITE if imm is None else e.IBV_WR_RDMA_WRITE_WITH_IMM
    wr = V.SendWR(wr_id=wr_id, opcode=op, num_sge=1, imm_data=imm or 0, sg=[V.SGE(addr, length, mr.lkey)],
                  send_flags=e.IBV_SEND_SIGNALED if signaled else 0)
    wr.set_wr_rdma(rkey, raddr)
    return wr


def poll(cq, n=1, limit=20.0):
    out, end = [], time.monotonic() + limit
    while len(out) < n:
        got, wcs = cq.poll(n - len(out))
        out += wcs
        if not got:
            if time.monotonic() > end:
                raise AssertionError(f"only {len(out)} of {n} completions")
            time.sleep(1e-4)
    return out


def buffer(V, pd, size, access=None):
    e = V.e
    arr = np.zeros(size, np.uint8)
    access = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE if access is None else access
    return arr, V.MR(pd, size, access, address=arr.ctypes.data)
