"""The IB net plugin (NCCL ``src/transport/net_ib/``), written against pyverbs' API: on a machine with an RDMA
device it drives the HCA through pyverbs; elsewhere the same code runs on the software verbs provider
(``transports.verbs``, a stand-in).  ``init.py`` finds the devices, ``connect.py`` sets up QPs, ``p2p.py`` moves
data, ``reg.py`` registers memory.  Selected by ``NCCL_NET=IB`` (see ``transports.net_select``).
"""
from __future__ import annotations

from collectives.misc.param import env_int

from .. import verbs
from ..net_plugin import NetError, NetPlugin, NetProperties
from . import connect as _connect
from . import p2p
from .init import init_devices, log_using
from .params import IbParams


class IbNet(NetPlugin):
    name = "IB"

    def init(self) -> None:
        """``ncclIbInitDevices``: fails (so NCCL falls back to sockets) when disabled or when no port is usable."""
        if env_int("NCCL_IB_DISABLE", 0):
            raise NetError("NET/IB : disabled by NCCL_IB_DISABLE=1")
        try:
            self.V = verbs.load()
            self.params = IbParams.from_env()
        except (verbs.VerbsUnavailable, ValueError) as exc:
            raise NetError(f"NET/IB : {exc}") from exc
        self.devs = init_devices(self.V, self.params)
        if not self.devs:
            raise NetError("NET/IB : No device found." + (f" (NCCL_IB_HCA={self.params.hca})" if self.params.hca
                                                           else ""))
        self.ifname, self.addr = log_using(self.V, self.devs)

    @property
    def provider(self) -> str:
        return self.V.name

    def devices(self) -> int:
        return len(self.devs)

    def get_properties(self, dev: int) -> NetProperties:
        d = self.devs[dev]
        return NetProperties(name=d.name, speed=100000, port=d.port, max_recvs=1)

    def listen(self, dev: int):
        return _connect.listen(self, dev)

    def connect(self, dev: int, handle: bytes, deadline: float):
        return _connect.connect(self, dev, handle, deadline)

    def accept(self, listen_comm, deadline: float):
        return _connect.accept(self, listen_comm, deadline)

    def reg_mr(self, comm, buf):
        from .reg import address_of
        return comm.mrs.reg(address_of(buf), len(buf), owner=buf)

    def dereg_mr(self, comm, mhandle) -> None:
        comm.mrs.dereg(mhandle)

    def isend(self, send_comm, buf: memoryview, size: int, tag: int, mhandle):
        return p2p.isend(send_comm, buf, size, tag, mhandle)

    def irecv(self, recv_comm, bufs: list, sizes: list, tags: list, mhandles: list):
        return p2p.irecv(recv_comm, bufs, sizes, tags, mhandles)

    def test(self, request) -> tuple[bool, int]:
        return p2p.test(request)

    def trace_to(self, comm, tracer, seq: int, channel: int, peer: int) -> None:
        comm.trace = (tracer, seq, channel, peer) if tracer is not None else None

    def close_send(self, send_comm) -> None:
        send_comm.close()

    def close_recv(self, recv_comm) -> None:
        recv_comm.close()

    def close_listen(self, listen_comm) -> None:
        listen_comm[0].close()
