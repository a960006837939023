"""AllReduce per channel (NCCL ``src/device/all_reduce.h``: ``runRing``, ``runTreeUpDown``, ``runTreeSplit``).

Ring: per loop of ``nranks * chunkCount`` elements, one ``send``, n-2 ``recv_reduce_send`` (reduce-scatter),
``recv_reduce_copy_send`` with the post-op (this rank's chunk is final), n-2 ``recv_copy_send`` (allgather),
and a last ``recv``.  The chunk handled at each step rotates with ``ring.index``; the last loop shrinks
``chunkCount`` to ``alignUp(divUp(remCount, n), 16 / sizeof(T))``.

Tree: a reduce up the tree and a broadcast down it, per chunk.  ``runTreeSplit`` (NCCL's default) runs the two
as concurrent thread groups of one block; here they are two generators of the channel, stepped by the kernel
side by side.  ``runTreeUpDown`` (NCCL only on CUDA 11.2-11.3, sm80+; ``NCCLLAB_TREE_UPDOWN=1`` here) runs the
whole reduce, then the whole broadcast.  Deliberate difference: NCCL splits the block's threads 384/256 (Simple)
or 448/192 (LL, LL128) between the groups; one CPU thread has no threads to split.
"""
from __future__ import annotations

from collectives.include.bitops import round_up
from collectives.misc.param import env_int


def tree_up_down() -> bool:
    """``NCCLLAB_TREE_UPDOWN=1``: Tree AllReduce runs ``run_tree_up_down`` rather than ``run_tree_split``."""
    return bool(env_int("NCCLLAB_TREE_UPDOWN", 0))


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
            chunk_count = round_up(-(-rem_count // nranks), 16 // esize)

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
    """(loop, chunk) of a call from its element offset (``runRing``'s element -> chunk map); trace only."""
    loop_count = nranks * work.chunk_count
    r = (dst_ix if dst_ix is not None else src_ix) - work.part_offset
    loop = r // loop_count
    rem = work.part_count - loop * loop_count
    cc = work.chunk_count if rem >= loop_count else round_up(-(-rem // nranks), 16 // esize)
    return loop, (r - loop * loop_count) // cc


# --- Tree (NCCL ``runTreeUpDown`` / ``runTreeSplit``) ---------------------------------------------------------------
# Same chunk on every rank (no rotation): loop ``elemOffset += chunkCount`` over the channel's part.  Summation
# order: a rank reduces its input, then down[0], down[1], down[2] (reduceCopy's source order); the root adds its
# own input first, applies the post-op, and what it computes is what every rank receives.

def _tree_chunks(work):
    off, end, cc = work.part_offset, work.part_offset + work.part_count, work.chunk_count
    while off < end:
        yield off, min(cc, end - off)
        off += cc


def run_tree_up_down(prims, tree, work):
    """``runTreeUpDown``: the whole reduce phase, then the whole broadcast phase, in one thread group.
    ``prims(recv_peers, send_peers, group)`` is NCCL's ``Primitives`` constructor over the channel's connectors."""
    up = prims(tree.down, [tree.up], 1)                 # FanAsymmetric<3, 1>
    yield from run_tree_reduce_up(up, tree, work)
    up.finish()
    down = prims([tree.up], tree.down, 2)               # FanAsymmetric<1, 3>
    yield from run_tree_broadcast_down(down, tree, work)
    down.finish()


def run_tree_split(prims, tree, work) -> list:
    """``runTreeSplit`` (NCCL's default): the root runs one group that reduces and broadcasts each chunk
    (``FanSymmetric<2>`` over ``down[]``); any other rank runs the reduce group and the broadcast group side by
    side.  Returns one generator per thread group."""
    if tree.up == -1:
        root = prims(tree.down, tree.down, 0)
        return [root.finished(run_tree_root(root, work))]
    up, down = prims(tree.down, [tree.up], 1), prims([tree.up], tree.down, 2)
    return [up.finished(run_tree_reduce_up(up, tree, work)),
            down.finished(run_tree_broadcast_down(down, tree, work))]


def run_tree_reduce_up(prims, tree, work):
    """The reduce half: recv from ``down[]``, send to ``up`` (the root of runTreeUpDown keeps the result)."""
    for offset, nelem in _tree_chunks(work):
        if tree.up == -1:
            yield from prims.recv_reduce_copy(offset, offset, nelem, post_op=True)   # root: the result
        elif not tree.down:
            yield from prims.send(offset, nelem)                                      # leaf
        else:
            yield from prims.recv_reduce_send(offset, nelem)                          # middle


def run_tree_broadcast_down(prims, tree, work):
    """The broadcast half: recv from ``up``, copy to the output, send to ``down[]``."""
    for offset, nelem in _tree_chunks(work):
        if tree.up == -1:
            yield from prims.send_from_output(offset, nelem)                          # root of runTreeUpDown
        elif not tree.down:
            yield from prims.recv(offset, nelem)
        else:
            yield from prims.recv_copy_send(offset, nelem)


def run_tree_root(prims, work):
    """runTreeSplit's root: reduce the children into our input, store the result (post-op applied) and send it
    straight back down, one ``recv_reduce_copy_send`` per chunk."""
    for offset, nelem in _tree_chunks(work):
        yield from prims.recv_reduce_copy_send(offset, offset, nelem, post_op=True)


def locate_tree(work, prim: str, src_ix, dst_ix) -> tuple[int, int]:
    """(loop, chunk) of a tree call: one chunk per loop; trace only."""
    r = (dst_ix if dst_ix is not None else src_ix) - work.part_offset
    return r // work.chunk_count, 0
