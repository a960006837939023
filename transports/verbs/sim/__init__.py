"""The software verbs provider: a stand-in for an RDMA HCA with pyverbs' classes, so the IB plugin's code runs
unchanged where no RDMA device exists.  It models the verbs semantics a program relies on (keys and access
flags, the QP state machine, RC ordering per QP, remote access errors, RNR, signaled completions, send-queue
depth) and moves bytes between processes over TCP; it does not model timing, congestion or adaptive routing.
"""
from __future__ import annotations

from . import enums  # noqa: F401
from .device import device_names, emulate_nics  # noqa: F401
from .error import SimVerbsError  # noqa: F401


def classes() -> dict:
    from .addr import GID, AHAttr, GlobalRoute
    from .cq import CQ
    from .device import PD, Context
    from .mr import MR
    from .qp import QP, QPAttr, QPCap, QPInitAttr
    from .wr import SGE, RecvWR, SendWR
    return dict(Context=Context, PD=PD, MR=MR, CQ=CQ, QP=QP, QPInitAttr=QPInitAttr, QPCap=QPCap, QPAttr=QPAttr,
                AHAttr=AHAttr, GlobalRoute=GlobalRoute, GID=GID, SGE=SGE, SendWR=SendWR, RecvWR=RecvWR)
