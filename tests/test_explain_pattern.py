"""``python -m tracing explain LOG``: the tree pattern, crossNic and channel count a log's own lines imply, and how
it knows (GRAPH ``Pattern`` lines; else which pattern's rebuilt trees equal the ``Trees`` lines; the ``Channel``
rings), plus ``--topo XML`` running the multi-node search for the log's shape.  Real logs where they exist,
small synthetic logs for what they do not show."""
import functools
import re
import subprocess
import sys

import pytest

from collectives.graph.init_cluster import cluster_log, run_cluster
from collectives.graph.topo import PATH_TYPES
from collectives.graph.topo_xml import StandIns
from collectives.graph.trees import connect_trees, trees_log_line
from conftest import FIXTURES, ROOT
from visualize.explain import explain

H100 = ROOT / "tests" / "data" / "nccl_tests_319_2x8_h100_trees.log"
LOGS = FIXTURES / "nccl_logs"
NDV5 = ROOT / "topologies" / "azure-ndv5-topo.xml"


def report(tmp_path, path, **kw) -> str:
    explain(str(path), str(tmp_path / "out"), **kw)
    return (tmp_path / "out" / "report.txt").read_text()


def ring_from_0(order: list[int]) -> list[int]:
    i = order.index(0)
    return order[i:] + order[:i]


def synthetic(nodes: int, per: int, chains: list[list[list[int]]], pattern: str = "TREE",
              rings: list[list[int]] | None = None, head: list[str] = ()) -> str:
    """A log of ``nodes`` x ``per`` ranks: ``chains[c][node]`` the tree search's chain of search channel c, doubled
    by Postset (tree 0 on c, tree 1 on c + n); rank 0's rings when given; ``head``: lines every host prints first."""
    n = len(chains)
    trees = [connect_trees(chains[c], pattern)[0] for c in range(n)] + \
            [connect_trees(chains[c], pattern)[1] for c in range(n)]
    out = []
    for k in range(nodes):
        out += [f"host{k}:{1000 + k * per}:1 [0] NCCL INFO {line}" for line in head]
    for r in range(nodes * per):
        k = r // per
        pre = f"host{k}:{1000 + r}:1 [{r % per}] NCCL INFO "  # one process per rank
        out.append(pre + f"comm 0x{r + 1:x} rank {r} nRanks {nodes * per} nNodes {nodes} localRanks {per} "
                         f"localRank {r % per} MNNVL 0")
        out.append(pre + trees_log_line(r, trees))
    for c, ring in enumerate(rings or []):
        out.append(f"host0:1000:1 [0] NCCL INFO Channel {c:02d}/{len(rings):02d} : " + " ".join(map(str, ring)))
    return "\n".join(out) + "\n"


FOUR_BY_TWO = [[[2 * k, 2 * k + 1] for k in range(4)], [[2 * k + 1, 2 * k] for k in range(4)]]


def test_2x8_h100_says_the_trees_cannot_tell_balanced_from_tree(tmp_path):
    """On two nodes each tree has one inter-node edge, attached at child1Index 0 by both BALANCED_TREE and TREE:
    the Trees lines cannot tell them apart, and explain says so, with the NVLS hint of sm90 and the crossNic-2
    swap that the Channel lines show (node 1's segments are node 0's of the paired channel)."""
    rep = report(tmp_path, H100)
    line = next(x for x in rep.splitlines() if x.startswith("tree pattern:"))
    assert "BALANCED_TREE or TREE" in line and "cannot tell" in line and "SPLIT_TREE 208" in line
    assert "pattern BALANCED_TREE" not in rep
    sm = next(x for x in rep.splitlines() if x.startswith("sm90 fallback:"))
    assert "NVLS Head" in sm and "sm90" in sm and "cannot show" in sm
    cross = next(x for x in rep.splitlines() if x.startswith("crossNic:"))
    assert "ring 2" in cross and "swap" in cross and "ncclTopoPostset" in cross
    assert "search channels: 8, 16 after ncclTopoPostset's doubling" in rep


def test_graph_pattern_3_lines_name_the_pattern(tmp_path):
    head = ["Pattern 4, crossNic 0, nChannels 2, bw 24.000000/24.000000, type NVL/PXN, sameChannels 0",
            " 0 : NET/0 GPU/0 GPU/1 NET/0",
            "Pattern 3, crossNic 0, nChannels 2, bw 48.000000/24.000000, type NVL/PIX, sameChannels 0"]
    text = synthetic(4, 2, FOUR_BY_TWO, "TREE")
    lines = text.splitlines()
    # every host prints its own GRAPH lines (its ranks): the tree search's chains per channel
    graph = []
    for k in range(4):
        graph += [f"host{k}:{1000 + 2 * k}:1 [0] NCCL INFO {h}" for h in head]
        graph += [f"host{k}:{1000 + 2 * k}:1 [0] NCCL INFO  {c} : NET/0 " + " ".join(f"GPU/{r}" for r in
                                                                               FOUR_BY_TWO[c][k]) + " NET/0"
                  for c in range(2)]
    path = tmp_path / "graph.log"
    path.write_text("\n".join(graph + lines) + "\n")
    rep = report(tmp_path, path)
    assert "tree pattern: TREE (from the GRAPH lines: Pattern 3, crossNic 0, nChannels 2" in rep
    assert "ring crossNic 0 (GRAPH Pattern 4 line)" in rep
    assert "search channels: 2 (GRAPH Pattern lines), 4 after ncclTopoPostset's doubling" in rep


def test_tree_where_balanced_does_not_fit_shows_the_sm90_fallback(tmp_path):
    path = tmp_path / "tree.log"
    path.write_text(synthetic(4, 2, FOUR_BY_TWO, "TREE"))
    rep = report(tmp_path, path)
    assert "tree pattern: TREE (the only pattern whose trees equal the log's" in rep
    assert "src/graph/search.cc ncclTopoCompute" in rep
    assert next(x for x in rep.splitlines() if x.startswith("sm90 fallback:")).startswith("sm90 fallback: shows")
    balanced = tmp_path / "balanced.log"
    balanced.write_text(synthetic(4, 2, FOUR_BY_TWO, "BALANCED_TREE"))
    rep = report(tmp_path, balanced)
    assert "tree pattern: BALANCED_TREE (the only pattern" in rep
    assert "sm90 fallback: does not show" in rep


def test_one_node_log_cannot_tell_the_patterns_apart(tmp_path):
    path = tmp_path / "one.log"
    path.write_text(synthetic(1, 3, [[[0, 1, 2]], [[0, 1, 2]]], "BALANCED_TREE"))
    rep = report(tmp_path, path)
    line = next(x for x in rep.splitlines() if x.startswith("tree pattern:"))
    assert "cannot tell" in line and "one node" in line
    assert "crossNic: one node" in rep


@pytest.mark.parametrize("swap", [True, False])
def test_cross_nic_2_swap(tmp_path, swap):
    """2 nodes x 2: search rings [0 1 | 2 3] and [1 0 | 3 2]; with crossNic 2 node 1 swaps channels 0 and 1."""
    node1 = [[3, 2], [2, 3]] if swap else [[2, 3], [3, 2]]
    rings = [ring_from_0([0, 1] + node1[0]), ring_from_0([1, 0] + node1[1])]
    chains = [[[0, 1], [2, 3]], [[1, 0], [3, 2]]]
    path = tmp_path / "x.log"
    path.write_text(synthetic(2, 2, chains, "TREE", rings + rings))
    rep = report(tmp_path, path)
    cross = next(x for x in rep.splitlines() if x.startswith("crossNic:"))
    assert ("ring 2" in cross and "swap" in cross) if swap else ("no swap" in cross and "0 or 1" in cross)
    assert "search channels: 2, 4 after ncclTopoPostset's doubling" in rep


def test_real_fixture_logs(tmp_path):
    if not LOGS.exists():
        pytest.skip("shared fixtures not present")
    p40 = report(tmp_path, LOGS / "rdmatutorial_3x1_p40_graph.log")
    assert "tree pattern: TREE (from the GRAPH lines: Pattern 3, crossNic 0, nChannels 1" in p40
    assert "one GPU per node" in p40
    a100 = report(tmp_path, LOGS / "trainingoneks_1x4_a100_p4d.log")
    assert "cannot tell" in next(x for x in a100.splitlines() if x.startswith("tree pattern:"))
    assert re.search(r"search channels: the log cannot tell", a100)


@functools.lru_cache(maxsize=None)
def _cluster_log() -> str:
    """Our 2 x 2 search of the NDv5 file (sm90) written as a log with host:pid:tid prefixes (a few seconds)."""
    r = run_cluster(str(NDV5), 2, 2, StandIns(sm=90))
    return "\n".join(re.sub(r"^node(\d+) \[(\d+)\]", lambda m: f"node{m[1]}:{100 * int(m[1]) + int(m[2])}:1 [{m[2]}]",
                            line) for line in cluster_log(r)) + "\n"


def test_topo_runs_the_search_and_reports_what_it_reproduces(tmp_path):
    path = tmp_path / "ours.log"
    path.write_text(_cluster_log())
    rep = report(tmp_path, path, topo=str(NDV5), sm=90)
    assert re.search(r"search \(--topo azure-ndv5-topo.xml, 2 nodes x 2 GPUs, sm 90\): tree pattern TREE", rep)
    assert re.search(r"reproduces 8 of 8 Channel lines and (\d+) of \1 Trees entries", rep)
    text = _cluster_log()
    first = next(x for x in text.splitlines() if "NCCL INFO Trees [0]" in x)   # rank 0's
    bad = tmp_path / "bad.log"
    bad.write_text(text.replace(first, first.replace(first.split("Trees [0] ")[1].split()[0],
                                                                  "-1/-1/-1->0->1", 1)))
    rep = report(tmp_path, bad, topo=str(NDV5), sm=90)
    m = re.search(r"reproduces 8 of 8 Channel lines and (\d+) of (\d+) Trees entries", rep)
    assert m and int(m.group(1)) == int(m.group(2)) - 1
    assert "first differences: Trees [0] rank 0: log -1/-1/-1->0->1" in rep


def test_topo_without_sm_asks_for_it(tmp_path):
    path = tmp_path / "ours.log"
    path.write_text(synthetic(2, 2, [[[0, 1], [2, 3]]], "TREE"))
    rep = report(tmp_path, path, topo=str(NDV5))
    assert "--sm" in next(x for x in rep.splitlines() if x.startswith("search (--topo"))


def test_sm_given_below_90_rules_out_the_fallback(tmp_path):
    rep = report(tmp_path, H100, sm=80)
    assert "sm90 fallback: none below sm90, so of the patterns that fit, BALANCED_TREE" in rep


def test_command_line_topo_and_sm(tmp_path):
    path = tmp_path / "ours.log"
    path.write_text(_cluster_log())
    proc = subprocess.run([sys.executable, "-m", "tracing", "explain", str(path), "-o", str(tmp_path / "o"),
                           "--topo", str(NDV5), "--sm", "90"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "reproduces 8 of 8 Channel lines" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "tracing", "csv", str(tmp_path), "--sm", "90"],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 2 and "explain's options" in proc.stderr


def test_topo_search_is_bounded_by_the_node_count(tmp_path, monkeypatch):
    import visualize.explain as ex
    monkeypatch.setattr(ex, "MAX_SEARCH_NODES", 1)
    path = tmp_path / "two.log"
    path.write_text(synthetic(2, 2, [[[0, 1], [2, 3]]], "TREE"))
    rep = report(tmp_path, path, topo=str(NDV5), sm=90)
    assert "not run: 2 nodes, more than 1 searches" in rep


# --- python -m collectives.tools.topology XML --nodes K --explain: the multi-node search's own record ---------

ATTEMPT = re.compile(r"# search: Id (\d) Pattern (\d), crossNic (\d), Bw ([\d.]+)/([\d.]+), type (\w+)/(\w+),")


@functools.lru_cache(maxsize=None)
def explained():
    from collectives.tools.topology import explain_cluster
    r = run_cluster(str(NDV5), 2, 2, StandIns(sm=90))
    return r, explain_cluster(r)


def test_cluster_explain_records_each_attempt_and_the_step_after_it():
    """Every attempt is followed by what ncclTopoCompute did next; each relaxation named is the change the next
    attempt shows (typeInter, crossNic, speed, the sm90 BALANCED_TREE -> TREE retry)."""
    r, lines = explained()
    search = [x for x in lines if x.startswith("# search: ")][1:]
    attempts = [(i, ATTEMPT.match(x)) for i, x in enumerate(search) if ATTEMPT.match(x)]
    assert len(attempts) > 20
    for (i, a), (j, b) in zip(attempts, attempts[1:]):
        steps = search[i + 1:j]
        assert steps and all(x.startswith(("# search:   -> ", "# search: Dup:")) for x in steps)
        said = " ".join(steps)
        if PATH_TYPES.index(b.group(6)) == PATH_TYPES.index(a.group(6)) + 1 and a.group(1) == b.group(1):
            assert f"typeInter {a.group(6)} -> {b.group(6)}" in said
        if a.group(3) == "0" and b.group(3) == "2":
            assert "crossNic 2: NCCL_CROSS_NIC=2" in said
        if a.group(2) == "1" and b.group(2) == "3":
            assert "on sm 90 >= 90 a BALANCED_TREE attempt is retried as TREE" in said
        if a.group(1) == b.group(1) and float(b.group(4)) < float(a.group(4)):
            assert f"speed {a.group(4)} -> {b.group(4)} GB/s" in said
    # the start: the speed array the multi-node search uses on sm 90
    assert "speedArrayInter for sm 90 (48 45 42 40 30 24" in search[0]


def test_cluster_explain_result_lines_are_the_graphs():
    """Each graph's closing ``result`` line names the searched graph's channels, pattern and crossNic, and the
    typeInter PXN step comes before any attempt that allows PXN paths."""
    r, lines = explained()
    results = [x for x in lines if "-> result:" in x]
    for graph, line in zip((r.rings[0], r.trees[0]), results):
        assert f"result: {graph.n_channels} x " in line and f"pattern {graph.pattern}, crossNic {graph.cross_nic}:" \
            in line
    first_pxn = next(i for i, x in enumerate(lines) if ATTEMPT.match(x) and ATTEMPT.match(x).group(6) == "PXN")
    assert any("typeInter P2C -> PXN" in x for x in lines[:first_pxn])


def test_cluster_explain_says_why_pxn_and_who_uses_it():
    """The PXN routes ncclTopoComputePaths made (each: GPU, NIC, relay rank, why) cover every proxied send in the
    ranks' connection lines."""
    from collectives.graph.init_cluster import cluster_connections
    r, lines = explained()
    routes = [x for x in lines if x.startswith("# pxn: GPU rank")]
    assert routes and all("the NIC's own GPU" in x for x in routes)
    for line in cluster_connections(r)[0] + cluster_connections(r)[1]:
        m = re.search(r": (\d+)\[\d+\] -> \d+\[\d+\] \[send\] via NET/IB/(\d+)\((\d+)\)", line)
        if m:
            assert f"# pxn: GPU rank {m.group(1)} -> NET/{m.group(2)}: PXN through rank {m.group(3)}," in \
                " ".join(routes) + " "
    assert any(x.startswith("# pxn: used by ") for x in lines)


def test_cluster_explain_on_the_cli(capsys):
    from collectives.tools.topology import main
    assert main([str(NDV5), "--sm", "90", "--nodes", "2", "--nranks", "2", "--explain"]) == 0
    out = capsys.readouterr().out
    assert "# search: node 0 (2 identical nodes" in out and "# pxn: used by" in out
