"""A communicator's channels (NCCL ``struct ncclChannel``, ``src/channel.cc``; ``setupChannel`` in ``src/init.cc``;
``ncclTopoPostset`` in ``src/graph/connect.cc``).

The topology search finds ``n`` rings (here: given, or rank order); Postset doubles them, channel c + n repeating
ring c with tree 1 of the double binary tree, then ``NCCL_MAX_NCHANNELS`` clamps and ``NCCL_MIN_NCHANNELS`` copies
channels (``copyChannels``).  Three counts, three names: ``search_channels`` (what the search found),
``Communicator.nchannels`` (after Postset) and ``Plan.nchannels`` (what one collective uses).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from collectives.include.connector import Connector
from collectives.include.device import MAXCHANNELS
from tracing import debug

from .graph.rings import Ring, ring_log_line, setup_ring
from .graph.trees import TreeNode, channel_trees, trees_log_line


@dataclass
class Channel:
    """``struct ncclChannel``: its ring, its tree and its connectors (``peers[p]->send[0]/recv[0]``)."""
    id: int
    ring: Ring
    tree: TreeNode
    send: Connector | None = None     # the ring's: to ring.next
    recv: Connector | None = None     # the ring's: from ring.prev
    send_to: dict = field(default_factory=dict)    # peer -> send connector (rings and trees share them)
    recv_from: dict = field(default_factory=dict)  # peer -> recv connector


def init_channels(orders: list[list[int]], node_of_rank: list[int], pattern: str, rank: int, max_channels: int,
            min_channels: int) -> tuple[list[Channel], list[dict], list[tuple]]:
    """``ncclTopoPostset``'s doubling and copies on the search's rings, then ``initChannel`` for this rank (the whole
    postset on a search graph is ``graph.connect.postset``): (this rank's channels, every channel's tree as every rank sees it,
    each channel's origin (search ring, tree 0 or 1))."""
    n = len(orders)
    trees = channel_trees(orders, node_of_rank, pattern)    # tree 0 of each ring, then tree 1 of each
    doubled = [(orders[c % n], trees[c], (c % n, c // n)) for c in range(2 * n if 2 * n <= MAXCHANNELS else n)]
    doubled = doubled[:max(1, min(max_channels, len(doubled)))]
    start = len(doubled)
    for c in range(start, min(MAXCHANNELS, min_channels)):          # copyChannels: c copies c - start
        doubled.append(doubled[c - start])
    channels = [Channel(c, setup_ring(order, rank), tree[rank]) for c, (order, tree, _) in enumerate(doubled)]
    return channels, [tree for _, tree, _ in doubled], [origin for _, _, origin in doubled]


def log_channels(rank: int, channels: list[Channel], trees: list[dict]) -> None:
    """``initTransportsRank``'s INFO lines: each channel's ring (rank 0), this rank's place in it, and its trees."""
    if rank == 0:
        for ch in channels:
            debug.info("INIT", ring_log_line(ch.id, len(channels), list(ch.ring.order)))
    for ch in channels:
        debug.info("GRAPH", f"Ring {ch.id:02d} : {ch.ring.prev} -> {rank} -> {ch.ring.next}")
    debug.info("INIT", trees_log_line(rank, trees))
