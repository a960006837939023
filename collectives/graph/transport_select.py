"""Which transport, NIC and proxy each ring and tree connection takes, and the lines NCCL prints as it sets them up
(NCCL ``src/transport/generic.cc``: ``ncclTransportRingConnect``, ``ncclTransportTreeConnect``;
``src/transport.cc``: ``ncclTransportP2pConnect``, ``ncclTransportP2pSetup``, ``selectTransport``;
``src/transport/p2p.cc``: ``p2pCanConnect``, ``p2pSendSetup``; ``src/transport/shm.cc``: ``shmCanConnect``,
``shmSendSetup``; ``src/transport/net.cc``: ``canConnect``, ``sendSetup``, ``recvSetup``).

For every channel a rank asks to receive from its ring ``prev`` and send to its ring ``next`` (then, for the trees,
receive from its children and send to its parent, and receive from its parent and send to its children), skipping
connections the channel already has.  ``ncclTransportP2pSetup`` then walks the peers at distance i = 1 .. n-1:
the receives from rank - i over every channel, then the sends to rank + i.  Each connection takes the first
transport that can connect, P2P, then SHM, then NET:

- P2P when the GPUs' path is within the P2P level, unless the NIC would be faster (``ncclTopoCheckNet``); a path
  through a relay GPU is ``P2P/indirect``; ``/read`` on Ampere NVLink.  Only the sender prints.
- SHM on the same host unless NCCL_SHM_DISABLE=1 or the NIC would be faster.  Only the sender prints.
- NET otherwise: the NIC is ``ncclTopoGetNetDev``'s for the collective's graph (``nets.net_dev``), a send over a
  PXN path goes through the NVLink peer's proxy (``NET/IB/<dev>(<proxy rank>)``); ``/GDRDMA`` when
  ``ncclTopoCheckGdr`` allows it (reads for sends, writes for receives).  Receives never use PXN.

Differences on purpose: ranks are separate processes (no ``P2P/direct pointer``), the driver supports cuMem
(``P2P/CUMEM``; NCCL_CUMEM_ENABLE=0 gives ``P2P/IPC``), no CE memcpy, MNNVL, CollNet, NVLS or PAT connections;
the net plugin is the stand-in IB one of topo_xml.
"""
from __future__ import annotations

from dataclasses import dataclass

from collectives.include.device import MAXCHANNELS
from collectives.misc.param import env_int

from .nets import net_dev
from .paths import GDR_DISABLED, GDR_PCI, check_net, check_p2p, gdr_mode
from .topo import GPU, System


@dataclass
class Conn:
    """One connection as ``selectTransport`` sets it up on ``rank``: over ``transport`` (P2P, SHM or NET) to
    ``peer`` on ``channel``; for NET the NIC's device, the proxy rank and the GDR mode; ``line`` is the INFO line
    the setup prints (None: that side prints nothing)."""
    rank: int
    peer: int
    channel: int
    send: bool
    transport: str
    line: str | None
    net_dev: int = -1
    proxy: int = -1
    gdr: int = GDR_DISABLED


@dataclass
class RankTopo:
    """What one rank knows when it connects: its node's system, its own ring and tree graphs, the aligned search
    channel count, every rank's node and every rank's nvmlDev (``ncclPeerInfo``)."""
    system: System
    ring: object
    tree: object
    n_channels: int
    node_of: list
    nvml_dev: list


def _name(t: RankTopo, r: int) -> str:
    return f"{r}[{t.nvml_dev[r]}]"


def select_transport(t: RankTopo, graph, me: int, peer: int, channel: int, send: bool,
                     net_name: str = "IB") -> Conn:
    """``selectTransport``: the first of P2P, SHM, NET whose ``canConnect`` says yes, set up as its ``setup``
    does (connIndex 0, not shared: a collective's graph is given)."""
    head = f"Channel {channel:02d}/0 : "
    pair = f"{_name(t, me)} -> {_name(t, peer)}" if send else f"{_name(t, peer)} -> {_name(t, me)}"
    if t.node_of[me] == t.node_of[peer]:
        p2p, read, inter = check_p2p(t.system, me, peer)
        if p2p and (inter != -1 or not check_net(t.system, me, peer)):
            read_env = env_int("NCCL_P2P_READ_ENABLE", -2)
            read = bool(read_env) if read_env != -2 else read
            suffix = "/read" if read else ""
            if inter != -1:
                how = f"P2P/indirect/{_name(t, inter)}{suffix}"
            else:
                how = f"P2P/CUMEM{suffix}" if env_int("NCCL_CUMEM_ENABLE", 1) else f"P2P/IPC{suffix}"
            return Conn(me, peer, channel, send, "P2P", f"{head}{pair} via {how}" if send else None)
        if env_int("NCCL_SHM_DISABLE", 0) != 1 and not check_net(t.system, me, peer):
            return Conn(me, peer, channel, send, "SHM",
                        f"Channel {channel:02d} : {pair} via SHM/direct" if send else None)
    n, dev, proxy = net_dev(t.system, graph, t.n_channels, me, channel)
    if not send:
        proxy = me                                    # "We don't support PXN on receive yet"
    gdr = gdr_mode(t.system, me, n, send)
    via = f"NET/{net_name}/{dev}" + (f"({proxy})" if proxy != me else "")
    via += ("/GDRDMA" if gdr != GDR_DISABLED else "") + ("(PCI)" if gdr == GDR_PCI else "")
    return Conn(me, peer, channel, send, "NET", f"{head}{pair} [{'send' if send else 'receive'}] via {via}",
                dev, proxy, gdr)


def p2p_setup(t: RankTopo, graph, me: int, nranks: int, recv_mask: dict, send_mask: dict,
              net_name: str = "IB") -> list[Conn]:
    """``ncclTransportP2pSetup``: for i = 1 .. nranks-1, the receives from ``me - i`` channel by channel, then the
    sends to ``me + i``; ``recv_mask[peer]`` / ``send_mask[peer]`` are the channels asked for."""
    out = []
    for i in range(1, nranks):
        recv_peer, send_peer = (me - i) % nranks, (me + i) % nranks
        for c in sorted(recv_mask.get(recv_peer, ())):
            out.append(select_transport(t, graph, me, recv_peer, c, False, net_name))
        for c in sorted(send_mask.get(send_peer, ())):
            out.append(select_transport(t, graph, me, send_peer, c, True, net_name))
    return out


def _connect(me: int, nranks: int, channel: int, recv_peers, send_peers, recv_mask: dict, send_mask: dict,
             connected: set) -> None:
    """``ncclTransportP2pConnect``: ask for the connections the channel does not have yet."""
    for p in recv_peers:
        if p != -1 and p < nranks and p != me and (channel, p, False) not in connected:
            recv_mask.setdefault(p, set()).add(channel)
    for p in send_peers:
        if p != -1 and p < nranks and p != me and (channel, p, True) not in connected:
            send_mask.setdefault(p, set()).add(channel)


def rank_connections(t: RankTopo, me: int, rings: list[list[int]], trees: list[dict],
                     net_name: str = "IB") -> tuple[list[Conn], list[Conn]]:
    """``ncclTransportRingConnect`` then ``ncclTransportTreeConnect`` for rank ``me``: its connections in the
    order it sets them up.  ``rings[c]`` is channel c's ring order, ``trees[c]`` its ``{rank: TreeNode}``."""
    nranks = len(rings[0])
    if nranks == 1:
        return [], []
    assert len(rings) <= MAXCHANNELS
    connected: set = set()
    recv_mask: dict = {}
    send_mask: dict = {}
    for c, order in enumerate(rings):
        i = order.index(me)
        _connect(me, nranks, c, [order[i - 1]], [order[(i + 1) % nranks]], recv_mask, send_mask, connected)
    ring = p2p_setup(t, t.ring, me, nranks, recv_mask, send_mask, net_name)
    connected |= {(x.channel, x.peer, x.send) for x in ring}
    recv_mask, send_mask = {}, {}
    for c, tree in enumerate(trees):
        node = tree[me]
        _connect(me, nranks, c, list(node.down), [node.up], recv_mask, send_mask, connected)
        _connect(me, nranks, c, [node.up], list(node.down), recv_mask, send_mask, connected)
    tree = p2p_setup(t, t.tree, me, nranks, recv_mask, send_mask, net_name)
    return ring, tree


def connect_lines(topos: list[RankTopo], rings_of: list, trees_of: list, net_name: str = "IB") -> list[list[str]]:
    """Every rank's connection lines: its ring connections, ``Connected all rings, use ring PXN p GDR g`` (PXN if
    any rank's ring send goes through a proxy, GDR if every rank's ring NET connections use it: the all-gather
    that NCCL_LOCAL_REGISTER / NCCL_GRAPH_REGISTER, both 1 by default, ask for), its tree connections and
    ``Connected all trees``.  ``rings_of[r]`` / ``trees_of[r]`` are rank r's channels' rings and trees."""
    nranks = len(topos)
    conns = [rank_connections(topos[r], r, rings_of[r], trees_of[r], net_name) for r in range(nranks)]
    if nranks == 1:
        return [[] for _ in range(nranks)]
    pxn = [any(x.transport == "NET" and x.send and x.proxy != r for x in conns[r][0]) for r in range(nranks)]
    gdr = [all(x.gdr != GDR_DISABLED for x in conns[r][0] if x.transport == "NET") for r in range(nranks)]
    if env_int("NCCL_LOCAL_REGISTER", 1) or env_int("NCCL_GRAPH_REGISTER", 1):
        pxn, gdr = [any(pxn)] * nranks, [all(gdr)] * nranks
    out = []
    for r in range(nranks):
        ring, tree = conns[r]
        lines = [x.line for x in ring if x.line]
        lines.append(f"Connected all rings, use ring PXN {int(pxn[r])} GDR {int(gdr[r])}")
        lines += [x.line for x in tree if x.line]
        lines.append("Connected all trees")
        out.append(lines)
    return out


def nvml_devs(systems: list[System]) -> list[int]:
    """Every rank's nvmlDev from its own node's system (``ncclPeerInfo.nvmlDev``); ``systems[r]`` is rank r's."""
    return [s.nodes[GPU][s.gpu_by_rank(r)].dev for r, s in enumerate(systems)]
