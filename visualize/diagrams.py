"""Graphviz diagrams (real ``dot``, PNG and SVG) of a run or of a real NCCL log.

(a) ``topology``: ranks grouped by node, each channel's ring as coloured edges labelled with the transport;
(b) ``trees``: for each channel its two trees (channel c and its Postset copy c + n), down and up edges;
(c) ``chunk_flow``: one collective on one channel, step by step from the trace: which chunk each rank sends to
    its successor, reduced or copied, the classic ring-allreduce figure drawn from what really happened;
(d) the same (a) and (b) from a real NCCL INFO log (``tracing.nccl_log``).
"""
from __future__ import annotations

import os

import graphviz

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2"]


def _color(c: int) -> str:
    return COLORS[c % len(COLORS)]


def topology(nranks: int, node_of_rank: list[int], rings: list[list[int]], transports=None,
             hosts: list | None = None, title: str = "", max_channels: int = 8) -> str:
    """``transports``: a name per channel (our runs), or {(channel, from, to): name} (parsed logs)."""
    shown = rings[:max_channels]
    note = f" (first {len(shown)} of {len(rings)} channels)" if len(shown) < len(rings) else ""
    g = graphviz.Digraph("topology", graph_attr={"label": (title or f"{nranks} ranks, {len(rings)} channel(s)") + note,
                                                 "labelloc": "t", "rankdir": "LR"},
                         node_attr={"shape": "box", "style": "rounded"})
    for node in sorted(set(node_of_rank)):
        with g.subgraph(name=f"cluster_node{node}") as sub:
            host = f" ({hosts[node_of_rank.index(node)]})" if hosts else ""
            sub.attr(label=f"node {node}{host}", style="dashed")
            for r in range(nranks):
                if node_of_rank[r] == node:
                    sub.node(f"r{r}", f"rank {r}")
    for c, ring in enumerate(shown):
        for i, r in enumerate(ring):
            nxt = ring[(i + 1) % len(ring)]
            if nxt == r:
                continue
            if isinstance(transports, dict):
                via = transports.get((c, r, nxt), "")
            elif transports:
                via = transports[c % len(transports)] or ""
            else:
                via = ""
            if node_of_rank[r] != node_of_rank[nxt] and not via:
                via = "NET"
            g.edge(f"r{r}", f"r{nxt}", label=f"ch{c} {via}".strip(), color=_color(c), fontcolor=_color(c))
    return g.source


def trees(tree_list: list[dict], nranks: int, title: str = "") -> str:
    """``tree_list[c]`` maps rank -> (up, [down...]); channels c and c + n/2 are drawn side by side."""
    g = graphviz.Digraph("trees", graph_attr={"label": title or "trees per channel", "labelloc": "t"},
                         node_attr={"shape": "circle"})
    half = max(1, len(tree_list) // 2)
    for c, tree in enumerate(tree_list):
        base, which = c % half, c // half
        with g.subgraph(name=f"cluster_c{c}") as sub:
            sub.attr(label=f"channel {c}" + (f" (tree {which} of ring {base})" if len(tree_list) > 1 else ""),
                     color=_color(base))
            for r in range(nranks):
                if r in tree:
                    root = tree[r][0] == -1
                    sub.node(f"c{c}r{r}", str(r), style="filled" if root else "", fillcolor="#eeeeee")
            for r, (up, downs) in tree.items():
                for d in downs:
                    sub.edge(f"c{c}r{r}", f"c{c}r{d}", color=_color(base), label="down")
                if up != -1:
                    sub.edge(f"c{c}r{r}", f"c{c}r{up}", color=_color(base), style="dashed", label="up",
                             constraint="false")
    return g.source


def chunk_flow(events: list[dict], seq: int, channel: int, ring: list[int], title: str = "") -> str:
    """Rows = primitive calls in order, columns = ranks in ring order; an edge per chunk sent."""
    prims = [e for e in events if e["kind"] == "prim" and e["seq"] == seq and e["channel"] == channel]
    loops = sorted({e["loop"] for e in prims})
    loop = loops[0] if loops else 0
    by_rank: dict[int, list[dict]] = {}
    for e in sorted(prims, key=lambda e: e["t0"]):
        if e["loop"] == loop:
            by_rank.setdefault(e["rank"], []).append(e)
    g = graphviz.Digraph("flow", graph_attr={"label": title or f"collective {seq}, channel {channel}, loop {loop}",
                                             "labelloc": "t", "rankdir": "TB", "nodesep": "0.6"},
                         node_attr={"shape": "box", "fontsize": "10"})
    nsteps = max((len(v) for v in by_rank.values()), default=0)
    with g.subgraph(name="header") as sub:
        sub.attr(rank="same")
        for r in ring:
            sub.node(f"h{r}", f"rank {r}", shape="plaintext", fontsize="12")
    for s in range(nsteps):
        with g.subgraph(name=f"row{s}") as sub:
            sub.attr(rank="same")
            for r in ring:
                calls = by_rank.get(r, [])
                if s < len(calls):
                    e = calls[s]
                    sub.node(f"s{s}r{r}", f"{e['prim']}\\nchunk {e['chunk']}",
                             style="filled", fillcolor="#fde0dd" if "reduce" in e["prim"] else "#e0ecf4")
    for a, b in zip(ring, ring[1:]):  # keep the columns in ring order
        g.edge(f"h{a}", f"h{b}", style="invis")
        for s in range(nsteps):
            g.edge(f"s{s}r{a}", f"s{s}r{b}", style="invis")
    for r in ring:
        g.edge(f"h{r}", f"s0r{r}", style="invis")
        for s in range(nsteps - 1):
            g.edge(f"s{s}r{r}", f"s{s + 1}r{r}", style="invis")
    for r in ring:
        for s, e in enumerate(by_rank.get(r, [])):
            peer = e["send_peer"]
            if peer >= 0 and s + 1 < len(by_rank.get(peer, [])):  # the successor takes it in its next call
                op = "reduce" if "reduce" in e["prim"] else "copy"
                g.edge(f"s{s}r{r}", f"s{s + 1}r{peer}", label=f"c{e['chunk']} {op}",
                       color="#d62728" if op == "reduce" else "#1f77b4", constraint="false")
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
