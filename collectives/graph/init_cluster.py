"""The topology steps of ``initTransportsRank`` (NCCL ``src/init.cc``) for K identical nodes in one communicator.

    per node (its own host hash): ncclTopoGetSystem fuses only the node's ranks' XMLs; ncclTopoTrimSystem sets
    system->inter (the node has fewer GPUs than the communicator has ranks); the searches run with NETs at both
    ends of each channel                                         -> init_topo.search_node
    every rank: ncclTopoPreset (its topoRanks)                   -> connect.preset
    AllGather3: graph info min/max aligned over ranks, nNodes / firstRanks / rankToNode from ringRecv[0],
    nodesTreePatterns, nChannels = min(ring, tree)               -> align_graphs, run_cluster
    every rank: ncclTopoPostset on its own copy                  -> connect.postset_rank
    every rank: ncclTransportRingConnect, ncclTransportTreeConnect (transport, NIC and proxy of each
    connection, and the lines their setup prints)               -> transport_select, cluster_connections

Ranks are node-major (rank = node * N + local rank).  Where we differ on purpose: the search runs once per node,
not once per rank: a node's ranks fuse the same XML and search the same system (the rank only picks which GPUs
trimming keeps, and all of a node's GPUs share one domain), so every rank of a node would find the same graphs.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .connect import (Channels, TopoRanks, channel_lines, postset_rank, preset, rank_lines, tree_lines,
                      tree_pattern_name)
from .init_topo import TopoResult, search_node
from .search import Graph
from .topo import GPU, NET
from .topo_xml import StandIns, TopoError, gpu_pcis, load_xml
from .transport_select import RankTopo, connect_lines, nvml_devs


@dataclass
class ClusterResult:
    nodes: list                 # per node: its TopoResult (system and searched graphs)
    nranks: int
    local_ranks: int
    rings: list                 # per node: the ring graph as searched
    trees: list                 # per node: the tree graph as searched
    aligned: tuple              # (ring, tree) after AllGather3's min/max over every rank
    channels: list              # per rank: the Channels its own Postset built
    node_of: list = field(default_factory=list)


def align_graphs(graphs: list[Graph]) -> Graph:
    """AllGather3's alignment of one algorithm's graph over every rank: fewest channels, sameChannels and
    bandwidths; worst path types; the highest crossNic."""
    g = graphs[0].copy()
    for other in graphs[1:]:
        g.n_channels = min(g.n_channels, other.n_channels)
        g.same_channels = min(g.same_channels, other.same_channels)
        g.bw_intra = min(g.bw_intra, other.bw_intra)
        g.bw_inter = min(g.bw_inter, other.bw_inter)
        g.type_intra = max(g.type_intra, other.type_intra)
        g.type_inter = max(g.type_inter, other.type_inter)
        g.cross_nic = max(g.cross_nic, other.cross_nic)
    return g


@dataclass
class Gathered:
    """What every rank knows after AllGather3: the nodes (firstRanks, rankToNode, nodesTreePatterns), the graphs
    aligned over every rank, the channel count and every node's tree chain per channel."""
    first_ranks: list
    node_of: list
    tree_patterns: list
    ring: Graph
    tree: Graph
    n: int
    chains: list            # per channel: every node's tree chain, node after node

    def postset(self, rank: int, topo_ranks: list[TopoRanks], min_cc: int) -> Channels:
        """``ncclTopoPostset`` on ``rank``'s own copy of the gathered ``topo_ranks``."""
        return postset_rank(rank, self.n, topo_ranks, self.first_ranks, self.node_of, self.chains,
                            self.tree_patterns, min_cc, self.ring.bw_intra)


def gather_info(topo_ranks: list[TopoRanks], rings: list[Graph], trees: list[Graph],
                nodes: int | None = None) -> Gathered:
    """AllGather3's reading of every rank's Preset and graphs (``rings[r]``, ``trees[r]``: rank r's own search):
    a new node for every new ringRecv[0] in rank order, min/max alignment, nChannels = min(ring, tree)."""
    first_ranks: list[int] = []
    tree_patterns: list[str] = []
    node_of: list[int] = []
    for r, t in enumerate(topo_ranks):
        if t.ring_recv[0] not in first_ranks:
            first_ranks.append(t.ring_recv[0])
            tree_patterns.append(tree_pattern_name(trees[r]))
        node_of.append(first_ranks.index(t.ring_recv[0]))
    if nodes is not None and len(first_ranks) != nodes:
        raise TopoError(f"{len(first_ranks)} nodes found from the rings' first ranks, {nodes} expected")
    ring, tree = align_graphs(rings), align_graphs(trees)
    n = min(ring.n_channels, tree.n_channels)
    chains = [[rank for k in range(len(first_ranks)) for rank in trees[first_ranks[k]].intra[c]] for c in range(n)]
    return Gathered(first_ranks, node_of, tree_patterns, ring, tree, n, chains)


def run_cluster(path: str, nodes: int, nranks: int | None = None, stand: StandIns = StandIns()) -> ClusterResult:
    """NCCL's topology steps for ``nodes`` identical nodes of ``nranks`` GPUs each (default every GPU of the
    file)."""
    if nodes < 1:
        raise TopoError(f"--nodes {nodes}: at least one node")
    local = nranks or len(gpu_pcis(load_xml(path)))
    total = nodes * local
    results: list[TopoResult] = [search_node(path, local, stand, first_rank=k * local, comm_nranks=total)
                                 for k in range(nodes)]
    node_of = [r // local for r in range(total)]
    per_rank = [results[node_of[r]] for r in range(total)]       # each rank's own graphs (its node's search)
    # ncclTopoPreset on every rank, with comm->nChannels = min(tree, ring) before the alignment
    topo_ranks: list[TopoRanks] = []
    for r, res in enumerate(per_rank):
        n_own = min(res.ring.n_channels, res.tree.n_channels)
        topo_ranks.append(preset(res.ring, res.tree, r, n_own))
    g = gather_info(topo_ranks, [res.ring for res in per_rank], [res.tree for res in per_rank], nodes)
    min_cc = min(gpu.sm for res in results for gpu in res.system.nodes[GPU])
    channels: list[Channels] = [g.postset(r, topo_ranks, min_cc) for r in range(total)]
    ring, tree = g.ring, g.tree
    return ClusterResult(results, total, local, [res.ring for res in results], [res.tree for res in results],
                         (ring, tree), channels, node_of)


def rank_topos(r: ClusterResult) -> list[RankTopo]:
    """What each rank connects with: its node's system and graphs, the aligned channel count, peers' devices."""
    systems = [r.nodes[r.node_of[rank]].system for rank in range(r.nranks)]
    devs = nvml_devs(systems)
    return [RankTopo(systems[rank], r.rings[r.node_of[rank]], r.trees[r.node_of[rank]],
                     r.channels[rank].search_channels, r.node_of, devs) for rank in range(r.nranks)]


def cluster_connections(r: ClusterResult, net_name: str = "IB") -> list[list[str]]:
    """Every rank's ring then tree connection lines (``transport_select.connect_lines``) from its own channels."""
    return connect_lines(rank_topos(r), [ch.rings for ch in r.channels], [ch.trees() for ch in r.channels],
                         net_name)


def cluster_log(r: ClusterResult, connections: list[list[str]] | None = None) -> list[str]:
    """Every rank's INFO lines in the order NCCL prints them, each as ``node<n> [<local>] NCCL INFO ...``:
    node 0 rank 0's search, every rank's net device counts, rank 0's counts across ranks, then per rank the comm
    line, connectTrees' Tree lines, rank 0's Channel rings, the Ring lines, the Trees line and (given
    ``connections[rank]``, see ``cluster_connections``) its connection lines."""
    def head(rank: int) -> str:
        return f"node{r.node_of[rank]} [{rank % r.local_ranks}] NCCL INFO "
    out = [head(0) + line for line in r.nodes[0].log]
    counts = []
    for rank in range(r.nranks):
        nets = len(r.nodes[r.node_of[rank]].system.nodes[NET])
        counts.append(nets)
        out += [head(rank) + f"Rank {rank}: {nets} Net devices", head(rank) + f"Rank {rank}: 0 CollNet devices"]
    out += [head(0) + f"Local Net device counts across ranks: min {min(counts)} max {max(counts)}",
            head(0) + "Local CollNet device counts across ranks: min 0 max 0"]
    nnodes = max(r.node_of) + 1
    for rank in range(r.nranks):
        ch = r.channels[rank]
        out.append(head(rank) + f"comm (nil) rank {rank} nRanks {r.nranks} nNodes {nnodes} localRanks "
                   f"{r.local_ranks} localRank {rank % r.local_ranks} MNNVL 0")
        out += [head(rank) + line for line in tree_lines(ch, rank)]
        if rank == 0:
            out += [head(0) + line for line in channel_lines(ch)]
        out += [head(rank) + line for line in rank_lines(ch, rank)]
        if connections is not None:
            out += [head(rank) + line for line in connections[rank]]
    return out
