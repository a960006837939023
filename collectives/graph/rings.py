"""Ring order per channel (NCCL ``src/graph/rings.cc``: ``ncclBuildRings``; ``src/init.cc``: ``setupChannel``).

NCCL's ring search on one node tries PCI order (0, 1, ..., n-1) first, which is what a CPU "topology" has, so the
default ring is rank order.  A ring may also be given explicitly, to replay one copied from a real NCCL log
(``Channel 00/02 : 0 3 2 1``): by the API (``rings=[[0, 3, 2, 1], ...]``, each checked by ``validate_ring``), or as a
graph in ``NCCL_GRAPH_FILE`` (``graph_xml``).  Channel c uses ring ``c % len(rings)``, and channels copied up to
NCCL_MIN_NCHANNELS reuse the rings like NCCL's ``copyChannels``.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Ring:
    """``struct ncclRing`` as ``setupChannel`` fills it for one rank."""
    prev: int
    next: int
    index: int               # position from rank 0 along this ring (chunk rotation in runRing)
    user_ranks: tuple        # the ring starting at self: [0] = self, [1] = next, [n-1] = prev
    order: tuple             # the ring as given (for the log line)


def validate_ring(ring: list[int], nranks: int) -> None:
    if sorted(ring) != list(range(nranks)):
        raise ValueError(f"ring {ring} is not a permutation of ranks 0..{nranks - 1}")


def ring_orders(nranks: int, nchannels: int, rings: list[list[int]] | None = None,
                node_of: list[int] | None = None) -> list[list[int]]:
    """The ring of every channel: explicit ones, else each node's ranks in order, node after node
    (``connectRings`` links node n's last rank to node n+1's first)."""
    if not rings:
        nodes = node_of or [0] * nranks
        rings = [sorted(range(nranks), key=lambda r: (nodes[r], r))]
    for r in rings:
        validate_ring(list(r), nranks)
    return [list(rings[c % len(rings)]) for c in range(nchannels)]


def setup_ring(order: list[int], rank: int) -> Ring:
    """``setupChannel``: index counted from rank 0's position, userRanks rotated to start at self."""
    n = len(order)
    pos, pos0 = order.index(rank), order.index(0)
    user = tuple(order[(i + pos) % n] for i in range(n))
    return Ring(prev=user[n - 1], next=user[1 % n], index=(pos - pos0 + n) % n, user_ranks=user, order=tuple(order))


def ring_log_line(channel: int, nchannels: int, order: list[int]) -> str:
    """``dumpLine`` with prefix ``Channel %02d/%02d :``: the ring from rank 0, each rank as `` %*d`` (width = digits
    of n-1), written into a 128-byte buffer; when it overflows, the last three characters that fit become ``...``
    (so a truncated line is 127 characters)."""
    n = len(order)
    width = len(str(n - 1))
    pos0 = order.index(0)
    line = f"Channel {channel:02d}/{nchannels:02d} :"
    for i in range(n):
        if len(line) >= 127:
            break
        line += f" {order[(pos0 + i) % n]:>{width}d}"
    if len(line) >= 128:
        return line[:124] + "..."
    return line[:127]
