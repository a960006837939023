"""Ring Reduce, per channel (NCCL ``src/device/reduce.h``: ``runRing``), a pipeline towards the root.

The rank after the root starts with ``send``; the root ends with ``recv_reduce_copy`` and the post-op; everyone
else does ``recv_reduce_send``.  Sum order: ``((x[root+1] + x[root+2]) + ...) + x[root]`` along the ring.
"""
from __future__ import annotations


def run_ring(prims, ring, work, nranks: int, root: int):
    rank, prev_rank = ring.user_ranks[0], ring.user_ranks[nranks - 1]
    elem_offset = 0
    while elem_offset < work.part_count:
        offset = work.part_offset + elem_offset
        nelem = min(work.chunk_count, work.part_count - elem_offset)
        if prev_rank == root:
            yield from prims.send(offset, nelem)
        elif rank == root:
            yield from prims.recv_reduce_copy(offset, offset, nelem, post_op=True)
        else:
            yield from prims.recv_reduce_send(offset, nelem)
        elem_offset += work.chunk_count


def locate(work, nranks: int, esize: int, prim: str, src_ix, dst_ix) -> tuple[int, int]:
    """(loop, chunk): a pipeline moves chunk i in loop i; trace only."""
    i = ((src_ix if src_ix is not None else dst_ix) - work.part_offset) // work.chunk_count
    return i, i
