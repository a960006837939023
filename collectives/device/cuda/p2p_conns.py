"""The point-to-point connectors of ranks that are threads of one process (NCCL ``src/transport.cc``:
``ncclTransportP2pConnect`` marks a peer's channels at its first use, ``ncclTransportP2pSetup`` connects them at
the group's end, on connection index 1; ``src/transport/p2p.cc``: ``p2pSendSetup``/``p2pRecvSetup`` size the FIFOs,
the sender prints ``Channel NN/1 : a[a] -> b[b] via P2P/direct pointer``).

Each (channel, sender, receiver) edge a group uses gets a connector the first time, and keeps it: its Simple and
LL FIFOs, head, tail and steps are one row of the p2p pool (``layout.PoolLayout``, as the collectives' connIndex-0
rows are).  A pair used later adds rows: the pool is made again, one row bigger per new edge, with the old rows'
contents (steps, heads, tails, the LL flags left in the slots) copied over, so a connector carries its state from
one group to the next as NCCL's does.
Deliberate difference: NCCL allocates each connector on its own and exchanges a handle for it; the lab keeps the
rows in one array (numba-cuda has no pointer arithmetic over foreign allocations), reallocated when it grows, which
happens only between launches.
"""
from __future__ import annotations

import numpy as np

from transports import p2p

from .layout import pool_layout

P2P_CONN_INDEX = 1  # NCCL's connIndex of point-to-point connectors


class P2pConnectors:
    """The p2p pool of a ``ThreadComm``: ``ids[(channel, sender, receiver)]`` is the edge's row."""

    def __init__(self, dev, buff_sizes: dict):
        self.dev, self.buff = dev, buff_sizes
        self.ids: dict[tuple[int, int, int], int] = {}
        self.pool: dict | None = None
        self._rows = 0
        self.conns = None  # device int64[rows, 2]: (sender, receiver) of each row, for the deadline lines
        self._grow()

    def connect(self, edges: list[tuple[int, int, int]]) -> None:
        """Rows for the ``(channel, sender, receiver)`` edges not connected yet, logged as NCCL does."""
        new = [e for e in dict.fromkeys(edges) if e not in self.ids]
        if not new:
            return
        for e in new:
            self.ids[e] = len(self.ids)
            c, src, dst = e
            p2p.log_connection(c, src, src, dst, dst, "direct pointer", P2P_CONN_INDEX)
        self._grow()

    def row(self, channel: int, sender: int, receiver: int) -> int:
        return self.ids[(channel, sender, receiver)]

    def _grow(self) -> None:
        layout = pool_layout(max(1, len(self.ids)), dict(self.buff, LL128=0))  # p2p has no LL128
        pool = layout.views(self.dev.zeros(layout.nbytes, np.uint8))
        if self.pool is not None and self._rows:
            for name, old in self.pool.items():
                if name != "abort":
                    pool[name][:self._rows] = old[:self._rows]  # device to device (cupy, or the simulator's)
        self.pool, self._rows = pool, len(self.ids)
        table = np.zeros((max(1, len(self.ids)), 2), np.int64)
        for (_, src, dst), i in self.ids.items():
            table[i] = (src, dst)
        self.conns = self.dev.to_device(table)
