"""The transports in NCCL's order of preference (``src/transport.cc``: ``ncclTransports[]`` = P2P, SHM, NET,
CollNet).  For each connection the first one whose ``can_connect`` agrees wins (``selectTransport``).  P2P connects
only ranks on a GPU device (``cuda``, ``cudasim``); on the CPU device SHM is the first that agrees, so there
``NCCL_P2P_DISABLE`` changes nothing.  No CollNet."""
from __future__ import annotations

from .base import Transport
from .net import NetTransport
from .p2p import P2PTransport
from .shm import ShmTransport

TRANSPORTS: list[Transport] = [P2PTransport(), ShmTransport(), NetTransport()]


def select_transport(my_info: dict, peer_info: dict) -> Transport:
    """``selectTransport``: the first transport that can connect the two ranks."""
    return next(t for t in TRANSPORTS if t.can_connect(my_info, peer_info))
