"""``ncclCommSplit``'s bookkeeping (``src/init.cc``: ``commGetSplitInfo``; ``src/bootstrap.cc``: what
``bootstrapSplit`` achieves): every rank's (color, key) gathered over the parent's bootstrap; the ranks of one color,
ordered by key then parent rank, form a child; the child's rank 0 opens a unique id and sends it to its members
over the parent's bootstrap (``bootstrapSend``).  The communicator itself is built by ``Communicator.split``.

Deliberate difference: NCCL builds the child's bootstrap ring through the parent's; here the child has a root of its
own (a fresh unique id), so its bootstrap is an ordinary one.
"""
from __future__ import annotations

from .bootstrap import UniqueId, new_unique_id

NCCL_SPLIT_NOCOLOR = -1
SPLIT_TAG = 0x5350  # the bootstrap tag of the child's unique id (p2p connection setup uses 1..4)


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


def child_unique_id(bootstrap, ranks: list[int], child_rank: int) -> UniqueId:
    """The child's rank 0 opens the child's root and sends its id to every other member; they receive it."""
    if child_rank == 0:
        uid = new_unique_id()
        for r in ranks[1:]:
            bootstrap.send(r, SPLIT_TAG, uid.to_bytes())
        return uid
    return UniqueId.from_bytes(bootstrap.recv(ranks[0], SPLIT_TAG, 1024, why="the split child's unique id"))
