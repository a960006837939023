"""``ncclCommSplit``'s bookkeeping (``src/init.cc``: ``commGetSplitInfo`` and the child's hash; ``src/bootstrap.cc``:
``bootstrapSplit``): every rank's (color, key) gathered over the parent's bootstrap; the ranks of one color,
ordered by key then parent rank, form a child; the child's bootstrap ring is built through the parent's
(``SplitBootstrap``: each member sends where it listens to its ring predecessor with the parent's ``bootstrapSend``
and learns its successor's with ``bootstrapRecv``), no root involved.  The communicator itself is built by
``Communicator.split``.

Where we differ on purpose: the child's magic is a BLAKE2 digest of (the parent's magic, the parent's split count,
the color), not NCCL's ``digestHash`` of its commHash, childCount and color: the same inputs, our own hash.
"""
from __future__ import annotations

import hashlib
import struct

from .bootstrap import Bootstrap, UniqueId

SPLIT_RING_TAG = 0x5351  # the parent's bootstrap tag of a child's ring address (p2p connection setup uses 1..4)

NCCL_SPLIT_NOCOLOR = -1


def split_info(bootstrap, color: int | None, key: int) -> tuple[list[int], int] | None:
    """``commGetSplitInfo``: (the parent ranks of this rank's child, in child rank order; this rank's child rank),
    or None for ``color`` None (``NCCL_SPLIT_NOCOLOR``: no child, but this rank still takes part)."""
    if color is not None and (not isinstance(color, int) or color < 0):
        raise ValueError(f"split: color {color!r} must be a non-negative integer or None (NCCL_SPLIT_NOCOLOR)")
    if not isinstance(key, int):
        raise ValueError(f"split: key {key!r} must be an integer")
    mine = NCCL_SPLIT_NOCOLOR if color is None else color
    colors_keys = bootstrap.allgather_struct("<qq", mine, key)
    if color is None:
        return None
    members = sorted((k, r) for r, (c, k) in enumerate(colors_keys) if c == mine)
    ranks = [r for _, r in members]
    return ranks, ranks.index(bootstrap.rank)


def child_magic(parent_magic: int, split_count: int, color: int) -> int:
    """The child's magic (NCCL: its commHash), the same on every member: from the parent's, its split count and
    the color."""
    digest = hashlib.blake2b(struct.pack("<QQq", parent_magic & (2 ** 64 - 1), split_count, color), digest_size=8)
    return int.from_bytes(digest.digest(), "little")


class SplitBootstrap(Bootstrap):
    """``bootstrapSplit``: the child's ring, its ends found through the parent's bootstrap (``ranks``: the parent
    ranks of the child, in child rank order); the rest (ring sockets, the listen address allgather) as any ring."""

    def __init__(self, parent: Bootstrap, ranks: list[int], child_rank: int, magic: int):
        self._parent, self._ranks = parent, ranks
        super().__init__(UniqueId("", 0, magic), child_rank, len(ranks))

    def _ring_successor(self, deadline: float, my_addr: tuple[str, int]) -> tuple[str, int]:
        n, me = len(self._ranks), self.rank
        if n == 1:
            return my_addr
        prev, nxt = self._ranks[(me - 1) % n], self._ranks[(me + 1) % n]
        self._parent.send(prev, SPLIT_RING_TAG, struct.pack("<H", my_addr[1]) + my_addr[0].encode())
        raw = self._parent.recv(nxt, SPLIT_RING_TAG, 2 + 256, why=f"the split child's ring address of rank {nxt}")
        return raw[2:].decode(), struct.unpack_from("<H", raw)[0]
