"""Merging rank trace files and converting them (``python -m tracing perfetto|csv|merge DIR``).

* Perfetto / Chrome trace-event JSON: one process per rank, one track per channel (primitive calls with their
  slices or steps nested inside), one track for the collectives; opens in ui.perfetto.dev.
* Chunk movements (CSV or JSON): one row per slice or step that sends data, from rank to peer, with the
  collective, channel, primitive, loop, chunk, FIFO slot, step, element offset and count, bytes and times.
"""
from __future__ import annotations

import csv
import glob
import json
import os

from .events import read_rank_file

COLL_TID = 10_000
PROXY_TID = 20_000  # + channel


def load(directory: str) -> tuple[dict, list[dict]]:
    """All ranks' events (each with its ``rank``) sorted by start time, and the rank-0 description."""
    metas, events = load_all(directory)
    return metas[min(metas)], events


def load_all(directory: str) -> tuple[dict[int, dict], list[dict]]:
    """Every rank's description (its own connections) by rank, and all events sorted by start time."""
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"{directory}: no such directory")
    metas, events = {}, []
    for path in sorted(glob.glob(os.path.join(directory, "trace-rank*.jsonl"))):
        try:
            meta, evs = read_rank_file(path)
            if not isinstance(meta, dict) or not isinstance(meta.get("rank"), int) or not all(
                    isinstance(e, dict) and isinstance(e.get("t0"), (int, float)) for e in evs):
                raise ValueError("a line is not a record of ours (meta with its rank, then events with t0)")
        except (ValueError, IndexError) as exc:
            raise ValueError(f"{path}: not a trace file written by NCCLLAB_TRACE ({exc})") from None
        metas[meta["rank"]] = meta
        for e in evs:
            e["rank"] = meta["rank"]
        events.extend(evs)
    if not metas:
        raise FileNotFoundError(f"no trace-rank*.jsonl in {directory} (run with NCCLLAB_TRACE={directory})")
    events.sort(key=lambda e: e["t0"])
    return metas, events


def edge_transports(metas: dict[int, dict]) -> dict[tuple[int, int, int], str]:
    """(channel, from, to) -> the transport of the send connector each rank really made (every ring and tree
    edge; traces written before connections were recorded give each rank's ring send per channel)."""
    out = {}
    for r, meta in metas.items():
        if "connections" in meta:
            for c, conns in enumerate(meta["connections"]):
                for peer, via in conns.items():
                    out[(c, r, int(peer))] = via
        else:
            for c, (ring, via) in enumerate(zip(meta["rings"], meta.get("transports", []))):
                if via and r in ring:
                    out[(c, r, ring[(ring.index(r) + 1) % len(ring)])] = via
    return out


def perfetto(directory: str) -> dict:
    meta, events = load(directory)
    t_base = min(e["t0"] for e in events) if events else 0
    out = []
    ranks = sorted({e["rank"] for e in events} | {meta["rank"]})
    for r in ranks:
        out.append({"ph": "M", "name": "process_name", "pid": r, "tid": 0, "args": {"name": f"rank {r}"}})
        out.append({"ph": "M", "name": "thread_name", "pid": r, "tid": COLL_TID, "args": {"name": "collectives"}})
        for c in range(meta["nchannels"]):
            out.append({"ph": "M", "name": "thread_name", "pid": r, "tid": c, "args": {"name": f"channel {c}"}})
            if any(t and t.startswith("NET") for t in meta.get("transports", [])) or meta.get("net"):
                out.append({"ph": "M", "name": "thread_name", "pid": r, "tid": PROXY_TID + c,
                            "args": {"name": f"proxy channel {c}"}})
    for e in events:
        if e["kind"] == "plan":
            continue  # a plan is its collectives' shared ``plan`` argument in this view
        ts, dur = (e["t0"] - t_base) / 1000.0, max(0.0, (e["t1"] - e["t0"]) / 1000.0)
        kind = e["kind"]
        if kind == "coll":
            name, tid = f"{e['func']} #{e['seq']} {e['algo']}/{e['proto']}", COLL_TID
        elif kind == "channel":
            name, tid = f"channel {e['channel']} part {e['part_offset']}+{e['part_count']}", e["channel"]
        elif kind == "prim":
            name, tid = f"{e['prim']} c{e['chunk']}", e["channel"]
        elif kind == "proxy_op":
            name = f"{'send to' if e['is_send'] else 'recv from'} rank {e['peer']} {e['proto']} x{e['nsteps']}"
            tid = PROXY_TID + e["channel"]
        elif kind == "proxy_step":
            name = f"{'isend' if e['is_send'] else 'irecv'} step {e['step']} ({e['bytes']} B)"
            tid = PROXY_TID + e["channel"]
        elif kind == "p2p":
            name = f"{'send to' if e['is_send'] else 'recv from'} rank {e['peer']} round {e['round']} ({e['bytes']} B)"
            tid = e["channel"]
        elif kind == "net_ib":
            name, tid = f"IB {e['event']} slot {e['slot']} qp {e['qp']} ({e['bytes']} B)", PROXY_TID + e["channel"]
        else:
            name, tid = f"slice {e['slice']} slot {e['slot']}", e["channel"]
        args = {k: v for k, v in e.items() if k not in ("kind", "t0", "t1", "rank")}
        out.append({"ph": "X", "name": name, "cat": kind, "pid": e["rank"], "tid": tid, "ts": ts, "dur": dur,
                    "args": args})
    return {"traceEvents": out, "displayTimeUnit": "ns", "otherData": {"nccl-lab": meta}}


def movements(directory: str) -> list[dict]:
    """Every slice/step that sends: who sent which chunk to whom, reduced or copied."""
    _, events = load(directory)
    rows = []
    for e in events:
        if e["kind"] != "step" or e["send_peer"] < 0:
            continue  # proxy steps repeat the same bytes on the wire: the kernel's view is the movement
        rows.append({"seq": e["seq"], "channel": e["channel"], "from": e["rank"], "to": e["send_peer"],
                     "prim": e["prim"], "op": "reduce" if "reduce" in e["prim"] else "copy", "loop": e["loop"],
                     "chunk": e["chunk"], "slice": e["slice"], "slot": e["slot"], "step": e["step"],
                     "offset": e["offset"], "count": e["count"], "bytes": e["bytes"], "t0": e["t0"], "t1": e["t1"]})
    return rows


def write_csv(rows: list[dict], path: str) -> None:
    with open(path, "w", newline="") as f:
        if not rows:
            return
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def merge(directory: str, path: str) -> None:
    meta, events = load(directory)
    with open(path, "w") as f:
        f.write(json.dumps({"kind": "meta", **meta}) + "\n")
        for e in events:
            f.write(json.dumps(e) + "\n")
