"""A communicator's channels (NCCL ``struct ncclChannel``, ``src/channel.cc``; ``initChannel`` and
``setupChannel`` in ``src/init.cc``).

The topology search finds ``n`` rings; ``ncclTopoPostset`` (``graph.connect``, run by ``graph.init_rank``) doubles
them, channel c + n repeating ring c with tree 1 of the double binary tree, then ``NCCL_MAX_NCHANNELS`` clamps and
``NCCL_MIN_NCHANNELS`` copies channels.  Here each channel gets this rank's place in its ring and tree.  Three
counts, three names: ``search_channels`` (what the search found), ``Communicator.nchannels`` (after Postset) and
``Plan.nchannels`` (what one collective uses).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from collectives.include.connector import Connector
from tracing import debug

from .graph.connect import Channels, channel_lines, rank_lines, tree_lines
from .graph.rings import Ring, setup_ring
from .graph.trees import TreeNode


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

    def connectors(self, recv_peers, send_peers) -> tuple[list[Connector], list[Connector]]:
        """The receive and send connectors of a thread group's peers, as NCCL's ``Primitives`` constructor takes
        them from ``channel->peers[p]``: a tree's ``down[]`` and ``up``, -1 meaning none."""
        return ([self.recv_from[p] for p in recv_peers if p != -1],
                [self.send_to[p] for p in send_peers if p != -1])


def init_channels(ch: Channels, rank: int) -> tuple[list[Channel], list[dict], list[tuple]]:
    """``initChannel`` for this rank on the channels its Postset built (``graph.init_rank``): (this rank's
    channels, every channel's tree as every rank sees it, each channel's origin (search ring, tree 0 or 1))."""
    trees = ch.trees()
    channels = [Channel(c, setup_ring(order, rank), trees[c][rank]) for c, order in enumerate(ch.rings)]
    return channels, trees, [(ch.ring_of[c], ch.tree_of[c]) for c in range(ch.n)]


def log_channels(rank: int, ch: Channels) -> None:
    """``initTransportsRank``'s INFO lines, as the search prints them (``graph.connect``): connectTrees' Tree
    lines, rank 0's Channel rings, this rank's place in each ring and its trees."""
    for line in tree_lines(ch, rank):
        debug.info("GRAPH", line)
    if rank == 0:
        for line in channel_lines(ch):
            debug.info("INIT", line)
    *rings, trees = rank_lines(ch, rank)
    for line in rings:
        debug.info("GRAPH", line)
    debug.info("INIT", trees)
