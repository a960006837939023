"""Graphviz diagrams (real ``dot``, PNG and SVG) of a run or of a real NCCL log.

(a) ``topology``: ranks grouped by node, each channel's ring as coloured edges labelled with the transport;
(b) ``trees``: both trees of a ring side by side (channel c, tree 0, and its Postset copy, tree 1), by node;
(c) the chunk flow of one collective on one channel is ``visualize.flow``;
(d) the same (a) and (b) from a real NCCL INFO log (``tracing.nccl_log``).
"""
from __future__ import annotations

import html
import os

import graphviz

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2"]


def _color(c: int) -> str:
    return COLORS[c % len(COLORS)]


NODE_FILLS = ["#e8f1fa", "#fdeee0", "#e7f5e4", "#f1e9f7", "#fbe4e8", "#e2f5f6", "#f3ece4", "#f0f0f0"]


def _fill(node: int) -> str:
    return NODE_FILLS[node % len(NODE_FILLS)]


def channel_roles(nchannels: int, doubled: int | None = None) -> list[tuple[int, int, int | None]]:
    """(search ring, tree 0|1, copied from channel or None) of each channel: ``ncclTopoPostset`` doubled the
    search's rings to ``doubled`` channels (channel c + doubled/2 takes tree 1 of ring c), and channels past
    ``doubled`` copy channel c - doubled (``copyChannels``).  Computed from the real channel index."""
    doubled = doubled or nchannels
    half = max(1, doubled // 2) if doubled > 1 else 1
    roles = []
    for c in range(nchannels):
        src = c
        while src >= doubled:
            src -= doubled
        tree = int(src >= half) if doubled > 1 else 0
        roles.append((src % half, tree, src if src != c else None))
    return roles


def topology(nranks: int, node_of_rank: list[int], rings: list[list[int]], transports: dict | None = None,
             hosts: list | None = None, title: str = "", max_channels: int = 8) -> str:
    """Ranks grouped by node (a cluster per node), each channel's ring as coloured edges.  ``transports`` maps
    (channel, from, to) to the transport that really connected the edge (trace metadata or the log's ``via``
    lines); an edge with none known carries only its channel."""
    transports = transports or {}
    shown = rings[:max_channels]
    note = f" (first {len(shown)} of {len(rings)} channels)" if len(shown) < len(rings) else ""
    nnodes = len(set(node_of_rank))
    g = graphviz.Digraph("topology", graph_attr={
        "label": (title or f"{nranks} ranks on {nnodes} node(s), {len(rings)} channel(s)") + note
        + "\\nedge label: the channels of that link and the transport that connected it", "labelloc": "t",
        "rankdir": "LR"},
        node_attr={"shape": "box", "style": "rounded,filled"})
    for node in sorted(set(node_of_rank)):
        with g.subgraph(name=f"cluster_node{node}") as sub:
            host = f" ({hosts[node_of_rank.index(node)]})" if hosts else ""
            sub.attr(label=f"node {node}{host}", style="dashed")
            for r in range(nranks):
                if node_of_rank[r] == node:
                    sub.node(f"r{r}", f"rank {r}", fillcolor=_fill(node))
    links: dict[tuple, list[int]] = {}  # (from, to, transport) -> channels: one arrow per link, not per channel
    for c, ring in enumerate(shown):
        for i, r in enumerate(ring):
            nxt = ring[(i + 1) % len(ring)]
            if nxt != r:
                links.setdefault((r, nxt, transports.get((c, r, nxt), "")), []).append(c)
    for (r, nxt, via), chans in links.items():
        color = _color(chans[0]) if len(chans) == 1 else "#333333"
        g.edge(f"r{r}", f"r{nxt}", label=f"ch{','.join(map(str, chans))} {via}".strip(), color=color,
               fontcolor=color, penwidth="2" if node_of_rank[r] != node_of_rank[nxt] else "1")
    return g.source


def trees(tree_list: list[dict], nranks: int, title: str = "", node_of_rank: list[int] | None = None,
          roles: list | None = None, transports: dict | None = None, max_rings: int = 4) -> str:
    """``tree_list[c]`` maps rank -> (up, [down...]).  Both trees of a ring side by side: channel c (tree 0) and
    its Postset copy (tree 1), each label from the real channel index (``roles``, see ``channel_roles``).
    One edge per parent-child link (it carries the reduce up and the broadcast down), labelled with its transport
    when known; ranks filled by node, the root double-circled."""
    node_of_rank = node_of_rank or [0] * nranks
    roles = roles or channel_roles(len(tree_list))
    transports = transports or {}
    by_ring: dict[int, list[int]] = {}
    for c, (ring, _, _) in enumerate(roles):
        by_ring.setdefault(ring, []).append(c)
    shown = sorted(by_ring)[:max_rings]
    note = ""
    if len(shown) < len(by_ring):
        chans = sorted(c for r in shown for c in by_ring[r])
        note = f" (rings {shown[0]}-{shown[-1]} of {len(by_ring)} shown: channels {', '.join(map(str, chans))})"
    nodes = sorted(set(node_of_rank))
    head = html.escape((title or "double binary trees") + note)
    cells = "".join(f'<td bgcolor="{_fill(k)}">node {k}</td>' for k in nodes[:16])
    label = (f'<<table border="0" cellspacing="3"><tr><td colspan="{min(16, len(nodes))}"><b>{head}</b><br/>'
             f'double circle = root; each edge carries the reduce up and the broadcast down; thick = between '
             f'nodes</td></tr><tr>{cells}</tr></table>>')
    g = graphviz.Digraph("trees", graph_attr={"label": label, "labelloc": "t", "newrank": "true"},
                         node_attr={"shape": "circle", "style": "filled", "fontsize": "11"})
    for ring in shown:
        with g.subgraph(name=f"cluster_ring{ring}") as pair:
            pair.attr(label=f"ring {ring}: channels {' and '.join(map(str, by_ring[ring]))}", color=_color(ring),
                      style="dashed")
            for c in reversed(by_ring[ring]):  # dot places the cluster declared last on the left: tree 0
                _, which, copy_of = roles[c]
                with pair.subgraph(name=f"cluster_c{c}") as sub:
                    copy = f", copy of channel {copy_of}" if copy_of is not None else ""
                    sub.attr(label=f"channel {c}: tree {which} of ring {ring}{copy}", color=_color(ring),
                             style="solid")
                    tree = tree_list[c]
                    present = set(tree) | {p for up, downs in tree.values() for p in (up, *downs) if p != -1}
                    for r in sorted(present):
                        if r in present:
                            sub.node(f"c{c}r{r}", str(r), fillcolor=_fill(node_of_rank[r]),
                                     shape="doublecircle" if tree.get(r, (0,))[0] == -1 else "circle")
                    for r, (_, downs) in sorted(tree.items()):
                        for d in downs:
                            via = transports.get((c, r, d)) or transports.get((c, d, r)) or ""
                            inter = node_of_rank[r] != node_of_rank[d]
                            sub.edge(f"c{c}r{r}", f"c{c}r{d}", label=via, dir="both", arrowsize="0.6",
                                     color=_color(ring), penwidth="2" if inter else "1")
    return g.source


def render(source: str, path_base: str, formats=("png", "svg")) -> list[str]:
    """Render DOT source with the real ``dot``: writes path_base.dot and path_base.<fmt>."""
    os.makedirs(os.path.dirname(os.path.abspath(path_base)), exist_ok=True)
    with open(path_base + ".dot", "w") as f:
        f.write(source)
    out = []
    for fmt in formats:
        out.append(graphviz.Source(source).render(outfile=f"{path_base}.{fmt}", format=fmt, cleanup=True))
    return out
