"""(e) ``machine``: the node as NCCL's topology sees it, with the searched rings drawn over it.

CPUs (sockets / NUMA domains) as dashed clusters, PCIe switches, GPUs (NCCL's GPU and its DEV function drawn as
one box), NICs with their network port, and the NVSwitch; every link labelled with its type and bandwidth in GB/s
as ``ncclTopoPrint`` shows it (NVLink bandwidth = links x per-link GB/s).  Over the links, the ring graph's
distinct rings are drawn faintly and one channel's ring boldly, each hop labelled with the bandwidth the search
gave that channel.  Input: ``collectives.graph.init_topo.run_topology``'s result.

``cluster``: K nodes of one communicator (``collectives.graph.init_cluster.run_cluster``), each with its GPUs
and NICs, and one channel's ring across them: inside a node GPU to GPU, at a node's end out through the NIC the
connection uses (``transport_select``: ``ncclTopoGetNetDev`` on the graph's inter[] ends), through the NVLink
peer first when the send goes by PXN, over the network into the next node's receiving NIC and on to its first
GPU.  Every label is the connection's own (its ``via``), and a legend says what the graph's crossNic means.
"""
from __future__ import annotations

import graphviz

from collectives.graph.init_cluster import ClusterResult, rank_topos
from collectives.graph.init_topo import TopoResult
from collectives.graph.transport_select import rank_connections
from collectives.graph.topo import CPU, DEV, GPU, LINK_LOC, LINK_PCI, LINK_TYPES, NET, NIC, NVS, PCI

from .diagrams import _color, _fill

SHAPES = {CPU: "box3d", PCI: "ellipse", NVS: "hexagon", NIC: "component", GPU: "box"}


def _key(node) -> str:
    """Diagram node name; a DEV is drawn as its GPU, a NET inside its NIC."""
    if node.type == DEV:
        node = next(lk.rem for lk in node.links if lk.rem.type == GPU)
    if node.type == NET:
        node = next(lk.rem for lk in node.links if lk.rem.type == NIC)
    return node.name().replace("/", "_").replace("-", "_")


def _label(node, r: TopoResult) -> str:
    if node.type == GPU:
        return f"GPU rank {node.rank}\n{node.name()}\nsm {node.sm}"
    if node.type == NIC:
        nets = [lk.rem for lk in node.links if lk.rem.type == NET]
        return "NIC " + node.name() + "".join(f"\nNET {n.dev}: {n.bw:g} GB/s" for n in nets)
    if node.type == CPU:
        return f"CPU {node.name()}"
    return node.name()


def _cpu_of(node, seen=None):
    """The CPU a node hangs under (PCI links towards the root), for the clusters."""
    seen = seen or set()
    if node.type == CPU:
        return node
    seen.add(id(node))
    for lk in node.links:
        if lk.type == LINK_PCI and id(lk.rem) not in seen and lk.rem.type in (PCI, CPU, DEV, NIC):
            cpu = _cpu_of(lk.rem, seen)
            if cpu is not None:
                return cpu
    return None


def machine(r: TopoResult, channel: int = 0, title: str = "") -> str:
    """DOT source of the machine with ring ``channel`` highlighted."""
    s = r.system
    rings = r.ring.channels()
    channel = channel % max(1, len(rings))
    g = graphviz.Digraph("machine", graph_attr={
        "label": title or (f"{len(s.nodes[GPU])} GPUs; ring graph {r.ring.n_channels} x {r.ring.bw_intra:g} GB/s, "
                           f"channel {channel} highlighted; {r.channels.n} channels after Postset"),
        "labelloc": "t", "compound": "true"}, node_attr={"style": "rounded"})
    drawn = [n for t in (GPU, PCI, NIC, NVS) for n in s.nodes[t]]
    for cpu in s.nodes[CPU]:
        with g.subgraph(name=f"cluster_{_key(cpu)}") as sub:
            sub.attr(label=_label(cpu, r), style="dashed")
            sub.node(_key(cpu), _label(cpu, r), shape=SHAPES[CPU])
            for n in drawn:
                anchor = n.parent if n.type == GPU else n
                if n.type != NVS and _cpu_of(anchor) is cpu:
                    sub.node(_key(n), _label(n, r), shape=SHAPES[n.type])
    for n in s.nodes[NVS]:
        g.node(_key(n), "NVSwitch " + n.name(), shape=SHAPES[NVS])
    done = set()
    for t in (CPU, PCI, DEV, NIC, NVS):
        for n in s.nodes[t]:
            for lk in n.links:
                if lk.type == LINK_LOC or lk.rem.type == NET:
                    continue
                a, b = _key(n), _key(lk.rem)
                pair = (min(a, b), max(a, b), lk.type)
                if pair in done or a == b:
                    continue
                done.add(pair)
                g.edge(a, b, label=f"{LINK_TYPES[lk.type]} {lk.bw:g}", dir="none", color="gray40",
                       fontcolor="gray30")
    gpus = s.nodes[GPU]
    distinct = []
    for ring in rings:
        if ring not in distinct:
            distinct.append(ring)
    for c, ring in [(c, ring) for c, ring in enumerate(rings) if c == channel] + \
            [(rings.index(d), d) for d in distinct if d != rings[channel]]:
        bold = c == channel
        for i, rank in enumerate(ring):
            nxt = ring[(i + 1) % len(ring)]
            if nxt == rank:
                continue
            a, b = _key(gpus[s.gpu_by_rank(rank)]), _key(gpus[s.gpu_by_rank(nxt)])
            g.edge(a, b, label=f"ring ch{c} {r.ring.bw_intra:g} GB/s" if bold else "", color=_color(c),
                   fontcolor=_color(c), penwidth="3" if bold else "1", style="solid" if bold else "dashed",
                   constraint="false")
    return g.source


CROSS_NIC = {
    0: "crossNic 0: every channel leaves a node by the NIC it came in by\\l(the same NIC port: one rail per channel)",
    1: "crossNic 1 (NCCL_CROSS_NIC=1): a channel may leave a node\\lby another NIC than the one it came in by",
    2: "crossNic 2 (NCCL_CROSS_NIC=2, the default, when the search needed it):\\la channel may leave by another NIC; "
       "an odd channel comes in\\lwhere the previous one left and leaves where it came in, and\\lPostset swaps each "
       "channel pair on odd nodes, so every\\lNIC-to-NIC link joins the same rails",
}


def _gk(rank: int) -> str:
    return f"gpu{rank}"


def _nk(node: int, dev: int) -> str:
    return f"node{node}_net{dev}"


def ring_hops(r: ClusterResult, channel: int) -> list[dict]:
    """Channel ``channel``'s ring as drawn: for every hop its sender, receiver and, across nodes, the sender's
    NIC device and proxy and the receiver's NIC device with each side's ``via`` (from the connections the ranks
    set up: ``transport_select.rank_connections``)."""
    topos = rank_topos(r)
    order = r.channels[0].rings[channel]
    hops = []
    for i, a in enumerate(order):
        b = order[(i + 1) % len(order)]
        if a == b:
            continue
        send = next(x for x in rank_connections(topos[a], a, r.channels[a].rings, r.channels[a].trees())[0]
                    if x.send and x.peer == b and x.channel == channel)
        hop = {"from": a, "to": b, "transport": send.transport, "via": send.line.rsplit(" via ", 1)[1]}
        if send.transport == "NET":
            recv = next(x for x in rank_connections(topos[b], b, r.channels[b].rings, r.channels[b].trees())[0]
                        if not x.send and x.peer == a and x.channel == channel)
            hop.update(send_dev=send.net_dev, proxy=send.proxy, recv_dev=recv.net_dev,
                       recv_via=recv.line.rsplit(" via ", 1)[1])
        hops.append(hop)
    return hops


def cluster(r: ClusterResult, channel: int = 0, title: str = "") -> str:
    """DOT source: every node's GPUs and NICs, ring ``channel`` across the nodes by its NICs and PXN hops."""
    nch = r.channels[0].n
    channel = channel % nch
    ring = r.aligned[0]
    hops = ring_hops(r, channel)
    nnodes = len(r.nodes)
    g = graphviz.Digraph("cluster", graph_attr={
        "label": title or (f"{nnodes} nodes x {r.local_ranks} GPUs: ring channel {channel} of {nch}, through the "
                           f"NICs the search chose (ring graph {ring.n_channels} x {ring.bw_intra:g} GB/s, "
                           f"crossNic {ring.cross_nic})"),
        "labelloc": "t", "nodesep": "0.25", "ranksep": "0.35"},
        node_attr={"style": "rounded,filled", "fontsize": "11"}, edge_attr={"fontsize": "10"})
    used_nets = {(r.node_of[h["from"]], h["send_dev"]) for h in hops if "send_dev" in h} | \
        {(r.node_of[h["to"]], h["recv_dev"]) for h in hops if "recv_dev" in h}
    for k, res in enumerate(r.nodes):
        s = res.system
        with g.subgraph(name=f"cluster_node{k}") as sub:
            sub.attr(label=f"node {k}", style="dashed", margin="16")
            nets = {gpu.rank: [] for gpu in s.nodes[GPU]}
            for net in s.nodes[NET]:
                on = (k, net.dev) in used_nets
                if net.local_gpu == -1 and not on:
                    continue              # a NIC no GPU of this node is close to, unused
                owner = s.nodes[GPU][net.local_gpu].rank if net.local_gpu != -1 else None
                sub.node(_nk(k, net.dev), f"NIC NET/IB/{net.dev}", shape="component",
                         fillcolor="#fff3b0" if on else "#f4f4f4", color="black" if on else "gray60",
                         fontcolor="black" if on else "gray50")
                if owner is not None:     # the NIC's own GPU (PCI): where PXN relays
                    nets[owner].append(_nk(k, net.dev))
                    sub.edge(_gk(owner), _nk(k, net.dev), dir="none", color="gray75", style="dotted")
            for gpu in s.nodes[GPU]:
                sub.node(_gk(gpu.rank), f"rank {gpu.rank}\nGPU {gpu.dev}", shape="box", fillcolor=_fill(k))
    color = _color(channel)
    for h in hops:
        a, b = h["from"], h["to"]
        if h["transport"] != "NET":
            g.edge(_gk(a), _gk(b), label=h["via"], color=color, fontcolor=color, penwidth="2")
            continue
        na, nb = r.node_of[a], r.node_of[b]
        start = _gk(a)
        if h["proxy"] != a:
            g.edge(_gk(a), _gk(h["proxy"]), xlabel=f"PXN: NVLink to rank {h['proxy']}", color=color,
                   fontcolor=color, style="dashed", penwidth="2", constraint="false")
            start = _gk(h["proxy"])
        g.edge(start, _nk(na, h["send_dev"]), label=f"send {h['via']}", color=color, fontcolor=color, penwidth="2")
        g.edge(_nk(na, h["send_dev"]), _nk(nb, h["recv_dev"]), label=f"network ch{channel}", color=color,
               fontcolor=color, penwidth="4", constraint="false")
        g.edge(_nk(nb, h["recv_dev"]), _gk(b), label=f"receive {h['recv_via']}", color=color, fontcolor=color,
               penwidth="2", constraint="false")
    legend = ("\\l".join([CROSS_NIC.get(ring.cross_nic, f"crossNic {ring.cross_nic}"),
                         "solid: a ring hop, labelled as its connection (P2P inside a node, NET across)",
                         "dashed: PXN, the send goes over NVLink to the NIC's own GPU,\\lwhose proxy drives the NIC",
                         "dotted grey: a NIC and its own GPU (one PCI switch)",
                         "grey NICs: not used by this channel"])
              + "\\l")
    g.node("legend", legend, shape="note", fillcolor="white", fontsize="10")
    return g.source
