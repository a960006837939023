"""(e) ``machine``: the node as NCCL's topology sees it, with the searched rings drawn over it.

CPUs (sockets / NUMA domains) as dashed clusters, PCIe switches, GPUs (NCCL's GPU and its DEV function drawn as
one box), NICs with their network port, and the NVSwitch; every link labelled with its type and bandwidth in GB/s
as ``ncclTopoPrint`` shows it (NVLink bandwidth = links x per-link GB/s).  Over the links, the ring graph's
distinct rings are drawn faintly and one channel's ring boldly, each hop labelled with the bandwidth the search
gave that channel.  Input: ``collectives.graph.init_topo.run_topology``'s result.
"""
from __future__ import annotations

import graphviz

from collectives.graph.init_topo import TopoResult
from collectives.graph.topo import CPU, DEV, GPU, LINK_LOC, LINK_PCI, LINK_TYPES, NET, NIC, NVS, PCI

from .diagrams import _color

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
