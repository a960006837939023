"""One rank's topology job in ``initTransportsRank`` (NCCL ``src/init.cc``), as every communicator runs it:

    ncclTopoGetSystem: NCCL_TOPO_FILE (or the runners' --topo, which sets it), this node's ranks fused
    ncclTopoCompute ring, then tree (NCCL_GRAPH_FILE replaces the search: graph_xml.compute)
    ncclTopoDumpGraphs on rank NCCL_GRAPH_DUMP_FILE_RANK (NCCL_GRAPH_DUMP_FILE)
    ncclTopoPreset (its topoRanks)                       -> connect.preset
    AllGather3 through the bootstrap: graph info, topoRanks, compute capability
                                                          -> init_cluster.gather_info (min/max alignment)
    ncclTopoPostset on this rank's own copy               -> connect.postset_rank

Without a topology file the node is the CPU lab's: its ranks are the node's devices, in rank order (PCI order,
which is what NCCL's ring search tries first), and across nodes the net plugin's device 0 sits at both ends of
every channel (the loopback socket plugin has one device).  Where we differ on purpose: for that node the graphs
are written down as the search finds them on such a system (one channel, or ``search_channels``, of 6 GB/s over
PHB: ``presets.cpu_lab``'s figures) instead of searched, since the CPU lab has no GPU for the search to weigh.
Explicit rings (``Communicator(rings=...)``) skip the search: each channel repeats one of them, the tree chains
follow it, and Postset doubles them.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Callable

from collectives.include.device import MAXCHANNELS
from collectives.misc.param import env_int, env_str
from collectives.misc.sockets import BootstrapError
from tracing import debug

from . import graph_xml
from .connect import Channels, TopoRanks, postset_channels, preset
from .init_cluster import gather_info
from .init_topo import search_node
from .nets import net_dev, nic_names
from .search import BALANCED_TREE, RING, Graph
from .topo import GPU, PATH_PHB, System
from .topo_xml import StandIns, TopoError

CPU_BW = 6.0   # GB/s per channel the CPU lab's node offers (presets.cpu_lab)


@dataclass
class RankTopology:
    channels: Channels     # this rank's, after its own Postset
    ring: Graph            # the graphs after AllGather3's alignment (None with explicit rings)
    tree: Graph
    nics: list = field(default_factory=list)   # the node's net devices by name (empty: the CPU lab's node)
    # (graph id: 0 ring, 1 tree; channel) -> the net device ncclTopoGetNetDev gives that channel; None: device 0
    net_dev: Callable[[int, int], int] | None = None

    @property
    def search_channels(self) -> int:
        return self.channels.search_channels


def stand_ins() -> StandIns:
    """What the runners' --sm / --nvlinks give every rank (ours: NCCL asks NVML): NCCLLAB_TOPO_SM,
    NCCLLAB_TOPO_NVLINKS; NCCLLAB_TOPO_NICS=0 reports no net devices."""
    sm, nvlinks = env_int("NCCLLAB_TOPO_SM", -1), env_int("NCCLLAB_TOPO_NVLINKS", -1)
    return StandIns(sm=sm if sm >= 0 else None, nvlinks=nvlinks if nvlinks >= 0 else None,
                    nics=env_int("NCCLLAB_TOPO_NICS", 1) != 0)


def cpu_lab_graphs(node_ranks: list[int], n: int, inter: bool) -> tuple[Graph, Graph]:
    """The ring and tree graphs of the CPU lab's node (see the module docstring)."""
    graphs = []
    for gid, pattern in ((0, RING), (1, BALANCED_TREE)):
        g = Graph(id=gid, pattern=pattern, min_channels=n, max_channels=n, n_channels=n, bw_intra=CPU_BW,
                  bw_inter=CPU_BW, type_intra=PATH_PHB, type_inter=PATH_PHB, same_channels=1)
        for c in range(n):
            g.intra[c], g.inter[c] = list(node_ranks), [0, 0] if inter else [-1, -1]
        graphs.append(g)
    return graphs[0], graphs[1]


def node_graphs(rank: int, nranks: int, node_ranks: list[int], nnodes: int, search_channels: int
                ) -> tuple[Graph, Graph, int, dict, System | None]:
    """This node's ring and tree graphs, its lowest compute capability, its device -> rank map and its system:
    searched on NCCL_TOPO_FILE, else the CPU lab's (each replaced by NCCL_GRAPH_FILE's graph of the same id; no
    system)."""
    path = env_str("NCCL_TOPO_FILE")
    if path:
        debug.info("ENV", f"NCCL_TOPO_FILE set by environment to {path}")
        if node_ranks != list(range(node_ranks[0], node_ranks[0] + len(node_ranks))):
            raise TopoError(f"NCCL_TOPO_FILE: this node's ranks {node_ranks} are not consecutive; the lab numbers "
                            f"a topology's GPUs node-major (rank = node * GPUs + GPU)")
        r = search_node(path, len(node_ranks), stand_ins(), first_rank=node_ranks[0], comm_nranks=nranks,
                        compute=graph_xml.compute)
        for line in r.load_lines + r.graph_lines:
            debug.info("GRAPH", line)
        gpus = r.system.nodes[GPU]
        return r.ring, r.tree, min(g.sm for g in gpus), {g.rank: g.dev for g in gpus}, r.system
    ring, tree = cpu_lab_graphs(node_ranks, search_channels, nnodes > 1)
    dev_rank = dict(enumerate(node_ranks))
    for g in (ring, tree):
        graph_xml.from_file(g, dev_rank, node_ranks)
    return ring, tree, 0, {r: d for d, r in dev_rank.items()}, None


def _graph_info(g: Graph, intra: bool) -> dict:
    info = {k: getattr(g, k) for k in ("id", "pattern", "n_channels", "same_channels", "bw_intra", "bw_inter",
                                       "latency_inter", "type_intra", "type_inter", "cross_nic")}
    if intra:
        info["intra"] = [list(g.intra[c]) for c in range(g.n_channels)]
    return info


def _graph(info: dict) -> Graph:
    g = Graph(id=int(info["id"]), pattern=int(info["pattern"]))
    for k in ("n_channels", "same_channels", "type_intra", "type_inter", "cross_nic"):
        setattr(g, k, int(info[k]))
    for k in ("bw_intra", "bw_inter", "latency_inter"):
        setattr(g, k, float(info[k]))
    for c, chain in enumerate(info.get("intra", [])[:MAXCHANNELS]):
        g.intra[c] = [int(r) for r in chain]
    return g


def all_gather3(bootstrap, rank: int, nranks: int, ring: Graph, tree: Graph, mine: TopoRanks, sm: int
                ) -> tuple[list[Graph], list[Graph], list[TopoRanks], list[int]]:
    """AllGather3's exchange: every rank's graph info (the tree's chains too: the lab builds every rank's trees),
    its topoRanks and compute capability."""
    raw = encode_graph_info(ring, tree, mine, sm)
    bound = 4096 + 12 * MAXCHANNELS * (2 * nranks + 16)
    got = [decode_graph_info(blob, rank, r) for r, blob in enumerate(bootstrap.allgather(raw, bound))]
    return [g[0] for g in got], [g[1] for g in got], [g[2] for g in got], [g[3] for g in got]


def encode_graph_info(ring: Graph, tree: Graph, mine: TopoRanks, sm: int) -> bytes:
    return json.dumps({"ring": _graph_info(ring, False), "tree": _graph_info(tree, True), "topo": asdict(mine),
                       "sm": sm}).encode()


def decode_graph_info(blob: bytes, rank: int, sender: int) -> tuple[Graph, Graph, TopoRanks, int]:
    """A peer's graph info back into (ring, tree, topoRanks, compute capability); anything else: one line."""
    try:
        info = json.loads(blob)
        topo = TopoRanks(**info["topo"])
        lists = (topo.ring_recv, topo.ring_send, topo.ring_prev, topo.ring_next, topo.tree_to_parent,
                 topo.tree_to_child0, topo.tree_to_child1)
        if not all(isinstance(x, list) and len(x) <= MAXCHANNELS and all(type(v) is int for v in x)
                   for x in lists) or type(topo.cross_nic_ring) is not int:
            raise TypeError("topoRanks")
        return _graph(info["ring"]), _graph(info["tree"]), topo, int(info["sm"])
    except (ValueError, KeyError, TypeError, AttributeError, IndexError):
        raise BootstrapError(f"rank {rank}: malformed graph info from rank {sender}") from None


def explicit_channels(rings: list[list[int]], n: int, node_of: list[int]) -> Channels:
    """``Communicator(rings=...)``: channel c of the n search channels repeats ring c % len(rings); its tree
    chains are that ring's order on each node (BALANCED_TREE); then Postset."""
    orders = [list(rings[c % len(rings)]) for c in range(n)]
    return postset_channels(orders, orders, node_of, ["BALANCED_TREE"] * (max(node_of) + 1))


def init_rank(bootstrap, rank: int, nranks: int, node_of: list[int], search_channels: int,
              rings: list[list[int]] | None = None) -> RankTopology:
    """Load, search, Preset, AllGather3 and Postset for ``rank`` (``node_of``: every rank's node by host hash)."""
    if rings:
        return RankTopology(explicit_channels(rings, search_channels, node_of), None, None)
    nnodes = max(node_of) + 1
    node_ranks = [r for r in range(nranks) if node_of[r] == node_of[rank]]
    ring, tree, sm, rank_dev, system = node_graphs(rank, nranks, node_ranks, nnodes, search_channels)
    graph_xml.dump_graphs(rank, ring, tree, rank_dev, nnodes > 1)
    mine = preset(ring, tree, rank, min(ring.n_channels, tree.n_channels))
    all_rings, all_trees, topo, sms = all_gather3(bootstrap, rank, nranks, ring, tree, mine, sm)
    gathered = gather_info(topo, all_rings, all_trees, nnodes)
    if gathered.node_of != list(node_of):
        raise TopoError(f"rank {rank}: the rings' first ranks give nodes {gathered.node_of}, the hosts "
                        f"{list(node_of)}")
    if nnodes > 1 and env_str("NCCL_TOPO_FILE"):
        log_nics(rank, ring, mine, gathered.n)
    channels = gathered.postset(rank, topo, min(sms))
    if system is None or nnodes == 1:
        return RankTopology(channels, gathered.ring, gathered.tree)
    graphs, n = (ring, tree), channels.search_channels
    return RankTopology(channels, gathered.ring, gathered.tree, nic_names(system),
                        lambda graph, c: net_dev(system, graphs[graph], n, rank, c)[1])


def log_nics(rank: int, ring: Graph, mine: TopoRanks, n: int) -> None:
    """Ours (NCCL has no such line): which NICs the search put at this node's ends of each ring channel, said by
    the rank the ring enters the node at, and whether the net plugin opens them: NET/IB has a device per NIC (on
    the software provider, the topology's), the socket plugin carries them all on its one device."""
    ib = env_str("NCCL_NET").lower() == "ib"
    how = ("NET/IB opens each on its own device" if ib else
           f"the lab's net plugin (NCCL_NET={env_str('NCCL_NET') or 'auto'}) has one device, dev 0, which carries both")
    for c in range(n):
        if mine.ring_recv[c] == rank:
            debug.info("NET", f"Channel {c:02d} : the search's ring enters this node at NET/{ring.inter[c][0]} and "
                              f"leaves at NET/{ring.inter[c][1]}; {how}")
