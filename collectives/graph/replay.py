"""Rebuild the trees of a real NCCL INFO log with our construction, and diff them against the log's own.

    python -m collectives.graph.replay nccl.log [--json FILE]

What the log gives: ranks, nodes and hosts (``comm ... nRanks N nNodes K``, each line's ``host:pid:tid`` prefix;
node index = first appearance scanning ranks 0..N-1, like ``nodesFirstRank``), the ``Trees`` lines, and, in
GRAPH logs, the tree search's channel lines.  INIT logs never print the tree search's intra-node order (``ncclTopoCompute``'s
chains are only in GRAPH logs; docs/trees.md), so each node's chain per channel is read from the log's own intra-node tree links (or the GRAPH lines when
present); every inter-node link is then rebuilt: ``get_dtree`` over nodes, attachment ranks by pattern
(BALANCED_TREE, SPLIT_TREE, TREE; a one-rank node is always TREE), and the channel layout: after Postset doubling to
D channels, c < D/2 takes tree 0 and the rest tree 1, and channels past D are copies (CollNet's n + n/2, the Hopper
x2, NCCL_MIN_NCHANNELS) keeping their source's tree.  The pattern and layout that reproduce most entries are
reported, with ``matched N of M`` rank x channel entries, the inter-node links
compared and matched, and each mismatch; ``fits`` lists, per pattern, every channel layout that matches all
entries (several patterns fitting: the log cannot tell them apart).
Partial logs (one node's output) replay the entries present and name the missing ranks; a missing node's chains are
those of a complete node moved onto its ranks.  A log of several communicators replays the largest, or ``--comm``.
The log is streamed (``nccl_log.parse_file``, strict): a file that is not an NCCL log by NCCL's line grammar, or
a Trees entry naming a rank outside the communicator, is one line of error naming the line.
"""
from __future__ import annotations

import argparse
import json
import sys

from tracing.debug import ranges
from tracing.nccl_log import TREE_PATTERNS, LogError, NcclLog, is_nccl_log, parse, parse_file

from .trees import PATTERNS, connect_trees


def nodes_of(log: NcclLog, nranks: int) -> list[int]:
    """Node of each rank: by host name (first appearance over ranks), or, when hosts are missing or do not match
    the log's nNodes (one machine playing several nodes), by consecutive blocks of localRanks."""
    hosts = [log.host_of.get(r) for r in range(nranks)]
    if None in hosts or (log.nnodes and len(set(hosts)) != log.nnodes):
        per = max(log.local_ranks.values(), default=nranks // max(1, log.nnodes or 1)) or nranks
        return [r // per for r in range(nranks)]
    order: dict = {}
    for h in hosts:
        order.setdefault(h, len(order))
    return [order[h] for h in hosts]


def _chain(tree: dict, members: list[int], node_of: list[int], node: int) -> list[int]:
    heads = [r for r in members if tree[r][0] == -1 or node_of[tree[r][0]] != node]
    if len(heads) != 1:
        raise LogError(f"node {node}: cannot find a single chain head among ranks {members}")
    chain = [heads[0]]
    while len(chain) <= len(members):   # a cycle of intra-node links (a broken log) would never end
        nxt = [d for d in tree[chain[-1]][1] if node_of[d] == node]
        if not nxt or nxt[0] not in tree:
            break
        chain.append(nxt[0])
    if sorted(chain) != sorted(members):
        raise LogError(f"node {node}: intra-node links do not form one chain ({chain} vs {sorted(members)})")
    return chain


def _members(node_of: list[int], nnodes: int) -> list[list[int]]:
    """Each node's ranks, in one pass (a loop per node over the ranks is ranks x nodes)."""
    members: list[list[int]] = [[] for _ in range(nnodes)]
    for r, node in enumerate(node_of):
        members[node].append(r)
    return members


def node_chains(tree: dict, node_of: list[int], nnodes: int) -> list[list[int]]:
    """Every node's chain in one channel.  A node whose ranks are all in the log: its own intra-node links.  A node
    the log lacks (a user pasted one node's output) or has only in part: the chain of the first complete node,
    moved onto its ranks by local index (NCCL's search gives identical nodes the same chains)."""
    members = _members(node_of, nnodes)
    complete = [node for node in range(nnodes) if members[node] and all(r in tree for r in members[node])]
    if not complete:
        raise LogError("no node has all its ranks' Trees entries in the log: its chains cannot be read")
    own = {node: _chain(tree, members[node], node_of, node) if node in complete else None for node in range(nnodes)}
    template, tmembers = own[complete[0]], members[complete[0]]
    chains = []
    for node in range(nnodes):
        if own[node] is not None:
            chains.append(own[node])
        elif len(members[node]) != len(tmembers):
            raise LogError(f"node {node} is missing from the log and differs in size from node {complete[0]}")
        else:
            chains.append([members[node][tmembers.index(r)] for r in template])
    return chains


def tree_index(c: int, doubled: int) -> int:
    """Which of the two trees channel ``c`` carries when ``ncclTopoPostset`` doubled the search's channels to
    ``doubled``: c < doubled/2 tree 0, then tree 1; any channel past that is a ``copyChannels`` copy of c - doubled
    (CollNet's n + n/2, the Hopper x2, NCCL_MIN_NCHANNELS), which keeps its source's tree."""
    while c >= doubled:
        c -= doubled
    return int(c >= doubled // 2) if doubled > 1 else 0


def graph_chains(log: NcclLog, node_of: list[int], nnodes: int):
    """From the GRAPH lines, when every node printed its tree search: (per node its pattern, and a function giving
    the nodes' chains of a channel: graph channel c mod the graph's count, GPU/r entries in order).  Else None."""
    graphs = []
    members = _members(node_of, nnodes)
    for node in range(nnodes):
        hosts = {log.host_of.get(r) for r in members[node]}
        found = [log.tree_graphs[h] for h in sorted(hosts, key=str) if h in log.tree_graphs]
        if not found or not found[0][1]:
            return None
        pattern, lines = found[0]
        # GPU/r tokens in order; a graph line that is not the node's ranks (a cut or foreign line) is not used
        gpus = [[int(tok[4:]) for tok in line if tok.startswith("GPU/") and tok[4:].isdigit()] for line in lines]
        if any(sorted(g) != members[node] for g in gpus):
            return None
        graphs.append((pattern, gpus))
    patterns = [TREE_PATTERNS[p] for p, _ in graphs]

    def chains(c: int) -> list[list[int]]:
        return [list(gpus[c % len(gpus)]) for _, gpus in graphs]
    return patterns, chains


def derive(log: NcclLog, node_of: list[int], pattern: str | None, graph=None) -> dict:
    """{doubled: {channel: {rank: (up, down)}}} for every channel count the Postset doubling could have made.
    Chains from the log's own intra-node links with one ``pattern``, or, given ``graph`` (``graph_chains``), the
    chains and per-node patterns of the GRAPH lines."""
    channels = sorted(log.trees)
    nnodes = max(node_of) + 1
    both = {}
    for c in channels:
        if graph is not None:
            chains, how = graph[1](c), graph[0]
        else:
            chains, how = node_chains(log.trees[c], node_of, nnodes), pattern
        both[c] = [{r: (node.up, list(node.down)) for r, node in t.items()} for t in connect_trees(chains, how)]
    layouts = range(2, len(channels) + 1, 2) if len(channels) > 1 else [1]
    return {d: {c: both[c][tree_index(i, d)] for i, c in enumerate(channels)} for d in layouts}


def compare(log: NcclLog, derived: dict, node_of: list[int]) -> dict:
    total = matched = links = links_ok = 0
    mismatches = []
    for c, tree in sorted(log.trees.items()):
        for r, (up, downs) in sorted(tree.items()):
            total += 1
            got = derived[c].get(r)
            if got == (up, downs):
                matched += 1
            else:
                mismatches.append({"channel": c, "rank": r, "log": _fmt(r, up, downs), "derived": _fmt(r, *got) if got
                                   else "missing"})
            for peer in [up, *downs]:
                if peer != -1 and node_of[peer] != node_of[r]:
                    links += 1
                    links_ok += got is not None and (peer == got[0] or peer in got[1])
    return {"entries": total, "matched": matched, "inter_links": links, "inter_matched": links_ok,
            "mismatches": mismatches}


def entry(rank: int, up: int, downs: list) -> str:
    """One ``Trees`` entry as NCCL prints it: ``d0/d1/d2->rank->up``."""
    return _fmt(rank, up, downs)


def _fmt(rank: int, up: int, downs: list) -> str:
    d = list(downs) + [-1] * (3 - len(downs))
    return f"{d[0]}/{d[1]}/{d[2]}->{rank}->{up}"


def replay(text: str, comm: str | None = None) -> dict:
    """``comm``: which communicator of a log that has several (default: the largest)."""
    return replay_log(parse(text, comm))


def replay_file(path: str, comm: str | None = None) -> dict:
    """``replay`` of a log file, streamed (``nccl_log.parse_file``); ``LogError`` when it is not an NCCL log."""
    log = parse_file(path, comm)
    if not is_nccl_log(log):
        raise LogError("not an NCCL log: fewer than two lines of NCCL's 'host:pid:tid [dev] NCCL INFO ...' form "
                       "(NCCL writes them with NCCL_DEBUG=INFO)")
    return replay_log(log)


def replay_log(log: NcclLog) -> dict:
    """The replay of a parsed log (its ranks already checked against the communicator by ``nccl_log``)."""
    if not log.trees:
        raise LogError("no 'Trees [c] ...' lines in the log (run NCCL with NCCL_DEBUG=INFO)")
    results = {}
    named = max(max(r, up, *downs) for t in log.trees.values() for r, (up, downs) in t.items()) + 1
    node_of = nodes_of(log, max(log.nranks, named))
    graph = graph_chains(log, node_of, max(node_of) + 1)
    for pattern in ([None] if graph is not None else PATTERNS):
        for doubled, derived in derive(log, node_of, pattern, graph).items():
            results[(pattern, doubled)] = (compare(log, derived, node_of), derived)
    # most entries matched; then NCCL's default pattern; then the fewest copied channels
    best = max(results, key=lambda k: (results[k][0]["matched"], k[0] == "BALANCED_TREE", k[1]))
    report, derived = results[best]
    if graph is not None:
        per_pattern = {"GRAPH": report["matched"]}
        pattern = "from GRAPH lines: " + ", ".join(f"node {n} {p}" for n, p in enumerate(graph[0]))
    else:
        per_pattern = {p: max(results[k][0]["matched"] for k in results if k[0] == p) for p in PATTERNS}
        pattern = best[0]
    present = {r for tree in log.trees.values() for r in tree}
    # per pattern (or "GRAPH"), the channel counts after doubling whose trees equal every entry of the log
    fits: dict = {}
    for (p, doubled), (rep, _) in sorted(results.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
        fits.setdefault("GRAPH" if p is None else p, [])
        if rep["matched"] == rep["entries"]:
            fits["GRAPH" if p is None else p].append(doubled)
    return {"pattern": pattern, "source": "GRAPH" if graph is not None else "Trees", "doubled": best[1],
            "fits": fits,
            "nranks": log.nranks, "nnodes": max(node_of) + 1, "channels": len(log.trees), **report,
            "patterns": per_pattern, "derived": {c: {r: v for r, v in t.items() if r in present}
                                                 for c, t in derived.items()},
            "missing_ranks": [r for r in range(len(node_of)) if r not in present], "comm": log.comm,
            "communicators": log.communicators}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m collectives.graph.replay", description=__doc__.split("\n")[0])
    p.add_argument("log")
    p.add_argument("--json", help="write the report as JSON")
    p.add_argument("--comm", help="the communicator to replay (commId, N-ranks#k or index; default: the largest)")
    a = p.parse_args(argv)
    try:
        rep = replay_file(a.log, a.comm)
    except (LogError, OSError) as exc:
        msg = f"{exc.strerror}" if isinstance(exc, OSError) and exc.strerror else str(exc)
        print(f"{a.log}: {msg}", file=sys.stderr)
        return 2
    if len(rep["communicators"]) > 1:
        listed = ", ".join(f"{c['id']} ({c['nranks']} ranks)" for c in rep["communicators"])
        print(f"# {len(rep['communicators'])} communicators in the log: {listed}; replaying {rep['comm']}"
              f"{'' if a.comm else ' (the largest; choose with --comm)'}")
    if rep["missing_ranks"]:
        print(f"# ranks not in the log: {ranges(rep['missing_ranks'], ', ')} (replaying the entries present)")
    copies = rep["channels"] - rep["doubled"]
    print(f"# {a.log}: {rep['nranks']} ranks, {rep['nnodes']} nodes, {rep['channels']} channels ("
          f"{rep['doubled']} after Postset doubling{f', {copies} copied' if copies > 0 else ''}); pattern "
          f"{rep['pattern']} (entries matched per pattern: {rep['patterns']})")
    for r in sorted(next(iter(rep["derived"].values()))):
        parts = [f"[{c}] {_fmt(r, *rep['derived'][c][r])}" for c in sorted(rep["derived"])]
        print(f"rank {r}: Trees " + " ".join(parts))
    for m in rep["mismatches"]:
        print(f"mismatch channel {m['channel']} rank {m['rank']}: log {m['log']}  derived {m['derived']}")
    print(f"inter-node links matched {rep['inter_matched']} of {rep['inter_links']}")
    print(f"matched {rep['matched']} of {rep['entries']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({k: v for k, v in rep.items() if k != "derived"}, f, indent=1)
    return 0 if rep["matched"] == rep["entries"] else 1


if __name__ == "__main__":
    sys.exit(main())
