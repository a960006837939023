"""Ring AllGather, per channel (NCCL ``src/device/all_gather.h``: ``runRing``).

Works on bytes (NCCL turns AllGather into int8).  Step 0 copies our input into our block of the output and sends
it (``directSend`` when in place); then n-2 ``recv_copy_send`` of the blocks of ``userRanks[n-j]``; a final ``recv``
of the block of ``userRanks[1]`` (our successor, the last to reach us).
"""
from __future__ import annotations


def run_ring(prims, ring, work, nranks: int, in_place: bool):
    ranks, count = ring.user_ranks, work.count
    elem_offset = 0
    while elem_offset < work.part_count:
        nelem = min(work.chunk_count, work.part_count - elem_offset)
        data_offset = work.part_offset + elem_offset
        offset = data_offset + ranks[0] * count
        if in_place:  # our input already sits in our block of the output
            yield from prims.send(data_offset, nelem)
        else:
            yield from prims.copy_send(data_offset, offset, nelem)
        for j in range(1, nranks - 1):
            yield from prims.recv_copy_send(data_offset + ranks[nranks - j] * count, nelem)
        yield from prims.recv(data_offset + ranks[1] * count, nelem)
        elem_offset += work.chunk_count


def locate(work, nranks: int, esize: int, prim: str, src_ix, dst_ix, rank: int = 0) -> tuple[int, int]:
    """(loop, chunk = whose block) from the output offset ``dataOffset + rank * count``; trace only.  The first
    call of each loop (send / copy_send) moves our own block, addressed by its input offset."""
    if dst_ix is None or prim == "copy_send":
        return (src_ix - work.part_offset) // work.chunk_count, rank
    block, within = divmod(dst_ix - work.part_offset, work.count)
    return within // work.chunk_count, block
