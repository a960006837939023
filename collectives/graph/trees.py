"""Double binary trees (NCCL ``src/graph/trees.cc``: ``ncclGetBtree``, ``ncclGetDtree``; ``src/graph/connect.cc``:
``connectTrees`` and the attachment ranks of ``ncclTopoPreset``).

Over *nodes*: tree 0 is the binary tree of ``get_btree``; tree 1 mirrors it (even node count) or shifts it by one
(odd).  Inside a node, each channel's ranks form a chain (``treeIntra``); the node attaches to its parent through
``treeToParent = chain[0]`` and to its children through ``treeToChild0/1 = chain[child0Index/child1Index]``,
with the indices set by the pattern: TREE (0,0), BALANCED_TREE (1,0), SPLIT_TREE (1,1); a one-rank node always
uses TREE.  ``down[]`` is [intra-node child, inter-node child d0, inter-node child d1] (existing ones only).
Channel c uses tree 0 and channel c + nChannels (the Postset copy) tree 1.
``channel_trees`` takes each node's chain from the channel's ring order, or from given chains; the communicator's
come from the tree graph (``graph.connect.channel_trees``, after ``init_rank``'s search or NCCL_GRAPH_FILE).
"""
from __future__ import annotations

from dataclasses import dataclass

PATTERNS = {"BALANCED_TREE": (1, 0), "SPLIT_TREE": (1, 1), "TREE": (0, 0)}


def get_btree(nranks: int, rank: int) -> tuple[int, int, int, int]:
    """``ncclGetBtree``: (up, down0, down1, parentChildType) of ``rank`` in the binary tree rooted at 0."""
    bit = 1
    while bit < nranks:
        if bit & rank:
            break
        bit <<= 1
    if rank == 0:
        return -1, -1, (bit >> 1) if nranks > 1 else -1, -1
    up = (rank ^ bit) | (bit << 1)
    if up >= nranks:
        up = rank ^ bit
    parent_child_type = 0 if rank < up else 1
    lowbit = bit >> 1
    d0 = rank - lowbit if lowbit else -1
    d1 = rank + lowbit if lowbit else -1
    while d1 >= nranks:
        d1 = rank + lowbit if lowbit else -1
        lowbit >>= 1
    return up, d0, d1, parent_child_type


def get_dtree(nranks: int, rank: int) -> tuple[tuple, tuple]:
    """``ncclGetDtree``: tree 0 = btree; tree 1 = shifted btree (odd nranks) or mirrored btree (even)."""
    t0 = get_btree(nranks, rank)
    if nranks % 2 == 1:
        up, d0, d1, pct = get_btree(nranks, (rank - 1 + nranks) % nranks)
        f = lambda p: -1 if p == -1 else (p + 1) % nranks  # noqa: E731
    else:
        up, d0, d1, pct = get_btree(nranks, nranks - 1 - rank)
        f = lambda p: -1 if p == -1 else nranks - 1 - p  # noqa: E731
    return t0, (f(up), f(d0), f(d1), pct)


@dataclass(frozen=True)
class TreeNode:
    up: int
    down: tuple   # NCCL's down[] order


def connect_trees(chains: list[list[int]], pattern: str | list[str] = "BALANCED_TREE") -> tuple[dict, dict]:
    """Tree 0 and tree 1 of one channel: ``{rank: TreeNode}`` each.  ``chains[node]`` is the node's intra chain;
    ``pattern`` is every node's tree pattern, or one per node (``nodesTreePatterns``)."""
    nnodes = len(chains)
    patterns = [pattern] * nnodes if isinstance(pattern, str) else list(pattern)
    result = []
    for tree in (0, 1):
        up, down = {}, {r: [] for chain in chains for r in chain}
        for chain in chains:
            for i, r in enumerate(chain):
                up[r] = chain[i - 1] if i > 0 else -1
                if i + 1 < len(chain):
                    down[r].append(chain[i + 1])
        to_parent, to_child0, to_child1 = [], [], []
        for chain, node_pattern in zip(chains, patterns):
            c0, c1 = PATTERNS["TREE" if len(chain) == 1 else node_pattern]
            to_parent.append(chain[0])
            to_child0.append(chain[c0])
            to_child1.append(chain[c1])
        for node in range(nnodes):
            t_up, t_d0, t_d1, pct = get_dtree(nnodes, node)[tree]
            me = to_parent[node]
            if t_up != -1:
                up[me] = (to_child0 if pct == 0 else to_child1)[t_up]
            if t_d0 != -1:
                down[to_child0[node]].append(to_parent[t_d0])
            if t_d1 != -1:
                down[to_child1[node]].append(to_parent[t_d1])
        result.append({r: TreeNode(up[r], tuple(down[r])) for r in up})
    return result[0], result[1]


def channel_trees(rings: list[list[int]], node_of_rank: list[int], pattern: str = "BALANCED_TREE",
                  chains: list[list[int]] | None = None) -> list[dict]:
    """Trees of every channel after Postset doubling: channel c -> tree 0 of ring c, c + n -> tree 1.  Each node's
    chain is ``chains[c]`` (default: ring c) restricted to the node."""
    nnodes = max(node_of_rank) + 1
    first, second = [], []
    for c, ring in enumerate(rings):
        order = chains[c % len(chains)] if chains else ring
        chains_c = [[r for r in order if node_of_rank[r] == node] for node in range(nnodes)]
        t0, t1 = connect_trees(chains_c, pattern)
        first.append(t0)
        second.append(t1)
    return first + second


def trees_log_line(rank: int, trees: list[dict]) -> str:
    """``Trees [c] d0/d1/d2->rank->up`` for every channel, as NCCL's INIT log prints it: the entries are
    written into a 1024-byte buffer (at most 1022 characters) and printed after ``Trees``."""
    parts = []
    for c, tree in enumerate(trees):
        node = tree[rank]
        d = list(node.down) + [-1] * (3 - len(node.down))
        parts.append(f" [{c}] {d[0]}/{d[1]}/{d[2]}->{rank}->{node.up}")
    return "Trees" + "".join(parts)[:1022]


def tree_table(trees: list[dict]) -> list[dict]:
    """Every channel's tree as plain data, ``[{rank: (up, [down...])}]`` (the trace's metadata, the reference's
    model)."""
    return [{r: (t.up, list(t.down)) for r, t in tree.items()} for tree in trees]
