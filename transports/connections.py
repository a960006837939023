"""Connecting a communicator's channels (NCCL ``src/transport.cc``: ``ncclTransportP2pConnect``,
``ncclTransportP2pSetup``; ``src/transport/generic.cc``: ``ncclTransportRingConnect``, ``ncclTransportTreeConnect``),
and what the connections own.

Point-to-point connections (``connect_p2p``, connIndex 1) are made at a peer's first send or receive, between the
two ranks alone: their blobs go by the bootstrap's send/recv, not an allgather.

Rings: per channel a recv connector from ``ring.prev`` and a send connector to ``ring.next``.  Trees: per channel a
recv and a send connector with ``up`` and with each of ``down[]``; one that a ring already made is shared (both
use connIndex 0).  We connect trees at init, as NCCL does with ``NCCL_RUNTIME_CONNECT=0``.  For each (channel,
direction, peer) the registry's first transport that can connect wins.  Setup exchanges the connect blobs (SHM
segment names, NET listen handles) through one bootstrap allgather; then the senders connect (a TCP connect needs
no accept to complete), the receivers accept, and a barrier says every peer is done.

``Connections`` holds each transport's state for the communicator, and is how the communicator reaches them: to
hand the proxy its ops (``ncclProxySaveOp``), to ask whether a transport failed, and to free everything.
"""
from __future__ import annotations

import struct
import time

from collectives.include.device import MAXCHANNELS
from collectives.misc.param import timeout_s
from collectives.misc.sockets import BootstrapError
from tracing import debug

from .base import CommInfo
from .proxy import ProxyOp, wait_sent
from .registry import select_transport


CONNECT_SIZE = 256                  # NCCL's ncclConnect: the most a transport's blob may hold
BLOB_ENTRY = struct.Struct("<BHiH")  # direction (0 send, 1 recv), channel, peer, blob length; then the blob
# bootstrap tags of a p2p connection's setup, by this rank's direction: (what it sends, what it expects); the
# receiving end of a direction uses the sender's pair reversed.  The acks are each tag + 2.
P2P_TAGS = {"send": (1, 2), "recv": (2, 1)}
MAX_BLOBS_PER_CHANNEL = 16          # a ring's two and a tree's up to 2 x (1 up + 3 down), with room to spare


def encode_blobs(blobs: dict) -> bytes:
    """This rank's connect blobs ``{(direction, channel, peer): bytes}`` as one bounded message."""
    out = [struct.pack("<I", len(blobs))]
    for (d, ch, peer), blob in blobs.items():
        if len(blob) > CONNECT_SIZE:
            raise ValueError(f"a {d} connect blob of {len(blob)} bytes for channel {ch} exceeds {CONNECT_SIZE}")
        out += [BLOB_ENTRY.pack(d == "recv", ch, peer, len(blob)), blob]
    return b"".join(out)


def blobs_bound() -> int:
    return 4 + MAXCHANNELS * MAX_BLOBS_PER_CHANNEL * (BLOB_ENTRY.size + CONNECT_SIZE)


def decode_blobs(raw: bytes, rank: int) -> dict:
    """A peer's connect blobs back, each length checked against what the message holds."""
    def bad(why: str) -> BootstrapError:
        return BootstrapError(f"malformed connect blobs from rank {rank}: {why}")
    if len(raw) < 4:
        raise bad(f"{len(raw)} bytes")
    (count,) = struct.unpack_from("<I", raw)
    if count > MAXCHANNELS * MAX_BLOBS_PER_CHANNEL:
        raise bad(f"{count} entries")
    blobs, pos = {}, 4
    for _ in range(count):
        if pos + BLOB_ENTRY.size > len(raw):
            raise bad("truncated")
        recv, ch, peer, size = BLOB_ENTRY.unpack_from(raw, pos)
        pos += BLOB_ENTRY.size
        if size > CONNECT_SIZE or pos + size > len(raw):
            raise bad(f"a blob of {size} bytes")
        blobs[("recv" if recv else "send", ch, peer)] = raw[pos:pos + size]
        pos += size
    if pos != len(raw):
        raise bad(f"{len(raw) - pos} bytes after the last entry")
    return blobs


class Connections:
    def __init__(self, info: CommInfo, bootstrap, peer_info: list[dict]):
        self.info, self.bootstrap, self.peer_info = info, bootstrap, peer_info
        self.states: dict = {}  # transport -> its state for this communicator
        self.proxied = False    # whether any connection goes through a proxy (NET); fixed once connected
        # (peer, why) -> None, raising if the peer can no longer take part (the communicator's health); a p2p
        # setup asks it while it waits for the peer's blobs
        self.peer_check = None

    def _state(self, transport):
        if transport not in self.states:
            self.states[transport] = transport.new_state(self.info)
        return self.states[transport]

    def connect(self, needs: list, graph: int = -1) -> None:
        """``ncclTransportP2pSetup``: make every (channel, "send" | "recv", peer) connector not made yet, for the
        graph of id ``graph`` (0 ring, 1 tree).  Every rank calls this together."""
        me = self.peer_info[self.info.rank]
        unique = {(ch.id, d, p): (ch, d, p) for ch, d, p in needs}  # a peer may be both up and ring neighbour
        needs = [(ch, d, p) for ch, d, p in unique.values() if p not in (ch.recv_from if d == "recv" else ch.send_to)]
        chosen = {(ch.id, d, p): select_transport(me, self.peer_info[p]) for ch, d, p in needs}
        blobs = {}
        for ch, d, p in needs:
            t = chosen[(ch.id, d, p)]
            blobs[(d, ch.id, p)] = t.setup(self._state(t), ch.id, p, d == "send", graph=graph)
        all_blobs = [decode_blobs(raw, r)
                     for r, raw in enumerate(self.bootstrap.allgather(encode_blobs(blobs), blobs_bound()))]
        deadline = time.monotonic() + timeout_s()
        me_r = self.info.rank
        try:
            for side in ("send", "recv"):  # senders first
                for ch, d, p in needs:
                    if d != side:
                        continue
                    t = chosen[(ch.id, d, p)]
                    peer_blob = all_blobs[p].get(("recv" if d == "send" else "send", ch.id, me_r))
                    if peer_blob is None:
                        raise BootstrapError(f"rank {me_r}: rank {p} published no {d} peer for channel {ch.id}")
                    conn = t.connect(self._state(t), ch.id, p, d == "send", blobs[(d, ch.id, p)], peer_blob,
                                     deadline)
                    (ch.send_to if d == "send" else ch.recv_from)[p] = conn
            self.bootstrap.barrier()  # every peer has mapped our segments and accepted our connections
        finally:
            for t, state in self.states.items():
                t.connected(state)
            self.proxied = any(t.proxied(state) for t, state in self.states.items())

    def connect_p2p(self, needs: dict) -> dict:
        """``ncclTransportP2pSetup`` for point-to-point (connIndex 1): ``needs`` is {peer: {"send" | "recv":
        [channels]}}, the connectors this rank lacks; only the ranks concerned take part, each direction with a
        peer on its own tags (the peer asks for the same channels from its side).  First every blob goes out, then
        the peers' come in (so no order of peers can deadlock), the senders connect before the receivers accept,
        and a last message each way says both ends are connected (then SHM may unlink its segments).  Returns
        {(peer, channel, "send" | "recv"): connector}."""
        me, r = self.peer_info[self.info.rank], self.info.rank
        chosen = {p: select_transport(me, self.peer_info[p]) for p in needs}
        mine = {}
        for p, dirs in needs.items():
            t = chosen[p]
            for d, chans in dirs.items():
                blobs = {(d, c, p): t.setup(self._state(t), c, p, d == "send", conn_index=1) for c in chans}
                mine[(p, d)] = blobs
                self.bootstrap.send(p, P2P_TAGS[d][0], encode_blobs(blobs))
        theirs = {}
        for (p, d) in mine:
            why = (f"rank {r} {'sends to' if d == 'send' else 'receives from'} rank {p}, which has posted no "
                   f"matching {'recv' if d == 'send' else 'send'}")
            check = (lambda p=p, why=why: self.peer_check(p, why)) if self.peer_check else None
            theirs[(p, d)] = decode_blobs(self.bootstrap.recv(p, P2P_TAGS[d][1], blobs_bound(), why=why,
                                                              check=check), p)
        deadline = time.monotonic() + timeout_s()
        made = {}
        try:
            for side in ("send", "recv"):  # senders first: a NET connect completes without the peer's accept
                for (p, d), blobs in mine.items():
                    if d != side:
                        continue
                    t = chosen[p]
                    for (_, c, _), blob in blobs.items():
                        peer_blob = theirs[(p, d)].get(("recv" if d == "send" else "send", c, r))
                        if peer_blob is None:
                            raise BootstrapError(f"rank {r}: rank {p} published no p2p {d} peer for channel {c}")
                        made[(p, c, d)] = t.connect(self._state(t), c, p, d == "send", blob, peer_blob, deadline,
                                                    conn_index=1)
            for (p, d) in mine:  # both ends connected: the peer may release its setup
                self.bootstrap.send(p, P2P_TAGS[d][0] + 2, b"")
            for (p, d) in mine:
                why = f"rank {p} finishing its p2p connection with rank {r}"
                check = (lambda p=p, why=why: self.peer_check(p, why)) if self.peer_check else None
                self.bootstrap.recv(p, P2P_TAGS[d][1] + 2, 0, why=why, check=check)
        finally:
            for t in set(chosen.values()):
                t.connected(self._state(t))
            self.proxied = any(tt.proxied(state) for tt, state in self.states.items())
        return made

    # --- what the communicator asks of its connections ---

    def save_ops(self, counts: list, proto: str, slice_steps: int, chunk_steps: int, tracer, seq: int,
                 regs: dict | None = None) -> list:
        """``ncclProxySaveOp``: one op per proxied connector of ``counts`` [(connector, steps)], posted to its proxy
        in order (``Transport.save_ops``); returns the ops (the collective waits for its sends, see
        ``proxy.wait_sent``).  ``regs``: {id(connector): registered buffers' schedule} when the call uses them."""
        regs = regs or {}
        ops = [ProxyOp(conn.proxy_conn, proto, nsteps, slice_steps, chunk_steps, tracer, seq, regs.get(id(conn)))
               for conn, nsteps in counts if conn is not None and conn.proxy_conn is not None and nsteps]
        if ops:
            for t, state in self.states.items():
                t.save_ops(state, ops)
        return ops

    def wait_sent(self, kernel, ops: list):
        """A kernel work item that ends once every send op of ``ops`` is done (``proxy.wait_sent``)."""
        return wait_sent(kernel, [op for op in ops if op.nc.conn.is_send])

    def poll(self) -> bool:
        """While the kernel waits: each transport moves what it can from this thread (``Transport.progress``)."""
        moved = False
        for t, state in self.states.items():
            moved |= t.progress(state)
        return moved

    def wait(self, words: list, timeout_s: float) -> bool:
        """While the kernel waits, more ranks than cores: a transport that alone can move ``words`` sleeps until
        it can (``Transport.wait``); False if none can, and the kernel yields."""
        return any(t.wait(state, words, timeout_s) for t, state in self.states.items())

    def describe(self) -> list[dict]:
        """Every transport's in-flight work (``Transport.describe``), for a hang report."""
        return [entry for t, state in self.states.items() for entry in t.describe(state)]

    def error(self) -> str | None:
        return next((e for t, s in self.states.items() if (e := t.error(s))), None)

    def free(self, drain: bool = True) -> None:
        """Every transport's ``free`` (``freeChannel`` → ``transportComm->free``, then ``ncclProxyDestroy``), each
        one even if another failed: the first failure is raised once all are freed."""
        first = None
        for t, state in self.states.items():
            try:
                t.free(state, drain)
            except Exception as exc:  # noqa: BLE001 - free the rest, then report it
                first = first or exc
        self.states = {}
        if first is not None:
            raise first


def connect_rings(conns: Connections, channels: list) -> None:
    """``ncclTransportRingConnect``: per channel, recv from ``ring.prev`` and send to ``ring.next``."""
    needs = []
    for ch in channels:
        needs += [(ch, "recv", ch.ring.prev), (ch, "send", ch.ring.next)]
    conns.connect(needs, graph=0)
    for ch in channels:
        ch.recv, ch.send = ch.recv_from[ch.ring.prev], ch.send_to[ch.ring.next]
    debug.info("INIT", "Connected all rings, use ring PXN 0 GDR 0")


def connect_trees(conns: Connections, channels: list) -> None:
    """``ncclTransportTreeConnect``: per channel, recv from ``down[]`` and send to ``up`` (reduce), recv from ``up``
    and send to ``down[]`` (broadcast), all on connIndex 0: a connector the ring already made is reused."""
    needs = []
    for ch in channels:
        for peer in (ch.tree.up, *ch.tree.down):
            if peer != -1:
                needs += [(ch, "recv", peer), (ch, "send", peer)]
    conns.connect(needs, graph=1)
    debug.info("INIT", "Connected all trees")

