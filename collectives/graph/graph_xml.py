"""Graphs as XML (NCCL ``src/graph/search.cc``: ``ncclTopoGetGraphFromXml``, ``ncclTopoGetChannelFromXml``,
``ncclTopoGetXmlFromGraphs``, ``ncclTopoDumpGraphs``, the ``NCCL_GRAPH_FILE`` branch of ``ncclTopoCompute``;
``src/graph/xml.cc``: ``ncclTopoGetXmlGraphFromFile``).

``NCCL_GRAPH_FILE`` replaces the search of every graph whose ``id`` it holds (0 ring, 1 tree, 2 CollNet chain,
3 NVLS, 4 CollNet direct), unless ``NCCL_CROSS_NIC=0`` and the graph says ``crossnic="1"``.  A channel's ``<gpu>``
names its rank by ``rank=`` when present, else by ``dev=`` (hexadecimal, as NCCL reads it) among this node's
devices; ``<net dev=>`` are the channel's NET ends.  ``NCCL_GRAPH_DUMP_FILE`` is written by rank
``NCCL_GRAPH_DUMP_FILE_RANK`` (0) in the layout NCCL writes (ints ``%d``, devs ``%#x``, floats ``%g``), with
NCCL's five graphs (the CollNet and NVLS ones never searched here, so with no channels).  Our own checks, which
NCCL lacks: a ``rank=`` that is not one of this node's ranks, a channel without every rank of the node once, or a
ring or tree graph of another pattern, is refused.
"""
from __future__ import annotations

from collectives.misc.param import env_int, env_str
from tracing import debug

from .search import BALANCED_TREE, COLLNET_DIRECT, NVLS, RING, SPLIT_TREE, TREE, Graph, topo_compute
from .topo import GPU, PATH_LOC, PATH_TYPES, System
from .topo_xml import TopoError, XmlNode, load_xml

GRAPH_XML_VERSION = 1     # NCCL_GRAPH_XML_VERSION
LINK_TYPES = ("LOC", "NVL", "NVB", "PIX", "PXB", "P2C", "PXN", "PHB", "SYS")   # kvDictLinkType
PATTERNS_OF = {0: (RING,), 1: (BALANCED_TREE, SPLIT_TREE, TREE)}   # ours: NCCL takes any number


def _attr(node: XmlNode, key: str, where: str) -> str:
    if key not in node.attrs:
        raise TopoError(f"NCCL_GRAPH_FILE: {where} has no '{key}' attribute")
    return node.attrs[key]


def _int(node: XmlNode, key: str, where: str, base: int = 0) -> int:
    text = _attr(node, key, where)
    try:
        return int(text, base)
    except ValueError:
        raise TopoError(f"NCCL_GRAPH_FILE: {where} {key}={text!r} is not an integer") from None


def _float(node: XmlNode, key: str, where: str) -> float:
    text = _attr(node, key, where)
    try:
        return float(text)
    except ValueError:
        raise TopoError(f"NCCL_GRAPH_FILE: {where} {key}={text!r} is not a number") from None


def _link(node: XmlNode, key: str, where: str) -> int:
    text = _attr(node, key, where)
    if text not in LINK_TYPES:
        raise TopoError(f"NCCL_GRAPH_FILE: {where} {key}={text!r}: one of {', '.join(LINK_TYPES)}")
    return PATH_TYPES.index(text)


def load_graphs(path: str) -> XmlNode:
    """``ncclTopoGetXmlGraphFromFile``: the ``<graphs version="1">`` root, every graph with its channels."""
    root = load_xml(path, root="graphs")
    version = _int(root, "version", "<graphs>")
    if version != GRAPH_XML_VERSION:
        raise TopoError(f"NCCL_GRAPH_FILE {path}: XML Graph has wrong version {version}, {GRAPH_XML_VERSION} needed")
    return root


def graph_from_xml(root: XmlNode, graph: Graph, dev_rank: dict[int, int], node_ranks: list[int]) -> int:
    """``ncclTopoGetGraphFromXml``: fill ``graph`` from the graph of the same id; the channels loaded (0: none).
    ``dev_rank`` maps this node's devices to their ranks."""
    loaded = 0
    for xg in root.subs:
        if xg.name != "graph" or _int(xg, "id", "<graph>") != graph.id:
            continue
        where = f"<graph id={graph.id}>"
        cross_nic = _int(xg, "crossnic", where)
        if env_int("NCCL_CROSS_NIC", 2) == 0 and cross_nic == 1:
            continue
        graph.cross_nic = cross_nic
        graph.pattern = _int(xg, "pattern", where)
        if graph.id in PATTERNS_OF and graph.pattern not in PATTERNS_OF[graph.id]:
            raise TopoError(f"NCCL_GRAPH_FILE: {where} pattern={graph.pattern}: a graph of id {graph.id} has "
                            f"pattern {' or '.join(map(str, PATTERNS_OF[graph.id]))}")
        graph.n_channels = _int(xg, "nchannels", where)
        graph.bw_intra, graph.bw_inter = _float(xg, "speedintra", where), _float(xg, "speedinter", where)
        graph.latency_inter = float(xg.attrs.get("latencyinter", "0") or 0)
        graph.type_intra, graph.type_inter = _link(xg, "typeintra", where), _link(xg, "typeinter", where)
        graph.same_channels = _int(xg, "samechannels", where)
        channels = [s for s in xg.subs if s.name == "channel"]
        if len(channels) != graph.n_channels or graph.n_channels > len(graph.intra):
            raise TopoError(f"NCCL_GRAPH_FILE: {where} says nchannels={graph.n_channels} and holds "
                            f"{len(channels)} channels")
        for c, xc in enumerate(channels):
            graph.intra[c], graph.inter[c] = _channel(xc, f"{where} channel {c}", dev_rank, node_ranks)
        loaded = len(channels)
    return loaded


def from_file(graph: Graph, dev_rank: dict[int, int], node_ranks: list[int]) -> int:
    """``ncclTopoCompute``'s NCCL_GRAPH_FILE branch: the channels loaded into ``graph`` (0: search it)."""
    path = env_str("NCCL_GRAPH_FILE")
    if not path:
        return 0
    debug.info("ENV", f"NCCL_GRAPH_FILE set by environment to {path}")
    n = graph_from_xml(load_graphs(path), graph, dev_rank, node_ranks)
    debug.info("GRAPH", f"Search {graph.id} : {n} channels loaded from XML graph")
    return n


def compute(system: System, graph: Graph, trace: list | None = None) -> Graph:
    """``ncclTopoCompute``: the graph file's graph when it holds one, else the search."""
    gpus = system.nodes[GPU]
    if from_file(graph, {g.dev: g.rank for g in gpus}, sorted(g.rank for g in gpus)) and graph.n_channels > 0:
        return graph
    return topo_compute(system, graph, trace)


def _channel(xc: XmlNode, where: str, dev_rank: dict[int, int], node_ranks: list[int]) -> tuple[list, list]:
    """``ncclTopoGetChannelFromXml``: the channel's ranks in order and its NET ends."""
    ranks, nets = [], []
    for sub in xc.subs:
        if sub.name == "net":
            nets.append(_int(sub, "dev", where, 16))
        elif sub.name == "gpu":
            if "rank" in sub.attrs:
                rank = _int(sub, "rank", where)
            else:
                dev = _int(sub, "dev", where, 16)
                if dev not in dev_rank:
                    raise TopoError(f"NCCL_GRAPH_FILE: {where}: XML Import Channel : dev {dev} not found")
                rank = dev_rank[dev]
            if rank not in node_ranks:
                raise TopoError(f"NCCL_GRAPH_FILE: {where} names rank {rank}, not a rank of this node "
                                f"({node_ranks}); leave rank= out to name GPUs by dev=")
            ranks.append(rank)
    if sorted(ranks) != sorted(node_ranks):
        raise TopoError(f"NCCL_GRAPH_FILE: {where} holds ranks {ranks}; every rank of this node ({node_ranks}) once")
    return ranks, (nets + [-1, -1])[:2]


def _hex(value: int) -> str:
    """``%#lx``: 0 stays ``0``, others get ``0x``."""
    return f"{value:#x}" if value else "0"


def graphs_xml(graphs: list[Graph], rank_dev: dict[int, int], inter: bool) -> str:
    """``ncclTopoGetXmlFromGraphs`` + ``ncclTopoDumpXmlToFile``: the ``<graphs>`` text; ``inter``:
    ``system->inter`` (the channels have NET ends)."""
    out = [f'<graphs version="{GRAPH_XML_VERSION}">']
    for g in graphs:
        out.append(f'  <graph id="{g.id}" pattern="{g.pattern}" crossnic="{g.cross_nic}" nchannels="{g.n_channels}" '
                   f'speedintra="{g.bw_intra:g}" speedinter="{g.bw_inter:g}" latencyinter="{g.latency_inter:g}" '
                   f'typeintra="{PATH_TYPES[g.type_intra]}" typeinter="{PATH_TYPES[g.type_inter]}" '
                   f'samechannels="{g.same_channels}"' + (">" if g.n_channels else "/>"))
        if not g.n_channels:
            continue
        for c in range(g.n_channels):
            out.append("    <channel>")
            if inter:
                out.append(f'      <net dev="{_hex(g.inter[c][0])}"/>')
            out += [f'      <gpu dev="{_hex(rank_dev[r])}" rank="{r}"/>' for r in g.intra[c]]
            if inter:
                out.append(f'      <net dev="{_hex(g.inter[c][1])}"/>')
            out.append("    </channel>")
        out.append("  </graph>")
    return "\n".join(out + ["</graphs>", ""])


def unsearched(gid: int, pattern: int) -> Graph:
    """A graph left as ``initTransportsRank``'s memset leaves it when it is not searched (CollNet, NVLS here)."""
    return Graph(id=gid, pattern=pattern, type_intra=PATH_LOC, type_inter=PATH_LOC)


def dump_graphs(rank: int, ring: Graph, tree: Graph, rank_dev: dict[int, int], inter: bool) -> str | None:
    """``ncclTopoDumpGraphs`` on rank ``NCCL_GRAPH_DUMP_FILE_RANK``: write ``NCCL_GRAPH_DUMP_FILE`` with NCCL's five
    graphs (ring, tree, CollNet direct, CollNet chain, NVLS; the last three never searched here); its path."""
    path = env_str("NCCL_GRAPH_DUMP_FILE")
    if not path or rank != env_int("NCCL_GRAPH_DUMP_FILE_RANK", 0):
        return None
    debug.info("ENV", f"NCCL_GRAPH_DUMP_FILE set by environment to {path}")
    graphs = [ring, tree, unsearched(4, COLLNET_DIRECT), unsearched(2, TREE), unsearched(3, NVLS)]
    try:
        with open(path, "w") as f:
            f.write(graphs_xml(graphs, rank_dev, inter))
    except OSError as e:
        raise TopoError(f"NCCL_GRAPH_DUMP_FILE {path}: {e.strerror}") from None
    return path
