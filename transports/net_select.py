"""Which net plugin the NET transport uses (NCCL ``src/plugin/net.cc``: ``ncclNetInit``, ``NCCL_NET``).

NCCL tries its IB plugin first and falls back to sockets when IB finds no device; ``NCCL_NET=IB`` or
``NCCL_NET=Socket`` forces one (case-insensitive), and a forced plugin that cannot start is an error.  Here the
IB plugin is the default only when pyverbs sees a real RDMA device: on the software verbs provider (a stand-in)
it runs only when asked for.
"""
from __future__ import annotations

from collectives.misc.param import env_str
from tracing import debug

from .net_ib import IbNet
from .net_plugin import NetError, NetPlugin
from .net_socket import SocketNet
from .verbs import pyverbs_shim


def select_plugin() -> NetPlugin:
    want = env_str("NCCL_NET").lower()
    if want not in ("", "ib", "socket"):
        raise NetError(f"NCCL_NET={env_str('NCCL_NET')}: network not found (this build has IB and Socket)")
    if want == "" and (env_str("NCCLLAB_VERBS").lower() == "sim" or not pyverbs_shim.device_names()):
        want = "socket"  # no real RDMA device: do not start the software provider behind the user's back
    if want in ("", "ib"):
        ib = IbNet()
        try:
            ib.init()
            if want == "ib" or ib.provider == "pyverbs":
                return ib
        except NetError as exc:
            if want == "ib":
                raise NetError(f"NCCL_NET=IB: {exc}") from exc
            debug.info("NET", f"{exc}; falling back to NET/Socket")
    sock = SocketNet()
    sock.init()
    return sock
