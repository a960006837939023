"""(e) One point-to-point plan (an all-to-all, say) as a rounds x ranks grid, drawn from a trace (``NCCLLAB_TRACE``).

Row d is round d of NCCL's p2p schedule (``src/init.cc``: ``ncclP2pSchedule``; the channels of a round from
``src/include/channel.h``: ``ncclP2pChannelBaseForRound``, its parts' from ``ncclP2pChannelForPart``); column r is
rank r.  A cell says whom rank r sent to (``->``) and received from (``<-``) in that round, on which p2p channels
and how many bytes, exactly as the rank's ``p2p`` trace records say (one record per channel part; a round whose
sends and receives did not all fit one work holds several epochs' parts, summed here).  Nothing is inferred from
the schedule: an empty cell is a round in which the rank moved nothing.  It is the picture of the quadratic
delta enumeration: on one node, round d pairs rank r with r + d and r - d; across nodes, the rounds go node
delta first, so the peers of one round sit on the same remote node.
"""
from __future__ import annotations

import collections
import html

SEND, RECV, SELF = "#1f77b4", "#d95f02", "#555555"  # text colours, also in the legend
SEND_FILL, BOTH_FILL = "#eef4fa", "#fbf3ec"


class P2pPictureError(ValueError):
    """The trace has no such p2p plan."""


def plans_of(events: list[dict]) -> dict[int, list[int]]:
    """Each rank's plan ids that ran p2p works, in order."""
    out: dict[int, list[int]] = collections.defaultdict(list)
    for e in events:
        if e["kind"] == "p2p" and e["plan"] not in out[e["rank"]]:
            out[e["rank"]].append(e["plan"])
    return {r: sorted(p) for r, p in out.items()}


def cells(events: list[dict], index: int = -1) -> dict[tuple[int, int], dict]:
    """{(round, rank): {"send" | "recv": {"peer", "channels", "bytes"}}} for each rank's ``index``-th p2p plan
    (default: the last one)."""
    plans = plans_of(events)
    if not plans:
        raise P2pPictureError("the trace has no p2p records (was it written with NCCLLAB_TRACE set?)")
    chosen = {}
    for r, ids in plans.items():
        if not -len(ids) <= index < len(ids):
            raise P2pPictureError(f"--plan {index}: rank {r} ran {len(ids)} p2p plans")
        chosen[r] = ids[index]
    out: dict[tuple[int, int], dict] = collections.defaultdict(dict)
    for e in events:
        if e["kind"] != "p2p" or chosen.get(e["rank"]) != e["plan"]:
            continue
        side = out[(e["round"], e["rank"])].setdefault("send" if e["is_send"] else "recv",
                                                      {"peer": e["peer"], "channels": set(), "bytes": 0})
        side["channels"].add(e["channel"])
        side["bytes"] += e["bytes"]
    return dict(out)


def cell_text(cell: dict, rank: int) -> list[tuple[str, str]]:
    """The lines of one cell, each (text, colour): ``-> 3  ch 2,3  4096 B`` and ``<- 1  ...``; a send to oneself
    is one ``self copy`` line."""
    lines = []
    for key, arrow, colour in (("send", "->", SEND), ("recv", "<-", RECV)):
        side = cell.get(key)
        if side is None:
            continue
        chans = ",".join(str(c) for c in sorted(side["channels"]))
        if side["peer"] == rank:
            lines.append((f"self copy  ch {chans}  {side['bytes']} B", SELF))
        else:
            lines.append((f"{arrow} {side['peer']}  ch {chans}  {side['bytes']} B", colour))
    return lines


def grid(events: list[dict], meta: dict, index: int = -1, title: str = "") -> str:
    """DOT source of the grid: one HTML-table node, a header row of ranks (and their nodes), a row per round, a
    legend underneath."""
    table = cells(events, index)
    nranks, node_of = meta["nranks"], meta["node_of_rank"]
    rounds = range(max(rnd for rnd, _ in table) + 1)
    which = f"point-to-point plan {index} of each rank" if index >= 0 else "each rank's last point-to-point plan"
    title = title or f"{which}: {nranks} ranks on {meta['nnodes']} node(s), {len(rounds)} rounds of ncclP2pSchedule"
    rows = [f'<tr><td colspan="{nranks + 1}"><b>{html.escape(title)}</b></td></tr>',
            "<tr><td><b>round</b></td>" + "".join(f"<td><b>rank {r}</b><br/>node {node_of[r]}</td>"
                                                   for r in range(nranks)) + "</tr>"]
    for rnd in rounds:
        tds = [f"<td><b>{rnd}</b></td>"]
        for r in range(nranks):
            lines = cell_text(table.get((rnd, r), {}), r)
            body = "<br/>".join(f'<font color="{c}">{html.escape(t)}</font>' for t, c in lines) or "&#183;"
            fill = BOTH_FILL if len(lines) == 2 else SEND_FILL if lines else "white"
            tds.append(f'<td id="cell_{rnd}_{r}" bgcolor="{fill}">{body}</td>')
        rows.append("<tr>" + "".join(tds) + "</tr>")
    legend = (f'<font color="{SEND}">-&gt; P: sends to rank P</font>   <font color="{RECV}">&lt;- Q: receives '
              f'from rank Q</font>   <font color="{SELF}">self copy: round 0, no connection</font><br/>ch: the p2p '
              f'channels its parts ran on; B: bytes (all parts, all epochs of the round)')
    rows.append(f'<tr><td colspan="{nranks + 1}" align="left">{legend}</td></tr>')
    label = '<<table border="0" cellborder="1" cellspacing="0" cellpadding="6">' + "".join(rows) + "</table>>"
    return ("digraph p2p {\n  graph [fontname=\"Helvetica\"];\n  node [shape=plaintext fontname=\"Helvetica\" "
            f"fontsize=10];\n  grid [label={label}];\n}}\n")
