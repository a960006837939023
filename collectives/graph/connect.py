"""From searched graphs to channels, on one node (NCCL ``src/graph/connect.cc``: ``ncclTopoPreset``,
``ncclTopoPostset``, ``connectRings``, ``connectTrees``, ``copyChannels``; ``rings.cc``: ``ncclBuildRings``;
the log lines of ``initTransportsRank`` in ``src/init.cc``).

Channel c < n (n = min(ring, tree) search channels) takes ring graph channel c and tree graph channel c with tree
0; Postset doubles to 2n, channel c + n repeating ring c with tree 1.  ``NCCL_MAX_NCHANNELS`` then clamps and
``NCCL_MIN_NCHANNELS`` copies channels (``copyChannels``).  The Hopper and unpack doublings apply to several nodes
only.  ``NCCL_MAX_CTAS`` / ``NCCL_MIN_CTAS`` (``comm->config.maxCTAs/minCTAs``) bound the same way.  Trees come from
``trees.connect_trees`` with the tree graph's chains and pattern.
"""
from __future__ import annotations

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
    """What a communicator of one node ends up with: per channel its ring order and intra-node tree chain."""
    rings: list          # per channel: ranks in ring order (as the ring graph found it)
    chains: list         # per channel: the tree graph's chain
    tree_of: list        # per channel: 0 or 1 (which of the double binary trees)
    search_channels: int
    tree_pattern: str
    search_chains: list = None   # the tree graph's first n chains, before Postset (connectTrees prints these)

    @property
    def n(self) -> int:
        return len(self.rings)


def postset(ring: Graph, tree: Graph) -> Channels:
    """``ncclTopoPreset`` + ``ncclTopoPostset`` for one node: double, clamp, copy."""
    n = min(ring.n_channels, tree.n_channels)
    rings = [list(ring.intra[c]) for c in range(n)]
    chains = [list(tree.intra[c]) for c in range(n)]
    rings, chains, tree_of = rings + rings, chains + chains, [0] * n + [1] * n
    total = min(MAXCHANNELS, 2 * n)
    rings, chains, tree_of = rings[:total], chains[:total], tree_of[:total]
    max_ch, min_ch = max_nchannels(), min_nchannels()
    max_ctas = env_int("NCCL_MAX_CTAS", MAXCHANNELS)          # comm->config.maxCTAs / minCTAs
    min_ctas = env_int("NCCL_MIN_CTAS", 1)
    max_ctas = min(max_ctas if max_ctas > 0 else MAXCHANNELS, MAXCHANNELS)
    min_ctas = min(min_ctas if min_ctas > 0 else 1, MAXCHANNELS, max_ctas)
    min_ch = max(min_ch, min_ctas)
    total = min(max_ch, total, max_ctas)
    rings, chains, tree_of = rings[:total], chains[:total], tree_of[:total]
    start = total
    for c in range(start, max(min_ch, start)):   # copyChannels(start, end)
        rings.append(rings[c - start])
        chains.append(chains[c - start])
        tree_of.append(tree_of[c - start])
    pattern = PATTERN_NAMES[tree.pattern if tree.pattern in (BALANCED_TREE, SPLIT_TREE, TREE) else TREE]
    return Channels(rings, chains, tree_of, n, pattern, [list(tree.intra[c]) for c in range(n)])


def channel_trees(ch: Channels) -> list[dict]:
    """Every channel's tree (``{rank: TreeNode}``) on one node: tree 0 or 1 of that channel's chain."""
    return [connect_trees([chain], ch.tree_pattern)[t] for chain, t in zip(ch.chains, ch.tree_of)]


def _attach_ranks(chain: list[int], pattern: str) -> set:
    child0, child1 = {"BALANCED_TREE": (1, 0), "SPLIT_TREE": (1, 1)}.get(pattern, (0, 0))
    if len(chain) == 1:
        child0 = child1 = 0
    return {chain[0], chain[child0], chain[child1]}


def tree_lines(ch: Channels, rank: int) -> list[str]:
    """``connectTrees``' ``Tree c : up -> rank -> down`` lines, printed by the ranks a node attaches through."""
    out = []
    n = ch.search_channels
    for c in range(n):
        chain = ch.search_chains[c]
        if rank in _attach_ranks(chain, ch.tree_pattern):
            pair = connect_trees([chain], ch.tree_pattern)   # channel c: tree 0; its Postset copy c + n: tree 1
            for cc, tree in ((c, pair[0]), (c + n, pair[1])):
                node = tree[rank]
                d = list(node.down) + [-1] * (3 - len(node.down))
                out.append(f"Tree {cc} : {node.up} -> {rank} -> {d[0]}/{d[1]}/{d[2]}")
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
