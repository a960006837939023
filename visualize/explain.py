"""``python -m tracing explain LOG [-o DIR]`` (the same as ``python -m visualize explain LOG -o DIR``): a real
NCCL INFO log as a short report plus its diagrams, in one folder.

The report is ``tracing.log_facts``'s (version, ranks, nodes, GPUs per node, channels and rings, the transport of
every edge, TUNING choices, anything unusual) with the trees checked by ``collectives.graph.replay`` (NCCL's
``ncclGetDtree`` / ``connectTrees`` rebuilt: ``matched N of M``) and the rings and trees drawn as in
``visualize log``.  Then what the log's own lines imply of the topology search (``pattern_lines``): the tree
pattern (GRAPH ``Pattern`` lines, else which of BALANCED_TREE / SPLIT_TREE / TREE rebuilds the ``Trees`` lines,
NCCL's ``ncclTopoPreset`` / ``connectTrees``), whether ``ncclTopoCompute``'s sm90 fallback to TREE shows, the
crossNic (and ``ncclTopoPostset``'s crossNic-2 ring exchange), and the search's channel count; with ``--topo XML``
(``search_lines``) the multi-node search of ``collectives.graph.init_cluster`` runs for the log's nodes and GPUs
per node, and the report says which of the log's Channel and Trees lines it reproduces.  This module lives here,
above ``tracing`` and ``collectives``, because it needs both; the ``tracing`` command line only forwards to it (see
``tracing/__main__.py``).
"""
from __future__ import annotations

import os

from collectives.graph.init_cluster import run_cluster
from collectives.graph.replay import entry, nodes_of, replay_log
from collectives.graph.search import PATTERN_NAMES
from collectives.graph.topo_xml import StandIns, TopoError
from collectives.graph.trees import PATTERNS
from tracing import log_facts as facts_of
from tracing.debug import ranges
from tracing.nccl_log import TREE_PATTERNS, LogError, NcclLog

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
                 f"after Postset doubling{f' + {copies} copied' if copies > 0 else ''}")


MAX_DIFFS = 3      # differences listed per kind when the search's lines differ from the log's
MAX_SEARCH_NODES = 64    # run_cluster searches once per node (about a second to tens of seconds each for 8 GPUs)
FALLBACK = "NCCL's sm90 fallback from BALANCED_TREE, src/graph/search.cc ncclTopoCompute"


def _graph_heads(log: NcclLog) -> tuple[list, list]:
    """Per host the first ring (Pattern 4) and tree (Pattern 1-3) GRAPH line: ([(host, crossNic, nChannels)],
    [(host, pattern, crossNic, nChannels)]) (``ncclTopoPrintGraph``'s head line)."""
    rings, trees = [], []
    for host, heads in sorted(log.graph_heads.items(), key=lambda kv: str(kv[0])):
        ring = next((h for h in heads if h[0] == 4), None)
        tree = next((h for h in heads if h[0] in TREE_PATTERNS), None)
        if ring:
            rings.append((host, ring[1], ring[2]))
        if tree:
            trees.append((host, *tree))
    return rings, trees


def _one(values: list) -> str:
    return str(values[0]) if len(set(values)) == 1 else "/".join(map(str, values)) + " (per host)"


def _tree_pattern(facts: facts_of.LogFacts, rep: dict | None, node_of: list[int]) -> tuple[str | None, str]:
    """(the pattern the log implies, or None when it cannot tell; the report line)."""
    log = facts.log
    nnodes = max(node_of) + 1 if node_of else 0
    one_gpu = bool(log.local_ranks) and set(log.local_ranks.values()) == {1}
    _, trees = _graph_heads(log)
    gpu_note = "; one GPU per node: ncclTopoCompute searches TREE whatever it was asked (src/graph/search.cc)" \
        if one_gpu else ""
    if trees:
        names = [TREE_PATTERNS[p] for _, p, _, _ in trees]
        agree = f"; the Trees lines agree (replay matched {rep['matched']} of {rep['entries']})" if rep and \
            rep["matched"] == rep["entries"] else ""
        return (names[0] if len(set(names)) == 1 else None,
                f"tree pattern: {_one(names)} (from the GRAPH lines: Pattern {_one([p for _, p, _, _ in trees])}, "
                f"crossNic {_one([x for _, _, x, _ in trees])}, nChannels {_one([c for _, _, _, c in trees])} on "
                f"{'every host' if len(trees) > 1 else 'its one host'}{agree}){gpu_note}")
    if rep is None:
        return None, "tree pattern: the log cannot tell (no GRAPH 'Pattern' line and no Trees lines replayed)"
    fitting = [p for p in PATTERNS if rep["fits"].get(p)]
    counts = "; ".join(f"{p} {rep['patterns'][p]}" for p in PATTERNS if p not in fitting)
    if nnodes <= 1 or one_gpu:
        why = ("one node: the pattern only picks the ranks that link nodes, and a one-node log has none" if
               nnodes <= 1 else "one GPU per node: every pattern attaches the node's one rank")
        return None, (f"tree pattern: the log cannot tell ({why}; every pattern rebuilds its {rep['entries']} "
                      f"entries; no GRAPH 'Pattern' line){gpu_note}")
    if len(fitting) == 1:
        p = fitting[0]
        why = {"TREE": FALLBACK, "BALANCED_TREE": "NCCL's default tree pattern (ncclTopoCompute)"}.get(p, "")
        return p, (f"tree pattern: {p} (the only pattern whose trees equal the log's{': ' + why if why else ''}; "
                   f"{counts} of {rep['entries']} entries)")
    if not fitting:
        return None, (f"tree pattern: the log cannot tell: no pattern rebuilds every entry ({counts} of "
                      f"{rep['entries']})")
    two = " (on 2 nodes each tree's one inter-node link attaches at child1Index, 0 in both)" if \
        nnodes == 2 and set(fitting) == {"BALANCED_TREE", "TREE"} else ""
    return None, (f"tree pattern: {' or '.join(fitting)}: the Trees lines cannot tell them apart, each rebuilds "
                  f"all {rep['entries']} entries{two}{'; ' + counts if counts else ''}; no GRAPH 'Pattern' line")


def _sm90(facts: facts_of.LogFacts, pattern: str | None, node_of: list[int], sm: int | None) -> str:
    log = facts.log
    nnodes = max(node_of) + 1 if node_of else 0
    hints = facts.sm90_hints
    cc = "; ".join(([f"sm{sm} (given with --sm)"] if sm is not None else []) + (
        [f"the log's {' and '.join(hints)} mean sm90 or later (NCCL's search builds NVLS channels only there, "
         f"src/graph/search.cc)"] if hints else [])) or "no compute capability in the log (NCCL's INFO lines do " \
        "not print it)"
    if log.local_ranks and set(log.local_ranks.values()) == {1}:
        return f"sm90 fallback: does not apply: one GPU per node searches TREE anyway; {cc}"
    if nnodes <= 1:
        return f"sm90 fallback: a one-node log cannot show it (the pattern changes only inter-node links); {cc}"
    if pattern == "TREE":
        return (f"sm90 fallback: shows: TREE where BALANCED_TREE is NCCL's default; ncclTopoCompute tries TREE on "
                f"sm90 or later when the balanced search falls short (or NCCL_GRAPH_FILE gave it); {cc}")
    if pattern is not None:
        return f"sm90 fallback: does not show: the tree graph is {pattern}; {cc}"
    if sm is not None and sm < 90:
        return (f"sm90 fallback: none below sm90, so of the patterns that fit, BALANCED_TREE (ncclTopoCompute "
                f"tries TREE only from sm90); {cc}")
    return (f"sm90 fallback: the Trees lines cannot show it (BALANCED_TREE and TREE give these same trees); {cc}; "
            f"there ncclTopoCompute falls back from BALANCED_TREE to TREE when the balanced search falls short: "
            f"--topo XML runs that search")


def _cross_nic(facts: facts_of.LogFacts, node_of: list[int]) -> str:
    log = facts.log
    if not node_of or max(node_of) == 0:
        return "crossNic: one node: no network in the graphs, and no odd node to exchange rings"
    rings, trees = _graph_heads(log)
    verdict, why = facts_of.cross_nic_swap(log, node_of)
    parts = []
    if rings:
        parts.append(f"ring crossNic {_one([x for _, x, _ in rings])} (GRAPH Pattern 4 line)")
    if verdict == "swap":
        parts.append(f"ring 2: the crossNic-2 swap of ncclTopoPostset (src/graph/connect.cc) shows: {why}")
    elif verdict == "no swap":
        parts.append(f"ring 0 or 1: no swap ({why}); the Channel lines cannot tell 0 from 1")
    elif not rings:
        parts.append(f"ring: the log cannot tell ({why})")
    parts.append(f"tree crossNic {_one([x for _, _, x, _ in trees])} (GRAPH Pattern {_one([p for _, p, _, _ in trees])}"
                 f" line)" if trees else "tree: not in the log (no GRAPH 'Pattern' line)")
    return "crossNic: " + "; ".join(parts)


def _channels(facts: facts_of.LogFacts, rep: dict | None) -> str:
    log = facts.log
    total = log.ring_total or len(log.rings) or len(log.trees)
    rings, trees = _graph_heads(log)
    coll = sorted(set(facts.coll_channels.values()))
    tail = f"; 'coll channels' lines: {ranges(coll)}" if coll and coll != [total] else ""

    def layout(n: int) -> str:
        extra = (f", {total} in the log: {total - 2 * n} copied (copyChannels: CollNet, the sm90 x2, "
                 f"NCCL_MIN_NCHANNELS)" if total > 2 * n else
                 f", {total} in the log (NCCL_MAX_NCHANNELS or maxCTAs cut the rest)" if total < 2 * n else "")
        return f"{n}, {2 * n} after ncclTopoPostset's doubling{extra}"
    if rings or trees:
        n = min([c for _, _, c in rings] + [c for _, _, _, c in trees])
        return f"search channels: {layout(n).replace(',', ' (GRAPH Pattern lines),', 1)}{tail}"
    period = facts_of.ring_period(log)
    cands = set(range(1, total + 1))
    how = []
    if period:
        cands &= {n for n in range(period, total // 2 + 1, period)} or {period}
        how.append(f"rank 0's Channel NN/{total:02d} lines repeat every {period}")
    if rep:
        fitted = {max(1, d // 2) for p, ds in rep["fits"].items() for d in ds}
        if fitted:
            cands &= fitted
            how.append(f"the Trees lines fit only tree 1 from channel {min(fitted)}" if len(fitted) == 1 else
                       f"the Trees lines fit {ranges(sorted(fitted))} search channels")
    if len(cands) == 1 and how:
        return f"search channels: {layout(cands.pop())} ({'; '.join(how)}){tail}"
    return (f"search channels: the log cannot tell ({total} channels; {'; '.join(how) or 'no rings or trees'}: "
            f"the search found {ranges(sorted(cands)) if cands else 'no count that fits both'}){tail}")


def pattern_lines(facts: facts_of.LogFacts, rep: dict | None, node_of: list[int], sm: int | None = None
                  ) -> list[str]:
    """What the log implies of NCCL's topology search (``ncclTopoCompute`` in ``src/graph/search.cc``,
    ``ncclTopoPreset`` / ``ncclTopoPostset`` in ``src/graph/connect.cc``): tree pattern, sm90 fallback, crossNic,
    search channels, each saying which lines tell it, or that the log cannot."""
    pattern, line = _tree_pattern(facts, rep, node_of)
    return [line, _sm90(facts, pattern, node_of, sm), _cross_nic(facts, node_of), _channels(facts, rep)]


def search_lines(facts: facts_of.LogFacts, node_of: list[int], topo: str, sm: int | None = None) -> list[str]:
    """``--topo XML``: ``initTransportsRank``'s topology steps (``collectives.graph.init_cluster.run_cluster``) for
    the log's nodes and GPUs per node, and which of the log's Channel and Trees lines they reproduce."""
    log = facts.log
    n = facts_of.nranks(facts)
    nnodes = max(node_of) + 1 if node_of else 0
    head = f"search (--topo {os.path.basename(topo)}"
    sizes = sorted({node_of.count(k) for k in range(nnodes)})
    if not nnodes or len(sizes) != 1 or node_of != [r // sizes[0] for r in range(n)]:
        return [f"{head}): not run: the log's nodes are not {nnodes} alike nodes of consecutive ranks"]
    per = sizes[0]
    if nnodes > MAX_SEARCH_NODES:
        return [f"{head}): not run: {nnodes} nodes, more than {MAX_SEARCH_NODES} searches (one per node) to run"]
    head += (f", {nnodes} node{'s' if nnodes > 1 else ''} x {per} GPU{'s' if per > 1 else ''}"
             + (f", sm {sm}" if sm is not None else ""))
    try:
        r = run_cluster(topo, nnodes, per, StandIns(sm=sm))
    except (TopoError, NotImplementedError, ValueError, OSError) as exc:
        return [f"{head}): not run: {exc}" + ("" if sm is not None or "--sm" in str(exc) else
                                               " (--sm SM gives the GPUs' compute capability)")]
    ch = r.channels[0]
    rings = [order[order.index(0):] + order[:order.index(0)] for order in ch.rings]
    ring_diffs = [f"Channel {c:02d}: log {' '.join(map(str, log.rings[c]))}, search "
                  f"{' '.join(map(str, rings[c])) if c < len(rings) else 'none'}"
                  for c in sorted(log.rings) if c >= len(rings) or rings[c] != log.rings[c]]
    trees = [r.channels[rank].trees() for rank in range(r.nranks)]
    tree_total, tree_diffs = 0, []
    for c, entries in sorted(log.trees.items()):
        for rank, (up, downs) in sorted(entries.items()):
            tree_total += 1
            got = trees[rank][c][rank] if rank < r.nranks and c < len(trees[rank]) else None
            if got is None or (got.up, list(got.down)) != (up, list(downs)):
                tree_diffs.append(f"Trees [{c}] rank {rank}: log {entry(rank, up, downs)}, search "
                                  f"{entry(rank, got.up, list(got.down)) if got else 'none'}")
    ring_g, tree_g = r.aligned
    out = [f"{head}): tree pattern {PATTERN_NAMES[tree_g.pattern]} (Pattern {tree_g.pattern}), crossNic ring "
           f"{ring_g.cross_nic} / tree {tree_g.cross_nic}, {ch.search_channels} search channels, {ch.n} after "
           f"Postset; reproduces {len(log.rings) - len(ring_diffs)} of {len(log.rings)} Channel lines and "
           f"{tree_total - len(tree_diffs)} of {tree_total} Trees entries"
           + (f" (the log has {log.ring_total or len(log.trees)} channels)" if ch.n != (log.ring_total or
                                                                              len(log.trees)) else "")]
    if tree_g.pattern == 3 and per > 1:
        out.append(f"  its TREE is {FALLBACK} (the search asks for BALANCED_TREE first)")
    diffs = ring_diffs[:MAX_DIFFS] + tree_diffs[:MAX_DIFFS]
    if diffs:
        out.append("  first differences: " + "; ".join(diffs))
    return out


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


def explain(path: str, out_dir: str | None = None, topo: str | None = None, sm: int | None = None) -> list[str]:
    """Write ``report.txt``, ``rings.*`` and ``trees.*`` into ``out_dir`` (default: ``NAME-explained`` in the
    current directory, NAME the log's file name without extension); returns the report's lines, then the report.
    ``topo``: a topology XML whose multi-node search is compared with the log (``sm``: its GPUs' compute
    capability where the file does not give it)."""
    facts = read_log(path)
    name = os.path.basename(path)
    out_dir = out_dir or os.path.splitext(name)[0] + "-explained"
    n = facts_of.nranks(facts)
    lines = facts_of.report(facts, name, nodes_of(facts.log, n) if n else [])
    rep, line = _replay(facts) if facts.log.trees else (None, "trees: no 'Trees [c] ...' lines in the log")
    lines.append(line)
    node_of = nodes_of(facts.log, n) if n else []
    lines += pattern_lines(facts, rep, node_of, sm)
    if topo:
        lines += search_lines(facts, node_of, topo, sm)
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
