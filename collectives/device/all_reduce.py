"""Ring AllReduce, per channel (NCCL ``src/device/all_reduce.h``: ``runRing``).

Per loop of ``nranks * chunkCount`` elements: one ``send``, n-2 ``recv_reduce_send`` (reduce-scatter),
``recv_reduce_copy_send`` with the post-op (this rank's chunk is final), n-2 ``recv_copy_send`` (allgather),
and a last ``recv``.  The chunk handled at each step rotates with ``ring.index``; the last loop shrinks
``chunkCount`` to ``alignUp(divUp(remCount, n), 16 / sizeof(T))``.
"""
from __future__ import annotations


def _align_up(a: int, b: int) -> int:
    return (a + b - 1) // b * b


def run_ring(prims, ring, work, nranks: int):
    ring_ix = ring.index
    grid_offset, channel_count, chunk_count = work.part_offset, work.part_count, work.chunk_count
    esize = prims.esize
    loop_count = nranks * chunk_count
    mod = lambda r: r - nranks if r >= nranks else r  # noqa: E731  (NCCL's modRanks)
    elem_offset = 0
    while elem_offset < channel_count:
        rem_count = channel_count - elem_offset
        if rem_count < loop_count:
            chunk_count = _align_up(-(-rem_count // nranks), 16 // esize)

        def chunk_args(chunk: int) -> tuple[int, int]:
            off = chunk * chunk_count
            return grid_offset + elem_offset + off, min(chunk_count, rem_count - off)

        offset, nelem = chunk_args(mod(ring_ix + nranks - 1))          # step 0: push to next
        yield from prims.send(offset, nelem)
        for j in range(2, nranks):                                      # k-2 reduce-and-forward steps
            offset, nelem = chunk_args(mod(ring_ix + nranks - j))
            yield from prims.recv_reduce_send(offset, nelem)
        offset, nelem = chunk_args(ring_ix)                             # step k-1: our chunk is final
        yield from prims.recv_reduce_copy_send(offset, offset, nelem, post_op=True)
        for j in range(1, nranks - 1):                                  # k-2 copy-and-forward steps
            offset, nelem = chunk_args(mod(ring_ix + nranks - j))
            yield from prims.recv_copy_send(offset, nelem)
        offset, nelem = chunk_args(mod(ring_ix + 1))                    # final copy into the output
        yield from prims.recv(offset, nelem)
        elem_offset += loop_count


def locate(work, nranks: int, esize: int, prim: str, src_ix, dst_ix) -> tuple[int, int]:
    """(loop, chunk) of a call from its element offset (NCCL_FACTS §3.2's element -> chunk map); trace only."""
    loop_count = nranks * work.chunk_count
    r = (dst_ix if dst_ix is not None else src_ix) - work.part_offset
    loop = r // loop_count
    rem = work.part_count - loop * loop_count
    cc = work.chunk_count if rem >= loop_count else _align_up(-(-rem // nranks), 16 // esize)
    return loop, (r - loop * loop_count) // cc
