"""The message sequence of one NET/IB transfer (NCCL ``src/transport/net_ib/p2p.cc``), drawn with ``dot`` from a
real trace: the receiver posts a receive and RDMA-writes its CTS entry into the sender's FIFO, the sender sees it
and posts its data writes (the last, or a zero-byte one after them, WRITE_WITH_IMM carrying the size), and both
ends take their completions.  Two lifelines, events top to bottom in trace time; edges across are RDMA writes.
"""
from __future__ import annotations

import graphviz

LABELS = {"cts_posted": "irecv: post RECV WR(s)\\nRDMA_WRITE CTS entry", "cts_seen": "isend: CTS idx == fifoHead+1",
          "wr_posted": "post RDMA_WRITE(_WITH_IMM)", "completion": "ibv_poll_cq: CQE"}


def pick(events: list[dict], seq: int | None = None, slot: int = 0) -> tuple[list[dict], list[dict]]:
    """The receiver's and the sender's events of one transfer: the first traced (connection, slot) pair
    (of collective ``seq`` if given) that has all four kinds of event."""
    ib = [e for e in events if e["kind"] == "net_ib" and (seq is None or e["seq"] == seq) and e["slot"] == slot]
    for r in ib:
        if r["is_send"] or r["event"] != "cts_posted":
            continue
        recv = [e for e in ib if e["rank"] == r["rank"] and not e["is_send"] and e["peer"] == r["peer"]
                and e["seq"] == r["seq"] and e["channel"] == r["channel"]]
        send = [e for e in ib if e["rank"] == r["peer"] and e["is_send"] and e["peer"] == r["rank"]
                and e["seq"] == r["seq"] and e["channel"] == r["channel"]]
        if {e["event"] for e in send} >= {"cts_seen", "wr_posted", "completion"} and \
                any(e["event"] == "completion" for e in recv):
            return _first_message(recv), _first_message(send)
    raise ValueError("no complete NET/IB transfer in this trace (was it run with NCCL_NET=IB and NCCLLAB_TRACE?)")


def _first_message(evs: list[dict]) -> list[dict]:
    """One message's events: a slot is reused every 256 messages, so stop where its cycle starts over."""
    evs = sorted(evs, key=lambda e: e["t0"])
    start = "cts_posted" if not evs[0]["is_send"] else "cts_seen"
    out = []
    for e in evs:
        if e["event"] == start and out:
            break
        out.append(e)
    return out


def ib_sequence(recv: list[dict], send: list[dict], title: str = "") -> str:
    t0 = min(e["t0"] for e in recv + send)
    rr, sr = recv[0]["rank"], send[0]["rank"]
    g = graphviz.Digraph("ib_sequence", graph_attr={
        "label": title or f"one NET/IB transfer: rank {sr} -> rank {rr}, channel {recv[0]['channel']}, "
                          f"FIFO slot {recv[0]['slot']}", "labelloc": "t", "rankdir": "TB", "newrank": "true"},
        node_attr={"shape": "box", "style": "rounded", "fontsize": "10"})
    ordered = sorted(recv + send, key=lambda e: e["t0"])
    names = {}
    for i, e in enumerate(ordered):
        names[id(e)] = f"e{i}"
    for lane, evs, who in (("recv", recv, f"rank {rr} (receiver)"), ("send", send, f"rank {sr} (sender)")):
        with g.subgraph(name=f"cluster_{lane}") as sub:
            sub.attr(label=who, style="dashed")
            prev = None
            for e in sorted(evs, key=lambda x: x["t0"]):
                extra = {"wr_posted": f"\\nQP index {e['qp']}, {e['bytes']} B",
                         "completion": f"\\nqp_num {e['qp']}, {e['bytes']} B"}.get(e["event"], "")
                sub.node(names[id(e)], f"{LABELS[e['event']]}{extra}\\n+{(e['t0'] - t0) / 1000:.0f} us")
                if prev is not None:
                    sub.edge(prev, names[id(e)], style="invis")
                prev = names[id(e)]
    for a, b in zip(ordered, ordered[1:]):  # time order across lanes: each event one rank below the previous
        g.edge(names[id(a)], names[id(b)], style="invis", weight="0")
    cts = next(e for e in recv if e["event"] == "cts_posted")
    seen = next(e for e in send if e["event"] == "cts_seen")
    g.edge(names[id(cts)], names[id(seen)], label="RDMA_WRITE 64-B ncclIbSendFifo\\ninto the sender's CTS FIFO",
           color="#1f77b4", constraint="false")
    rcomps = [e for e in recv if e["event"] == "completion"]
    for i, wr in enumerate(e for e in send if e["event"] == "wr_posted"):
        target = rcomps[min(i, len(rcomps) - 1)]
        g.edge(names[id(wr)], names[id(target)], label=f"data + WRITE_WITH_IMM\\n(imm = size) on QP index {wr['qp']}",
               color="#d62728", constraint="false")
    return g.source
