"""pyverbs (rdma-core's Python binding, Debian ``python3-pyverbs``) behind two version differences.

* Its enums module was renamed between rdma-core releases (``pyverbs.enums`` -> ``pyverbs.libibverbs_enums``).
* ``get_device_list()`` raises when no device is present; that means "no device", not an error.
"""
from __future__ import annotations


def enums():
    try:
        import pyverbs.libibverbs_enums as e
    except ImportError:
        import pyverbs.enums as e
    return e


def device_names() -> list[str] | None:
    """Names of the RDMA devices pyverbs sees; None when pyverbs is not importable."""
    try:
        from pyverbs.device import get_device_list
    except ImportError:
        return None
    try:
        devices = get_device_list()
    except Exception:  # PyverbsRDMAError "Failed to get devices list": no device, no kernel module
        return []
    return [d.name.decode() if isinstance(d.name, bytes) else str(d.name) for d in devices]


def classes() -> dict:
    from pyverbs.addr import GID, AHAttr, GlobalRoute
    from pyverbs.cq import CQ
    from pyverbs.device import Context
    from pyverbs.mr import MR
    from pyverbs.pd import PD
    from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
    from pyverbs.wr import SGE, RecvWR, SendWR
    return dict(Context=Context, PD=PD, MR=MR, CQ=CQ, QP=QP, QPInitAttr=QPInitAttr, QPCap=QPCap, QPAttr=QPAttr,
                AHAttr=AHAttr, GlobalRoute=GlobalRoute, GID=GID, SGE=SGE, SendWR=SendWR, RecvWR=RecvWR)
