"""Ring ReduceScatter, per channel (NCCL ``src/device/reduce_scatter.h``: ``runRing``).

``count`` is the per-rank count; rank r's block starts at ``r * count`` of the input.  Blocks are indexed by
``ring.userRanks`` (``[0]`` = self, ``[n-1]`` = prev): send the block of the rank n-1 hops ahead (``userRanks[n-1]``),
reduce-and-forward the next n-2, and finish with our own block into the output.
"""
from __future__ import annotations


def run_ring(prims, ring, work, nranks: int):
    ranks, count = ring.user_ranks, work.count
    elem_offset = 0
    while elem_offset < work.part_count:
        nelem = min(work.chunk_count, work.part_count - elem_offset)
        data_offset = work.part_offset + elem_offset
        yield from prims.send(data_offset + ranks[nranks - 1] * count, nelem)
        for j in range(2, nranks):
            yield from prims.recv_reduce_send(data_offset + ranks[nranks - j] * count, nelem)
        yield from prims.recv_reduce_copy(data_offset + ranks[0] * count, data_offset, nelem, post_op=True)
        elem_offset += work.chunk_count


def locate(work, nranks: int, esize: int, prim: str, src_ix, dst_ix) -> tuple[int, int]:
    """(loop, chunk = whose block) of a call from its input offset ``dataOffset + rank * count``; trace only."""
    r = (src_ix if src_ix is not None else dst_ix) - work.part_offset
    block, within = divmod(r, work.count) if work.count else (0, r)
    return within // work.chunk_count, block
