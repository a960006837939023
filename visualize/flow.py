"""(c) Chunk flow of one collective on one channel, drawn from a trace (``NCCLLAB_TRACE``).

Every primitive call of the chosen loop is a box (rank, chunk index, primitive), and every slice or step that moved
data is an arrow from the call that sent it to the call that received it.  This is what NCCL's device code does in
``src/device/all_reduce.h`` (``runRing``, ``runTreeSplit``) and the other ``src/device/*.h`` collectives, as our
profiler-shaped trace records it.

Pairing: a connection is a FIFO, so the k-th message rank a sent to rank b on a channel is the k-th message b
received from a (a ``step`` record per peer).  Nothing is inferred from the algorithm: an arrow exists only where
the trace has both the send and the receive.

Layouts: a ring is the textbook grid (one column per rank in ring order under a rank header, one row per step with
a step axis on the left); its wrap-around arrow (last column to first) is drawn as a pair of labelled stubs,
"to rank X" on the right and "from rank Y" on the left of the next row, so it never crosses the figure.  A tree
uses the same grid with its ranks in in-order (a parent between its first child and the others) and a row per
depth: the reduce rises from the deepest ranks to the root, then the broadcast goes down again, a V.
Boxes and arrows: red = reduce (the receiving call reduces), blue = copy.
"""
from __future__ import annotations

import html

import graphviz

REDUCE, COPY = "#d62728", "#1f77b4"          # arrows and the legend
REDUCE_FILL, COPY_FILL = "#fde0dd", "#e0ecf4"  # boxes


class FlowError(ValueError):
    """The trace has no such collective or channel."""


def _key(e: dict) -> tuple:
    return e["rank"], e["prim"], e["loop"], e["chunk"]


def moves(events: list[dict], seq: int, channel: int) -> list[dict]:
    """Every message of collective ``seq`` on ``channel``: {'src': call key, 'dst': call key, 'from', 'to',
    'chunk', 'slices'} where a call key is (rank, prim, loop, chunk).  Paired per connection in FIFO order."""
    steps = [e for e in events if e["kind"] == "step" and e["seq"] == seq and e["channel"] == channel]
    sent: dict[tuple, list] = {}
    got: dict[tuple, list] = {}
    for e in sorted(steps, key=lambda e: e["t0"]):
        if e["send_peer"] >= 0:
            sent.setdefault((e["rank"], e["send_peer"]), []).append(e)
        if e["recv_peer"] >= 0:
            got.setdefault((e["recv_peer"], e["rank"]), []).append(e)
    out: dict[tuple, dict] = {}
    for conn, sends in sent.items():
        for s, r in zip(sends, got.get(conn, [])):
            k = (_key(s), _key(r))
            if k in out:
                out[k]["slices"] += 1
            else:
                out[k] = {"src": k[0], "dst": k[1], "from": conn[0], "to": conn[1], "chunk": s["chunk"], "slices": 1}
    return list(out.values())


def select(events: list[dict], meta: dict, seq: int, channel: int) -> tuple[dict, dict[int, list[dict]]]:
    """The collective record and, per rank, its calls on ``channel`` in the drawn window, in program order: the
    first loop (a ring shows all its chunks, a tree its first chunk, as every chunk of a tree flows alike)."""
    colls = {e["seq"]: e for e in events if e["kind"] == "coll"}
    if seq not in colls:
        have = f"0..{max(colls)}" if colls else "none"
        raise FlowError(f"collective {seq} is not in the trace (collectives traced: {have})")
    nch = meta["nchannels"]
    if not 0 <= channel < nch:
        raise FlowError(f"channel {channel} is out of range: the trace has channels 0..{nch - 1}")
    prims = [e for e in events if e["kind"] == "prim" and e["seq"] == seq and e["channel"] == channel]
    if not prims:
        raise FlowError(f"channel {channel} moved no data in collective {seq} (a small collective uses fewer "
                        f"channels); try another --channel")
    loop = min(e["loop"] for e in prims)
    window = {(loop, c) for c in {e["chunk"] for e in prims if e["loop"] == loop}}
    if colls[seq]["algo"] == "Tree":
        window = {min(window)}
    by_rank: dict[int, list[dict]] = {}
    for e in sorted(prims, key=lambda e: e["t0"]):
        if (e["loop"], e["chunk"]) in window:
            by_rank.setdefault(e["rank"], []).append(e)
    return colls[seq], by_rank


def _box(e: dict) -> dict:
    red = "reduce" in e["prim"]
    return {"label": f"rank {e['rank']} · chunk {e['chunk']}\\n{e['prim']}", "fillcolor": REDUCE_FILL if red else
            COPY_FILL, "style": "filled"}


def _legend(title: str) -> str:
    return (f'<<table border="0" cellspacing="4"><tr><td colspan="2"><b>{html.escape(title)}</b></td></tr>'
            f'<tr><td bgcolor="{REDUCE_FILL}"><font color="{REDUCE}">red = reduce</font></td>'
            f'<td bgcolor="{COPY_FILL}"><font color="{COPY}">blue = copy</font></td></tr></table>>')


def chunk_flow(events: list[dict], meta: dict, seq: int = 0, channel: int = 0, title: str = "") -> str:
    """DOT source of the chunk flow of collective ``seq`` on ``channel`` (raises ``FlowError`` when absent)."""
    coll, by_rank = select(events, meta, seq, channel)
    keys = {_key(e): (e["rank"], i) for r, calls in by_rank.items() for i, e in enumerate(calls)}
    mv = [m for m in moves(events, seq, channel) if m["src"] in keys and m["dst"] in keys]
    loop = next(iter(by_rank.values()))[0]["loop"]
    name = f"{coll['func']} {coll['algo']}/{coll['proto']}, collective {seq}, channel {channel}, loop {loop}"
    if coll["algo"] == "Tree":
        chunk = next(iter(by_rank.values()))[0]["chunk"]
        return _tree(meta, channel, by_rank, keys, mv, title or f"{name}, chunk {chunk}: reduce up to the root, "
                                                                  f"broadcast down")
    return _ring(meta, channel, by_rank, keys, mv, title or name)


def _node(rank: int, i: int) -> str:
    return f"r{rank}_{i}"


def _edge_attrs(m: dict, keys: dict, label: str, where: str = "label") -> dict:
    """``where``: "xlabel" places the text after layout, next to a long arrow that ``dot`` did not rank by."""
    red = "reduce" in m["dst"][1]
    slices = f" ({m['slices']} slices)" if m["slices"] > 1 else ""
    src, dst = _node(*keys[m["src"]]), _node(*keys[m["dst"]])
    return {where: label + slices, "color": REDUCE if red else COPY, "fontcolor": REDUCE if red else COPY,
            "fontsize": "9", "id": f"move:{src}:{dst}"}


def _grid(title: str, cols: list[int], node_of: list[int], rows: list[str], cells: dict) -> graphviz.Digraph:
    """The figure's skeleton: a header per rank, a row label per row, ``cells[(rank, row)]`` = (name, call) boxes,
    invisible placeholders elsewhere, held in place by invisible edges; a stub column on each side for wrap-arounds.
    """
    g = graphviz.Digraph("flow", graph_attr={"label": _legend(title), "labelloc": "t", "rankdir": "TB",
                                             "nodesep": "0.35", "ranksep": "0.45", "newrank": "true",
                                             "splines": "line"},
                         node_attr={"shape": "box", "fontsize": "10", "width": "2.1"})
    invis = {"style": "invis", "label": ""}
    with g.subgraph(name="row_header") as sub:
        sub.attr(rank="same")
        sub.node("axis_h", "", **SIDE)
        sub.node("wi_h", "", **SIDE)
        for r in cols:
            sub.node(f"h{r}", f"rank {r}\\n(node {node_of[r]})", shape="plaintext", fontsize="12")
        sub.node("wo_h", "", **SIDE)
    names = {}
    for i, text in enumerate(rows):
        with g.subgraph(name=f"row{i}") as sub:
            sub.attr(rank="same")
            sub.node(f"axis{i}", text, fontsize="11", **SIDE)
            sub.node(f"wi{i}", **invis, **SIDE)
            for r in cols:
                name, call = cells.get((r, i), (f"empty_r{r}_{i}", None))
                sub.node(name, **(_box(call) if call else invis))
                names[(r, i)] = name
            sub.node(f"wo{i}", **invis, **SIDE)
    grid = [["axis_h", *[f"axis{i}" for i in range(len(rows))]], ["wi_h", *[f"wi{i}" for i in range(len(rows))]],
            *[[f"h{r}", *[names[(r, i)] for i in range(len(rows))]] for r in cols],
            ["wo_h", *[f"wo{i}" for i in range(len(rows))]]]
    for column in grid:  # rows top to bottom
        for a, b in zip(column, column[1:]):
            g.edge(a, b, style="invis")
    for row in zip(*grid):  # columns left to right
        for a, b in zip(row, row[1:]):
            g.edge(a, b, style="invis", weight="10")
    return g


SIDE = {"shape": "plaintext", "width": "1.3", "fixedsize": "true"}


def _ring(meta: dict, channel: int, by_rank: dict, keys: dict, mv: list, title: str) -> str:
    """Columns in ring order, row i = each rank's i-th call (step i of the ring algorithm)."""
    ring = meta["rings"][channel % len(meta["rings"])]
    cols = [r for r in ring if r in by_rank] + sorted(set(by_rank) - set(ring))
    node_of = meta.get("node_of_rank") or [0] * meta["nranks"]
    nrows = max(len(v) for v in by_rank.values())
    cells = {(r, i): (_node(r, i), e) for r, calls in by_rank.items() for i, e in enumerate(calls)}
    g = _grid(title, cols, node_of, [f"step {i}" for i in range(nrows)], cells)
    pos = {r: j for j, r in enumerate(cols)}
    for m in mv:
        (sr, si), (dr, di) = keys[m["src"]], keys[m["dst"]]
        # xlabel, not label: dot gives a label a virtual node of its own between the two rows, and routes the arrow
        # through wherever that node lands (an arrow from rank 1 to rank 2 once detoured past rank 3); an xlabel
        # is placed after layout, so each arrow is one straight segment between neighbouring columns
        attrs = _edge_attrs(m, keys, f"chunk {m['chunk']}", "xlabel")
        if pos[dr] < pos[sr]:  # wrap-around: two stubs, so the arrow never crosses the figure
            g.node(f"wo{si}", f"to rank {dr} ↻", fontcolor=attrs["color"], fontsize="10", style="", **SIDE)
            g.node(f"wi{di}", f"↻ from rank {sr}", fontcolor=attrs["color"], fontsize="10", style="", **SIDE)
            g.edge(_node(sr, si), f"wo{si}", constraint="false", **attrs)
            g.edge(f"wi{di}", _node(dr, di), constraint="false", **{**attrs, "xlabel": ""})
        else:
            g.edge(_node(sr, si), _node(dr, di), constraint="false", **attrs)
    return g.source


def _tree(meta: dict, channel: int, by_rank: dict, keys: dict, mv: list, title: str) -> str:
    """The tree drawn twice, as the data moves: columns in the tree's in-order (a parent between its first child
    and the others), the reduce rising row by row from the deepest ranks to the root, then the broadcast going
    down again, one row per depth."""
    tree = {int(r): (up, list(downs)) for r, (up, downs) in meta["trees"][channel].items()}
    node_of = meta.get("node_of_rank") or [0] * meta["nranks"]
    root = next(r for r, (up, _) in tree.items() if up == -1)
    depth, cols = {}, []

    def walk(r: int, d: int) -> None:
        depth[r] = d
        downs = tree[r][1]
        if downs:
            walk(downs[0], d + 1)
        cols.append(r)
        for c in downs[1:]:
            walk(c, d + 1)
    walk(root, 0)
    cols += sorted(set(by_rank) - set(cols))
    height = max(depth.values())
    from_parent = {m["dst"] for m in mv if tree.get(m["to"], (None,))[0] == m["from"]}
    extra = max(0, len(by_rank.get(root, [])) - 1)  # runTreeUpDown: the root reduces, then sends
    cells, rows = {}, [""] * (2 * height + 1 + extra)
    for r, calls in by_rank.items():
        for i, e in enumerate(calls):
            d = depth.get(r, height)
            if r == root:
                row = height + i
            elif _key(e) in from_parent:
                row = height + extra + d
            else:
                row = height - d
            cells[(r, row)] = (_node(r, i), e)
    for i in range(len(rows)):
        rows[i] = (f"reduce up\\ndepth {height - i}" if i < height else f"broadcast down\\ndepth {i - height - extra}"
                   if i > height + extra else "root")
    g = _grid(title, cols, node_of, rows, cells)
    for m in mv:
        up = tree.get(m["from"], (None,))[0] == m["to"]
        g.edge(_node(*keys[m["src"]]), _node(*keys[m["dst"]]), constraint="false",
               **_edge_attrs(m, keys, f"{'up' if up else 'down'} · chunk {m['chunk']}", "xlabel"))
    return g.source
