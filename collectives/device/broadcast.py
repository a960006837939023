"""Ring Broadcast, per channel (NCCL ``src/device/broadcast.h``: ``runRing``), a pipeline from the root.

The root sends (copying into its own output first when out of place); the rank whose ``next`` is the root only
receives; every other rank receives, copies into its output and forwards.  Bytes, as in NCCL (int8).
"""
from __future__ import annotations


def run_ring(prims, ring, work, nranks: int, root: int, in_place: bool):
    rank, next_rank = ring.user_ranks[0], ring.user_ranks[1 % nranks]
    elem_offset = 0
    while elem_offset < work.part_count:
        offset = work.part_offset + elem_offset
        nelem = min(work.chunk_count, work.part_count - elem_offset)
        if rank == root:
            if in_place:
                yield from prims.send(offset, nelem)
            else:
                yield from prims.copy_send(offset, offset, nelem)
        elif next_rank == root:
            yield from prims.recv(offset, nelem)
        else:
            yield from prims.recv_copy_send(offset, nelem)
        elem_offset += work.chunk_count


def locate(work, nranks: int, esize: int, prim: str, src_ix, dst_ix) -> tuple[int, int]:
    """(loop, chunk): a pipeline moves chunk i in loop i; trace only."""
    i = ((src_ix if src_ix is not None else dst_ix) - work.part_offset) // work.chunk_count
    return i, i
