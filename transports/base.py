"""The shape of a transport (NCCL ``src/include/transport.h``: ``struct ncclTransport`` with its ``canConnect``
and, for each of ``send`` and ``recv``, a ``struct ncclTransportComm`` of ``setup``, ``connect`` and ``free`` plus
the proxy's hooks: ``proxied``, ``save_ops``, ``progress``; the proxy itself is ``transports/proxy.py``).

A transport keeps what it owns for one communicator in its own state object (``new_state``: SHM's segments, NET's
plugin, connections and proxy thread), never in the communicator.  ``setup`` makes this rank's side of one
connection and returns the blob its peer needs (NCCL's 256-byte ``ncclConnect``); ``connect`` builds the
connector from both blobs; ``connected`` runs once every peer has connected (the connect barrier); ``free``
releases everything.  ``error`` reports a failure found off the kernel's path (NET's proxy thread).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from collectives.include.connector import Connector


@dataclass
class CommInfo:
    """What a transport may know of the communicator it connects."""
    tag: str                       # names this communicator's shared-memory segments
    rank: int
    buff_sizes: dict               # protocol name -> bytes
    dev: Callable[[int], int]      # a rank's index on its node (the ``[d]`` of NCCL's ``r[d]`` log notation)
    device: object = None          # the GPU device the ranks run on (``collectives/device/backend.py``), or None
    pool_bytes: int = 0            # on a GPU device: the node's P2P pool (``collectives/device/cuda/layout.py``)
    # (graph id: 0 ring, 1 tree; channel) -> the net device the topology search chose (``ncclTopoGetNetDev``);
    # None (no topology): device 0
    net_dev: Callable[[int, int], int] | None = None


class Transport:
    name = ""

    def can_connect(self, my_info: dict, peer_info: dict) -> bool:
        """``canConnect``: whether this transport can join the two ranks (their bootstrap peer info)."""
        raise NotImplementedError

    def new_state(self, info: CommInfo):
        """This communicator's resources for the transport (created at the first connection that uses it)."""
        raise NotImplementedError

    def setup(self, state, channel: int, peer: int, is_send: bool, conn_index: int = 0, graph: int = -1):
        """``send.setup`` / ``recv.setup``: this side's resources; returns the blob the peer connects with.
        ``conn_index``: 0 for the collectives' connections, 1 for point-to-point ones (NCCL's ``connIndex``);
        ``graph``: the id of the graph the connection serves (0 ring, 1 tree; -1 point-to-point)."""
        raise NotImplementedError

    def connect(self, state, channel: int, peer: int, is_send: bool, my_blob, peer_blob,
                deadline: float, conn_index: int = 0) -> Connector:
        """``send.connect`` / ``recv.connect``: the connector the kernel uses."""
        raise NotImplementedError

    def connected(self, state) -> None:
        """Every peer has connected (after the connect barrier)."""

    def proxied(self, state) -> bool:
        """Whether any of its connections goes through a proxy (its ``ncclTransportComm`` has ``proxyProgress``):
        then every collective hands it its ops (``save_ops``)."""
        return False

    def save_ops(self, state, ops: list) -> None:
        """``ncclProxySaveOp``: post to this transport's proxy, in order, the ops (``transports/proxy.py``'s
        ``ProxyOp``) of its own connections among ``ops``."""

    def progress(self, state) -> bool:
        """Ours: move this transport's proxied bytes from the rank's own thread while its kernel waits (NET's
        proxy ops); False if nothing moved or nothing is proxied."""
        return False

    def wait(self, state, words: list, timeout_s: float) -> bool:
        """Ours: with more ranks than cores, block (at most ``timeout_s``) until this transport can move one of
        the proxied transfers that ``words`` (the counters and doorbells the kernel waits on; None: a proxy
        send) depend on, if they are all its own; False at once otherwise (the kernel yields instead)."""
        return False

    def describe(self, state) -> list[dict]:
        """Ours: where the transport's in-flight work stands (NET: each proxy op's counters), for hang reports."""
        return []

    def error(self, state) -> str | None:
        """A failure the transport found outside a kernel's waits (NET's proxy thread), or None."""
        return None

    def free(self, state, drain: bool = True) -> None:
        """``send.free`` / ``recv.free`` for every connection: release segments, sockets, threads; ``drain``: first
        let in-flight work finish (not after a failure, when it never will)."""
