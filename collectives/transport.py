"""Transport selection and ring connection (NCCL ``src/transport.cc``: ``selectTransport``,
``ncclTransportP2pSetup``; ``src/transport/generic.cc``: ``ncclTransportRingConnect``).

For every channel, a recv connector from ``ring.prev`` and a send connector to ``ring.next``.  Per (channel, peer,
direction) the first transport that can connect wins, in NCCL's order P2P, SHM, NET:
* P2P: none on a CPU (peer-mapped device memory is what SHM provides here), so ``NCCL_P2P_DISABLE`` changes
  nothing;
* SHM: same host hash (``NCCL_HOSTID`` can make one machine several hosts) and ``NCCL_SHM_DISABLE != 1``;
* NET: always possible; the socket plugin and a proxy thread carry the data.
Setup exchanges connect blobs (SHM segment names, NET listen handles) through one bootstrap allgather, then the
senders connect and the receivers accept.
"""
from __future__ import annotations

import time

from tracing import debug
from transports import net, shm

from .param import timeout_s


def select_transport(me: dict, peer: dict) -> str:
    return "SHM" if shm.can_connect(me, peer) else "NET"


def connect_rings(comm) -> None:
    me = comm.peer_info[comm.rank]
    node = comm.node_of_rank
    dev = lambda r: [q for q in range(comm.nranks) if node[q] == node[r]].index(r)  # noqa: E731  [cudaDev]
    kinds = {}
    for ch in comm.channels:
        kinds[("recv", ch.id)] = select_transport(me, comm.peer_info[ch.ring.prev])
        kinds[("send", ch.id)] = select_transport(me, comm.peer_info[ch.ring.next])
    comm._shm = shm.ShmSetup(comm.tag, comm.rank, comm.buff_sizes)
    plugin, listens, blobs = None, {}, {}
    if "NET" in kinds.values():
        from transports.net_socket import SocketNet  # the plugin imports collectives: load it when needed
        plugin = SocketNet()
        plugin.init()
    for ch in comm.channels:
        if kinds[("recv", ch.id)] == "SHM":
            blobs[("recv", ch.id)] = comm._shm.recv_setup(ch.id, ch.ring.prev)
        else:
            blobs[("recv", ch.id)], listens[ch.id] = plugin.listen(0)
        if kinds[("send", ch.id)] == "SHM":
            blobs[("send", ch.id)] = comm._shm.send_setup(ch.id, ch.ring.next)
    all_blobs = comm.bootstrap.allgather_obj(blobs)
    deadline = time.monotonic() + timeout_s()
    comm.net_connections = []
    try:
        for ch in comm.channels:  # senders first: a TCP connect needs no accept to complete
            nxt = ch.ring.next
            if kinds[("send", ch.id)] == "SHM":
                ch.send = comm._shm.send_connect(blobs[("send", ch.id)], all_blobs[nxt][("recv", ch.id)], nxt)
                debug.info("SHM", f"Channel {ch.id:02d} : {comm.rank}[{dev(comm.rank)}] -> {nxt}[{dev(nxt)}] "
                                  f"via SHM/direct/direct")
            else:
                ch.send = net.make_connector(nxt, True, comm.buff_sizes, "NET/Socket/0")
                nc = net.NetConnection(plugin, ch.send, plugin.connect(0, all_blobs[nxt][("recv", ch.id)],
                                                                      deadline), ch.id)
                comm.net_connections.append(nc)
                debug.info("NET", f"Channel {ch.id:02d}/0 : {comm.rank}[{dev(comm.rank)}] -> {nxt}[{dev(nxt)}] "
                                  f"[send] via NET/Socket/0")
        for ch in comm.channels:
            prev = ch.ring.prev
            if kinds[("recv", ch.id)] == "SHM":
                ch.recv = comm._shm.recv_connect(blobs[("recv", ch.id)], all_blobs[prev][("send", ch.id)], prev)
            else:
                ch.recv = net.make_connector(prev, False, comm.buff_sizes, "NET/Socket/0")
                nc = net.NetConnection(plugin, ch.recv, plugin.accept(listens[ch.id], deadline), ch.id)
                comm.net_connections.append(nc)
                debug.info("NET", f"Channel {ch.id:02d}/0 : {prev}[{dev(prev)}] -> {comm.rank}[{dev(comm.rank)}] "
                                  f"[receive] via NET/Socket/0")
        comm.bootstrap.barrier()  # every peer has mapped our segments and accepted our connections
    finally:
        comm._shm.unlink_all()
        for lc in listens.values():
            plugin.close_listen(lc)
    if comm.net_connections:
        comm.proxy = net.Proxy(comm.rank)
        comm.proxy.start()
    debug.info("INIT", "Connected all rings, use ring PXN 0 GDR 0")
