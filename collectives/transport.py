"""Transport selection and connection (NCCL ``src/transport.cc``: ``selectTransport``, ``ncclTransportP2pSetup``;
``src/transport/generic.cc``: ``ncclTransportRingConnect``, ``ncclTransportTreeConnect``).

Rings: per channel a recv connector from ``ring.prev`` and a send connector to ``ring.next``.  Trees: per channel a
recv and a send connector with ``up`` and with each of ``down[]``; one that a ring already made is shared (both
use connIndex 0).  We connect trees at init, as NCCL does with ``NCCL_RUNTIME_CONNECT=0``.  Per (channel, peer,
direction) the first transport that can connect wins, in NCCL's order P2P, SHM, NET:
* P2P: none on a CPU (peer-mapped device memory is what SHM provides here), so ``NCCL_P2P_DISABLE`` changes
  nothing;
* SHM: same host hash (``NCCL_HOSTID`` can make one machine several hosts) and ``NCCL_SHM_DISABLE != 1``;
* NET: always possible; a net plugin (``transports.net_select``: IB or Socket) and a proxy thread carry the data.
Setup exchanges connect blobs (SHM segment names, NET listen handles) through one bootstrap allgather, then the
senders connect and the receivers accept.
"""
from __future__ import annotations

import time

from tracing import debug
from transports import net, shm

from misc.param import timeout_s


def select_transport(me: dict, peer: dict) -> str:
    return "SHM" if shm.can_connect(me, peer) else "NET"


def connect_rings(comm) -> None:
    """``ncclTransportRingConnect``: per channel, recv from ``ring.prev`` and send to ``ring.next``."""
    needs = []
    for ch in comm.channels:
        needs += [(ch, "recv", ch.ring.prev), (ch, "send", ch.ring.next)]
    connect(comm, needs)
    for ch in comm.channels:
        ch.recv, ch.send = ch.recv_from[ch.ring.prev], ch.send_to[ch.ring.next]
    debug.info("INIT", "Connected all rings, use ring PXN 0 GDR 0")


def connect_trees(comm) -> None:
    """``ncclTransportTreeConnect``: per channel, recv from ``down[]`` and send to ``up`` (reduce), recv from ``up``
    and send to ``down[]`` (broadcast), all on connIndex 0: a connector the ring already made is reused."""
    needs = []
    for ch in comm.channels:
        for peer in (ch.tree.up, *ch.tree.down):
            if peer != -1:
                needs += [(ch, "recv", peer), (ch, "send", peer)]
    connect(comm, needs)
    debug.info("INIT", "Connected all trees")


def connect(comm, needs: list) -> None:
    """``ncclTransportP2pSetup``: make every (channel, direction, peer) connector not made yet.  Every rank calls
    this together (one bootstrap allgather of the connect blobs, then a barrier)."""
    me = comm.peer_info[comm.rank]
    node = comm.node_of_rank
    dev = lambda r: [q for q in range(comm.nranks) if node[q] == node[r]].index(r)  # noqa: E731  [cudaDev]
    unique = {(ch.id, d, p): (ch, d, p) for ch, d, p in needs}  # a peer may be both up and ring neighbour
    needs = [(ch, d, p) for ch, d, p in unique.values() if p not in (ch.recv_from if d == "recv" else ch.send_to)]
    kinds = {(ch.id, d, p): select_transport(me, comm.peer_info[p]) for ch, d, p in needs}
    if comm._shm is None:
        comm._shm = shm.ShmSetup(comm.tag, comm.rank, comm.buff_sizes)
    if "NET" in kinds.values() and comm.net_plugin is None:
        from transports.net_select import select_plugin  # the plugins import collectives: load them when needed
        comm.net_plugin = select_plugin()
    plugin, listens, blobs = comm.net_plugin, {}, {}
    via = f"NET/{plugin.name}/0" if plugin is not None else ""
    for ch, d, p in needs:
        key = (d, ch.id, p)
        if kinds[(ch.id, d, p)] == "SHM":
            blobs[key] = (comm._shm.recv_setup if d == "recv" else comm._shm.send_setup)(ch.id, p)
        elif d == "recv":
            blobs[key], listens[key] = plugin.listen(0)
    all_blobs = comm.bootstrap.allgather_obj(blobs)
    deadline = time.monotonic() + timeout_s()
    me_r = comm.rank
    try:
        for ch, d, p in needs:  # senders first: a TCP connect needs no accept to complete
            if d != "send":
                continue
            peer_blob = all_blobs[p][("recv", ch.id, me_r)]
            if kinds[(ch.id, d, p)] == "SHM":
                ch.send_to[p] = comm._shm.send_connect(blobs[(d, ch.id, p)], peer_blob, p)
                debug.info("INIT|SHM", f"Channel {ch.id:02d} : {me_r}[{dev(me_r)}] -> {p}[{dev(p)}] via SHM/direct")
            else:
                conn = ch.send_to[p] = net.make_connector(p, True, comm.buff_sizes, via)
                comm.net_connections.append(net.NetConnection(plugin, conn, plugin.connect(0, peer_blob, deadline),
                                                              ch.id))
                debug.info("INIT|NET", f"Channel {ch.id:02d}/0 : {me_r}[{dev(me_r)}] -> {p}[{dev(p)}] [send] via "
                                  f"{via}")
        for ch, d, p in needs:
            if d != "recv":
                continue
            if kinds[(ch.id, d, p)] == "SHM":
                ch.recv_from[p] = comm._shm.recv_connect(blobs[(d, ch.id, p)], all_blobs[p][("send", ch.id, me_r)], p)
            else:
                conn = ch.recv_from[p] = net.make_connector(p, False, comm.buff_sizes, via)
                comm.net_connections.append(net.NetConnection(plugin, conn, plugin.accept(listens[(d, ch.id, p)],
                                                                                           deadline), ch.id))
                debug.info("INIT|NET", f"Channel {ch.id:02d}/0 : {p}[{dev(p)}] -> {me_r}[{dev(me_r)}] [receive] via "
                                  f"{via}")
        comm.bootstrap.barrier()  # every peer has mapped our segments and accepted our connections
    finally:
        comm._shm.unlink_all()
        for lc in listens.values():
            plugin.close_listen(lc)
    if comm.net_connections and comm.proxy is None:
        comm.proxy = net.Proxy(comm.rank)
        comm.proxy.start()
