"""Where the GPU kernel finds its connections (NCCL ``src/include/device.h``: ``ncclConnInfo``'s ``buffs``, ``head``,
``tail`` and ``step``; ``src/transport/p2p.cc``: ``p2pSendSetup``/``p2pRecvSetup`` size them).

Every (channel, sender, receiver) edge of the rings and trees is one connection, numbered the same way on every
rank, and is one row of each pool array: the Simple FIFO (``NCCL_STEPS`` slots of ``NCCL_BUFFSIZE / 8``), the LL
FIFO (16-byte lines as 64-bit words), the LL128 FIFO (128-byte lines as 64-bit words), ``ctrl`` (head: the sender
polls it; tail: the receiver polls it) and ``steps`` (each side's persistent step).  A ring and a tree share the
connection of the same (channel, sender, receiver), as in NCCL (both use connIndex 0).  ``ring[rank, channel]`` and
``tree[rank, channel]`` give a rank's connection numbers; the kernel indexes the pools with them.
Deliberate difference: NCCL gives each connection its own allocation in the receiver's memory (or the sender's for
P2P read) and exchanges one handle per connection; the lab keeps a node's rows in one pool, so that a kernel
reaches every peer's row through one array (numba-cuda has no pointer arithmetic over foreign allocations).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from collectives.include.bitops import round_up
from collectives.include.device import NCCL_STEPS

from .sync import ABORT_WORDS

# ring[rank, channel]: [recv conn, send conn, ring index, userRanks...]
# tree[rank, channel]: [up, down0..2, conn from up, conn to up, conns from down0..2, conns to down0..2]
T_UP, T_DOWN, T_FROM_UP, T_TO_UP, T_FROM_DOWN, T_TO_DOWN = 0, 1, 4, 5, 6, 9
TREE_WORDS = 12


@dataclass
class Tables:
    ring: np.ndarray    # int64[n, nch, 3 + n]
    tree: np.ndarray    # int64[n, nch, TREE_WORDS]
    conns: np.ndarray   # int64[nconn, 2]: (sender, receiver) of each connection, for error lines
    ids: dict           # (channel, sender, receiver) -> connection number


def connection_tables(rings: list[list[int]], trees: list, nranks: int, nchannels: int) -> Tables:
    """Number every edge of the ``nchannels`` rings and trees (``trees[c][rank]``: ``up``, ``down``)."""
    from collectives.graph.rings import setup_ring
    n, ids = nranks, {}

    def conn(c: int, src: int, dst: int) -> int:
        return ids.setdefault((c, src, dst), len(ids))

    ring = np.full((n, nchannels, 3 + n), -1, np.int64)
    tree = np.full((n, nchannels, TREE_WORDS), -1, np.int64)
    for c in range(nchannels):
        for r in range(n):
            rg = setup_ring(rings[c], r)
            ring[r, c, 0], ring[r, c, 1] = conn(c, rg.prev, r), conn(c, r, rg.next)
            ring[r, c, 2] = rg.index
            ring[r, c, 3:] = rg.user_ranks
            node = trees[c][r]
            tree[r, c, T_UP] = node.up
            if node.up >= 0:
                tree[r, c, T_FROM_UP], tree[r, c, T_TO_UP] = conn(c, node.up, r), conn(c, r, node.up)
            for i, d in enumerate(node.down):
                tree[r, c, T_DOWN + i] = d
                tree[r, c, T_FROM_DOWN + i], tree[r, c, T_TO_DOWN + i] = conn(c, d, r), conn(c, r, d)
    conns = np.zeros((len(ids), 2), np.int64)
    for (c, src, dst), i in ids.items():
        conns[i] = (src, dst)
    return Tables(ring, tree, conns, ids)


@dataclass
class PoolLayout:
    """Byte offsets of the pool arrays in one allocation (each 128-byte aligned, as NCCL aligns its FIFOs)."""
    nconn: int
    simple_bytes: int   # per connection: NCCL_STEPS slots of NCCL_BUFFSIZE / NCCL_STEPS
    ll_words: int       # per connection and slot: 64-bit words (two per 16-byte line)
    ll128_words: int = 0  # per connection and slot: 64-bit words, whole 2048-byte wire slices

    def arrays(self) -> list[tuple[str, tuple, np.dtype]]:
        return [("fifo_s", (self.nconn, self.simple_bytes), np.dtype(np.uint8)),
                ("fifo_ll", (self.nconn, NCCL_STEPS, self.ll_words), np.dtype(np.uint64)),
                ("fifo_ll128", (self.nconn, NCCL_STEPS, self.ll128_words), np.dtype(np.uint64)),
                ("ctrl", (self.nconn, 2), np.dtype(np.int64)),
                ("steps", (self.nconn, 2), np.dtype(np.int64)),
                ("abort", (ABORT_WORDS,), np.dtype(np.int64))]

    def offsets(self) -> tuple[dict, int]:
        out, off = {}, 0
        for name, shape, dt in self.arrays():
            out[name] = off
            off += round_up(int(np.prod(shape)) * dt.itemsize, 128)
        return out, max(off, 128)

    @property
    def nbytes(self) -> int:
        return self.offsets()[1]

    def views(self, base) -> dict:
        """The pool arrays over ``base`` (a uint8 array of ``nbytes``: numpy, or cupy on a GPU)."""
        offs, _ = self.offsets()
        out = {}
        for name, shape, dt in self.arrays():
            size = int(np.prod(shape)) * dt.itemsize
            out[name] = base[offs[name]:offs[name] + size].view(dt).reshape(shape)
        return out


@dataclass
class LaunchMemory:
    """What a launch reads besides the pool and the user's buffers, on the device: the connection tables, the LL
    and LL128 staging and the thread-group barriers of the ranks it carries (row 0: its first rank)."""
    ring: object
    tree: object
    conns: object
    stage: object     # uint8[ranks, nch, 3 thread groups, 3 recv peers + the send slot, LL data bytes per slot]
    stage128: object  # uint8[ranks, nch, 3 recv peers + the send slot, warps per block, 32 lanes, 8 words]
    bars: object      # int64[ranks, nch, 3 thread groups, 2]: the simulator's barriers (a GPU has named ones)


def launch_memory(dev, tables: Tables, nranks_here: int, nchannels: int, buff_sizes: dict,
                  warps: int = 20) -> LaunchMemory:
    """``warps``: LL128's warps per block (NCCL's 640 threads: 20; the simulator plays a warp per thread)."""
    st = staging(dev, nranks_here, nchannels, buff_sizes)
    return LaunchMemory(dev.to_device(tables.ring), dev.to_device(tables.tree), dev.to_device(tables.conns),
                        st.stage, dev.zeros((nranks_here, nchannels, 4, max(1, warps), 32, 64), np.uint8), st.bars)


@dataclass
class Staging:
    """LL staging (``LaunchMemory.stage``) and the simulator's barriers (``LaunchMemory.bars``) of a launch."""
    stage: object
    bars: object


def staging(dev, nranks_here: int, nchannels: int, buff_sizes: dict) -> Staging:
    """LL's staging (3 thread groups, 3 recv peers + the send slot, a slot's data bytes) and 3 groups' barriers
    per rank and channel: what the SendRecv kernel needs of ``launch_memory``."""
    ll_data = buff_sizes["LL"] // NCCL_STEPS // 2
    return Staging(dev.zeros((nranks_here, nchannels, 3, 4, ll_data), np.uint8),
                   dev.zeros((nranks_here, nchannels, 3, 2), np.int64))


def pool_layout(nconn: int, buff_sizes: dict) -> PoolLayout:
    # LL128: whole wire slices per slot (a slot of NCCL_LL128_BUFFSIZE / 8 bytes cut down to 2048-byte slices,
    # so that every 16-byte access is aligned)
    return PoolLayout(nconn, NCCL_STEPS * (buff_sizes["Simple"] // NCCL_STEPS), buff_sizes["LL"] // NCCL_STEPS // 8,
                      buff_sizes.get("LL128", 0) // NCCL_STEPS // 2048 * 256)
