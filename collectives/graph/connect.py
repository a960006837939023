"""From searched graphs to channels (NCCL ``src/graph/connect.cc``: ``ncclTopoPreset``,
``ncclTopoPostset``, ``connectRings``, ``connectTrees``, ``copyChannels``, ``exchangeValues``; ``rings.cc``:
``ncclBuildRings``;
the log lines of ``initTransportsRank`` in ``src/init.cc``).

Channel c < n (n = min(ring, tree) search channels) takes ring graph channel c and tree graph channel c with tree
0; Postset doubles to 2n, channel c + n repeating ring c with tree 1.  Across nodes, connectRings joins node k's
last ring rank to node k+1's first.  ``NCCL_MAX_NCHANNELS`` then clamps and
``NCCL_MIN_NCHANNELS`` copies channels (``copyChannels``).  The Hopper and unpack doublings apply to several nodes
only.  ``NCCL_MAX_CTAS`` / ``NCCL_MIN_CTAS`` (``comm->config.maxCTAs/minCTAs``) bound the same way.  Trees come from
``trees.connect_trees`` with the tree graph's chains and pattern.  Differences on purpose: no CollNet, NVLS or
unpack-net (NCCL_NET_DEVICE_UNPACK) channels; no parent communicator.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

from collectives.include.device import MAXCHANNELS
from collectives.misc.param import env_int, log_once

from .rings import ring_log_line
from .search import BALANCED_TREE, PATTERN_NAMES, SPLIT_TREE, TREE, Graph
from .trees import connect_trees, trees_log_line


def min_nchannels() -> int:
    """``ncclMinNchannels`` (``src/graph/connect.cc``): NCCL_MIN_NCHANNELS, else NCCL_MIN_NRINGS, else 0; above
    MAXCHANNELS limited with NCCL's INFO line, below 0 taken as 0."""
    value = env_int("NCCL_MIN_NCHANNELS", env_int("NCCL_MIN_NRINGS", 0))
    if value > MAXCHANNELS:
        log_once("GRAPH|ENV", f"User asked for a minimum of {value} channels, limiting to {MAXCHANNELS}")
        value = MAXCHANNELS
    return max(0, value)


def max_nchannels() -> int:
    """``ncclMaxNchannels``: NCCL_MAX_NCHANNELS, else NCCL_MAX_NRINGS, else MAXCHANNELS; at most MAXCHANNELS, and
    below 1 (``NCCL_MAX_NCHANNELS=0``) set to 1 with NCCL's INFO line."""
    value = min(env_int("NCCL_MAX_NCHANNELS", env_int("NCCL_MAX_NRINGS", MAXCHANNELS)), MAXCHANNELS)
    if value < 1:
        log_once("GRAPH|ENV", f"User asked for a maximum of {value} channels, setting it to 1")
        value = 1
    return value


@dataclass
class Channels:
    """What one rank's communicator ends up with: per channel its ring order over all ranks and the tree graph's
    chain (every node's chain, node after node); ``node_of[r]`` is rank r's node (None: one node)."""
    rings: list          # per channel: ranks in ring order, from node 0's first ring rank, following ring.next
    chains: list         # per channel: the tree graph's chains of every node, concatenated node after node
    tree_of: list        # per channel: 0 or 1 (which of the double binary trees)
    search_channels: int
    tree_pattern: str
    search_chains: list = None   # the first n chains, before Postset (connectTrees prints these)
    node_of: list = None         # rank -> node (comm->rankToNode); None on one node
    tree_patterns: list = None   # per node, its tree pattern name (nodesTreePatterns); None: tree_pattern
    ring_of: list = None         # per channel: the search channel it repeats (Postset doubling and copies)

    @property
    def n(self) -> int:
        return len(self.rings)

    def node_chains(self, chain: list[int]) -> list[list[int]]:
        """Split a concatenated chain into each node's chain."""
        if self.node_of is None:
            return [list(chain)]
        nnodes = max(self.node_of) + 1
        return [[r for r in chain if self.node_of[r] == node] for node in range(nnodes)]

    def patterns(self) -> str | list[str]:
        return self.tree_patterns or self.tree_pattern

    def trees(self) -> list[dict]:
        """Every channel's tree ``{rank: TreeNode}``: tree 0 or 1 of that channel's chains."""
        return channel_trees(self)


@dataclass
class TopoRanks:
    """``struct ncclTopoRanks``: what ``ncclTopoPreset`` gives the all-gather for one rank, per search channel."""
    ring_recv: list
    ring_send: list
    ring_prev: list
    ring_next: list
    tree_to_parent: list
    tree_to_child0: list
    tree_to_child1: list
    cross_nic_ring: int


def preset(ring: Graph, tree: Graph, rank: int, n: int) -> TopoRanks:
    """``ncclTopoPreset``: this rank's ring neighbours inside its node (-1 at the node's ends), its node's first
    and last ring ranks, and the ranks its node's tree attaches through (by the tree pattern's child indices)."""
    child0 = 0 if tree.pattern == TREE else 1
    child1 = 1 if tree.pattern == SPLIT_TREE else 0
    t = TopoRanks(*([-1] * n for _ in range(7)), cross_nic_ring=ring.cross_nic)
    for c in range(n):
        order = ring.intra[c]
        if rank in order:
            i = order.index(rank)
            t.ring_recv[c], t.ring_send[c] = order[0], order[-1]
            t.ring_prev[c] = order[i - 1] if i > 0 else -1
            t.ring_next[c] = order[i + 1] if i < len(order) - 1 else -1
        chain = tree.intra[c]
        if rank in chain:
            # a one-rank node always searches TREE (ncclTopoCompute), so its indices stay 0; min() only guards
            t.tree_to_parent[c] = chain[0]
            t.tree_to_child0[c] = chain[min(child0, len(chain) - 1)]
            t.tree_to_child1[c] = chain[min(child1, len(chain) - 1)]
    return t


def connect_rings(n: int, recv: list, send: list, prev: list, nxt: list) -> None:
    """``connectRings``: node k's first ring rank receives from node k-1's last, which sends to it."""
    nnodes = len(recv[0]) if n else 0
    for c in range(n):
        for k in range(nnodes):
            prev[c][recv[c][k]] = send[c][(k - 1) % nnodes]
            nxt[c][send[c][k]] = recv[c][(k + 1) % nnodes]


def postset_rank(rank: int, n: int, all_ranks: list[TopoRanks], first_ranks: list[int], node_of: list[int],
                 tree_chains: list[list[int]], tree_patterns: list[str], min_cc: int = 0,
                 ring_bw_intra: float = 0.0) -> Channels:
    """``ncclTopoPostset`` as ``rank`` runs it on its own copy of the all-gathered ``all_ranks``: the crossNic-2
    swap of odd nodes' channel pairs (in place, on this copy), connectRings, the trees, Postset's doubling, the
    Hopper doubling across nodes, NCCL_MAX/MIN_NCHANNELS and CTAs.  ``tree_chains[c]`` is channel c's tree chains
    of every node, concatenated; ``n`` the aligned search channels.  The trees come from those chains through
    ``trees.connect_trees``: its attachment ranks are Preset's treeToParent/Child0/Child1, which the swap leaves
    alone."""
    mine = copy.deepcopy(all_ranks)
    nranks, nnodes = len(mine), len(first_ranks)
    if not 0 <= rank < nranks:
        raise ValueError(f"rank {rank} outside the {nranks} ranks gathered")
    for r, t in enumerate(mine):
        if t.cross_nic_ring == 2 and n % 2 == 0 and node_of[r] % 2 == 1:
            for c in range(0, n, 2):
                for arr in (t.ring_recv, t.ring_send, t.ring_prev, t.ring_next):
                    arr[c], arr[c ^ 1] = arr[c ^ 1], arr[c]
    recv = [[mine[first_ranks[k]].ring_recv[c] for k in range(nnodes)] for c in range(n)]
    send = [[mine[first_ranks[k]].ring_send[c] for k in range(nnodes)] for c in range(n)]
    prev = [[mine[r].ring_prev[c] for r in range(nranks)] for c in range(n)]
    nxt = [[mine[r].ring_next[c] for r in range(nranks)] for c in range(n)]
    connect_rings(n, recv, send, prev, nxt)
    rings = []
    for c in range(n):      # ncclBuildRings: follow ring.next from node 0's first ring rank
        order, r = [], recv[c][0]
        while len(order) < nranks:
            order.append(r)
            r = nxt[c][r]
        if r != order[0] or sorted(order) != list(range(nranks)):
            raise ValueError(f"channel {c}: the rings do not close over all {nranks} ranks")
        rings.append(order)
    return postset_channels(rings, [list(tree_chains[c]) for c in range(n)], node_of, tree_patterns, min_cc,
                            ring_bw_intra)


def postset_channels(rings: list[list[int]], chains: list[list[int]], node_of: list[int], tree_patterns: list[str],
                     min_cc: int = 0, ring_bw_intra: float = 0.0) -> Channels:
    """The rest of ``ncclTopoPostset`` once the n search channels' rings (over all ranks) are built: the doubling
    (channel c + n: ring c with tree 1), the Hopper doubling across nodes, NCCL_MAX/MIN_NCHANNELS and CTAs
    (``copyChannels``).  ``chains[c]``: channel c's tree chains of every node, concatenated."""
    n, nnodes = len(rings), max(node_of) + 1
    search_chains = [list(chain) for chain in chains]
    rings, chains, tree_of = rings + rings, search_chains + search_chains, [0] * n + [1] * n
    ring_of = list(range(n)) * 2
    total = min(MAXCHANNELS, 2 * n)
    rings, chains, tree_of, ring_of = rings[:total], chains[:total], tree_of[:total], ring_of[:total]
    if min_cc >= 90 and nnodes > 1 and ring_bw_intra > 45.0 and total < 16:
        # 4 compute channels per search channel on Hopper across nodes: copyChannels(total, 2 * total)
        end = min(2 * total, MAXCHANNELS)
        rings, chains, tree_of, ring_of = (x + x[:end - total] for x in (rings, chains, tree_of, ring_of))
        total = end
    max_ch, min_ch = max_nchannels(), min_nchannels()
    max_ctas = env_int("NCCL_MAX_CTAS", MAXCHANNELS)          # comm->config.maxCTAs / minCTAs
    min_ctas = env_int("NCCL_MIN_CTAS", 1)
    max_ctas = min(max_ctas if max_ctas > 0 else MAXCHANNELS, MAXCHANNELS)
    min_ctas = min(min_ctas if min_ctas > 0 else 1, MAXCHANNELS, max_ctas)
    min_ch = max(min_ch, min_ctas)
    total = min(max_ch, total, max_ctas)
    rings, chains, tree_of, ring_of = rings[:total], chains[:total], tree_of[:total], ring_of[:total]
    start = total
    for c in range(start, max(min_ch, start)):   # copyChannels(start, end)
        rings.append(rings[c - start])
        chains.append(chains[c - start])
        tree_of.append(tree_of[c - start])
        ring_of.append(ring_of[c - start])
    top = max(tree_patterns, key=lambda name: PATTERN_ORDER[name])
    return Channels(rings, chains, tree_of, n, top, search_chains,
                    None if nnodes == 1 else list(node_of), None if nnodes == 1 else list(tree_patterns), ring_of)


PATTERN_ORDER = {"BALANCED_TREE": 1, "SPLIT_TREE": 2, "TREE": 3}


def tree_pattern_name(graph: Graph) -> str:
    return PATTERN_NAMES[graph.pattern if graph.pattern in (BALANCED_TREE, SPLIT_TREE, TREE) else TREE]


def postset(ring: Graph, tree: Graph) -> Channels:
    """``ncclTopoPreset`` + ``ncclTopoPostset`` for one node: double, clamp, copy."""
    n = min(ring.n_channels, tree.n_channels)
    ranks = sorted(ring.intra[0])
    all_ranks = [preset(ring, tree, r, n) for r in ranks]
    return postset_rank(0, n, all_ranks, [ring.intra[0][0]] if n else [0], [0] * len(ranks),
                        [tree.intra[c] for c in range(n)], [tree_pattern_name(tree)])


def channel_trees(ch: Channels) -> list[dict]:
    """Every channel's tree (``{rank: TreeNode}``): tree 0 or 1 of that channel's chains."""
    return [connect_trees(ch.node_chains(chain), ch.patterns())[t] for chain, t in zip(ch.chains, ch.tree_of)]


def _attach_ranks(chain: list[int], pattern: str) -> set:
    child0, child1 = {"BALANCED_TREE": (1, 0), "SPLIT_TREE": (1, 1)}.get(pattern, (0, 0))
    if len(chain) == 1:
        child0 = child1 = 0
    return {chain[0], chain[child0], chain[child1]}


def tree_lines(ch: Channels, rank: int) -> list[str]:
    """``connectTrees``' ``Tree c : up -> rank -> down`` lines, printed by the ranks a node attaches through."""
    out = []
    n = ch.search_channels
    node = ch.node_of[rank] if ch.node_of else 0
    pats = ch.patterns()
    for c in range(n):
        chains = ch.node_chains(ch.search_chains[c])
        if rank in _attach_ranks(chains[node], pats if isinstance(pats, str) else pats[node]):
            pair = connect_trees(chains, pats)   # channel c: tree 0; its Postset copy c + n: tree 1
            for cc, tree in ((c, pair[0]), (c + n, pair[1])):
                t = tree[rank]
                d = list(t.down) + [-1] * (3 - len(t.down))
                out.append(f"Tree {cc} : {t.up} -> {rank} -> {d[0]}/{d[1]}/{d[2]}")
    return out


def rank_lines(ch: Channels, rank: int) -> list[str]:
    """One rank's ``Ring %02d`` lines and its ``Trees`` line (``initTransportsRank`` after Postset)."""
    out = []
    for c, order in enumerate(ch.rings):
        i = order.index(rank)
        out.append(f"Ring {c:02d} : {order[i - 1]} -> {rank} -> {order[(i + 1) % len(order)]}")
    out.append(trees_log_line(rank, channel_trees(ch)))
    return out


def channel_lines(ch: Channels) -> list[str]:
    """Rank 0's ``Channel NN/MM :`` lines (``ncclBuildRings``)."""
    return [ring_log_line(c, ch.n, order) for c, order in enumerate(ch.rings)]
