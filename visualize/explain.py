"""``python -m tracing explain LOG [-o DIR]`` (the same as ``python -m visualize explain LOG -o DIR``): a real
NCCL INFO log as a short report plus its diagrams, in one folder.

The report is ``tracing.log_facts``'s (version, ranks, nodes, GPUs per node, channels and rings, the transport of
every edge, TUNING choices, anything unusual) with the trees checked by ``collectives.graph.replay`` (NCCL's
``ncclGetDtree`` / ``connectTrees`` rebuilt: ``matched N of M``) and the rings and trees drawn as in
``visualize log``.  This module lives here, above ``tracing`` and ``collectives``, because it needs both; the
``tracing`` command line only forwards to it (see ``tracing/__main__.py``).
"""
from __future__ import annotations

import os

from collectives.graph.replay import nodes_of, replay_log
from tracing import log_facts as facts_of
from tracing.nccl_log import LogError

from . import diagrams


MAX_DRAWN_RANKS = 1024    # Graphviz lays out a few hundred ranks; past this the report says so instead


def read_log(path: str) -> facts_of.LogFacts:
    """The log's facts, the file streamed (``tracing.log_facts.read_file``: the text is never held); ``LogError``
    when it is not an NCCL log (NCCL's line grammar, ``nccl_log.is_nccl_log``) or holds none of the lines
    explained."""
    facts = facts_of.read_file(path)
    if not facts_of.is_log(facts.log):
        raise LogError(f"{path}: not an NCCL INFO log: fewer than two lines of NCCL's 'host:pid:tid [dev] NCCL "
                       f"INFO ...' form (NCCL writes them with NCCL_DEBUG=INFO)")
    if not facts_of.is_nccl_log(facts):
        raise LogError(f"{path}: not an NCCL INFO log we can explain: no 'comm ... nRanks', 'Channel', 'Trees' or "
                       f"'via' line (NCCL writes them with NCCL_DEBUG=INFO)")
    return facts


def _replay(facts: facts_of.LogFacts) -> tuple[dict | None, str]:
    try:
        rep = replay_log(facts.log)
    except LogError as exc:
        return None, f"trees: not checked by replay ({exc})"
    copies = rep["channels"] - rep["doubled"]
    return rep, (f"trees: matched {rep['matched']} of {rep['entries']} entries by replay (inter-node links "
                 f"{rep['inter_matched']} of {rep['inter_links']}); {rep['channels']} channels = {rep['doubled']} "
                 f"after Postset doubling{f' + {copies} copied' if copies > 0 else ''}, pattern {rep['pattern']}")


def sources(facts: facts_of.LogFacts, name: str, title: str = "", max_channels: int = 8, max_rings: int = 4,
            replayed: dict | None = None) -> dict:
    """The DOT sources of the log's rings (topology) and trees, those it has: {"rings": ..., "trees": ...}."""
    log = facts.log
    n = facts_of.nranks(facts)
    if n == 0 or n > MAX_DRAWN_RANKS:
        return {}
    node_of = nodes_of(log, n)
    first: dict[int, int] = {}
    for r, k in enumerate(node_of):
        first.setdefault(k, r)
    hosts = [log.host_of.get(first[k], "?") for k in range(max(node_of) + 1)] if log.host_of else None
    hosts_by_rank = [hosts[node_of[r]] for r in range(n)] if hosts else None
    out = {}
    if log.rings:
        rings = [log.rings[c] for c in sorted(log.rings)]
        out["rings"] = diagrams.topology(n, node_of, rings, log.transports, hosts_by_rank,
                                         title or f"rings from {name}", max_channels)
    if log.trees:
        if replayed is None:
            replayed, _ = _replay(facts)
        nch = max(log.trees) + 1
        roles = diagrams.channel_roles(nch, replayed["doubled"] if replayed else None)
        tree_list = [log.trees.get(c, {}) for c in range(nch)]
        out["trees"] = diagrams.trees(tree_list, n, title or f"trees from {name}", node_of, roles, log.transports,
                                      max_rings)
    return out


def draw(facts: facts_of.LogFacts, rings_out: str, trees_out: str, name: str, title: str = "",
         max_channels: int = 8, max_rings: int = 4, replayed: dict | None = None) -> list[str]:
    """Rings (topology) and trees of the log; returns the files written."""
    src = sources(facts, name, title, max_channels, max_rings, replayed)
    out = []
    for kind, path in (("rings", rings_out), ("trees", trees_out)):
        if kind in src:
            out += diagrams.render(src[kind], path)
    return out


def explain(path: str, out_dir: str | None = None) -> list[str]:
    """Write ``report.txt``, ``rings.*`` and ``trees.*`` into ``out_dir`` (default: ``NAME-explained`` in the
    current directory, NAME the log's file name without extension); returns the report's lines, then the report."""
    facts = read_log(path)
    name = os.path.basename(path)
    out_dir = out_dir or os.path.splitext(name)[0] + "-explained"
    n = facts_of.nranks(facts)
    lines = facts_of.report(facts, name, nodes_of(facts.log, n) if n else [])
    rep, line = _replay(facts) if facts.log.trees else (None, "trees: no 'Trees [c] ...' lines in the log")
    lines.append(line)
    odd = facts_of.unusual(facts)
    if rep and rep["matched"] < rep["entries"]:
        m = rep["mismatches"][0]
        odd.append(f"{rep['entries'] - rep['matched']} tree entries differ from NCCL's construction (first: "
                   f"channel {m['channel']} rank {m['rank']}: log {m['log']}, rebuilt {m['derived']})")
    lines += ["unusual: " + ("nothing" if not odd else "")] + [f"  {u}" for u in odd]
    os.makedirs(out_dir, exist_ok=True)
    files = draw(facts, os.path.join(out_dir, "rings"), os.path.join(out_dir, "trees"), name, replayed=rep)
    lines.append("diagrams: " + (", ".join(os.path.basename(f) for f in files) if files else
                                 f"none ({n} ranks: more than {MAX_DRAWN_RANKS} to draw)" if n > MAX_DRAWN_RANKS
                                 else "none"))
    report = os.path.join(out_dir, "report.txt")
    with open(report, "w") as f:
        f.write("\n".join(lines) + "\n")
    return lines + [report]
