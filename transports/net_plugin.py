"""The net plugin interface (NCCL ``src/include/plugin/nccl_net.h``, ``ncclNet_t``): what the NET transport's
proxy calls, so that another backend (IB verbs next) drops in beside ``net_socket``.

``listen`` returns a handle (bytes) that travels to the peer through the bootstrap; ``connect`` on the sending
side and ``accept`` on the receiving side make a send comm and a recv comm.  ``isend``/``irecv`` return a request,
or None when the plugin cannot take one now (the proxy retries); ``test`` reports (done, size) and raises on a
broken connection.  Buffers are memoryviews of the FIFO slots; ``reg_mr`` returns the handle passed back to
isend/irecv (host memory needs nothing for sockets).
"""
from __future__ import annotations

from dataclasses import dataclass

NCCL_PTR_HOST = 1
NCCL_NET_MAX_REQUESTS = 32


class NetError(RuntimeError):
    """A plugin failure: the peer, the operation and the reason."""


@dataclass
class NetProperties:
    name: str
    speed: int            # Mb/s
    ptr_support: int = NCCL_PTR_HOST
    max_comms: int = 65536
    max_recvs: int = 1
    latency: float = 0.0
    port: int = 0


class NetPlugin:
    name = "base"

    def init(self) -> None:
        raise NotImplementedError

    def devices(self) -> int:
        raise NotImplementedError

    def get_properties(self, dev: int) -> NetProperties:
        raise NotImplementedError

    def listen(self, dev: int):
        """-> (handle: bytes, listen_comm)"""
        raise NotImplementedError

    def connect(self, dev: int, handle: bytes, deadline: float):
        """-> send_comm"""
        raise NotImplementedError

    def accept(self, listen_comm, deadline: float):
        """-> recv_comm"""
        raise NotImplementedError

    def reg_mr(self, comm, buf):
        return None

    def dereg_mr(self, comm, mhandle) -> None:
        return None

    def isend(self, send_comm, buf: memoryview, size: int, tag: int, mhandle):
        raise NotImplementedError

    def irecv(self, recv_comm, bufs: list, sizes: list, tags: list, mhandles: list):
        raise NotImplementedError

    def test(self, request) -> tuple[bool, int]:
        raise NotImplementedError

    def wait_fds(self, request) -> tuple[list, list]:
        """Ours, not ``ncclNet_t``'s: the file descriptors (readable, writable) whose readiness lets ``request``
        move, so that a rank with more ranks than cores can sleep in ``select`` instead of polling ``test``.
        Empty (the default) when the plugin has none to offer: the rank keeps polling."""
        return [], []

    def trace_to(self, comm, tracer, seq: int, channel: int, peer: int) -> None:
        """The proxy's tracer for the plugin's own events on ``comm`` (a plugin without any ignores it)."""
        return None

    def close_send(self, send_comm) -> None:
        raise NotImplementedError

    def close_recv(self, recv_comm) -> None:
        raise NotImplementedError

    def close_listen(self, listen_comm) -> None:
        raise NotImplementedError
