"""The transports in NCCL's order of preference (``src/transport.cc``: ``ncclTransports[]`` = P2P, SHM, NET,
CollNet).  For each connection the first one whose ``can_connect`` agrees wins (``selectTransport``).  A CPU has no
P2P (peer-mapped device memory is what SHM gives here), so ``NCCL_P2P_DISABLE`` changes nothing; the GPU path adds
``p2p.py`` at the head of this list.  No CollNet."""
from __future__ import annotations

from .base import Transport
from .net import NetTransport
from .shm import ShmTransport

TRANSPORTS: list[Transport] = [ShmTransport(), NetTransport()]


def select_transport(my_info: dict, peer_info: dict) -> Transport:
    """``selectTransport``: the first transport that can connect the two ranks."""
    return next(t for t in TRANSPORTS if t.can_connect(my_info, peer_info))
