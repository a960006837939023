"""Double binary trees (``ncclGetBtree`` / ``ncclGetDtree`` in ``src/graph/trees.cc``, ``connectTrees`` in ``src/graph/connect.cc``) and replaying the Trees lines of NCCL INFO logs."""
import math
import subprocess
import sys

import pytest

from collectives.graph.replay import replay
from collectives.graph.trees import connect_trees, get_btree, get_dtree
from workers import Case
from conftest import FIXTURES, ROOT, run_ranks
from tracing.nccl_log import LogError

TABLES = {  # ncclGetDtree's trees: rank -> (T0 up, d0, d1, T1 up, d0, d1)
    4: {0: (-1, -1, 2, 1, -1, -1), 1: (2, -1, -1, 3, 2, 0), 2: (0, 1, 3, 1, -1, -1), 3: (2, -1, -1, -1, -1, 1)},
    8: {0: (-1, -1, 4, 1, -1, -1), 1: (2, -1, -1, 3, 2, 0), 2: (4, 1, 3, 1, -1, -1), 3: (2, -1, -1, 7, 5, 1),
        4: (0, 2, 6, 5, -1, -1), 5: (6, -1, -1, 3, 6, 4), 6: (4, 5, 7, 5, -1, -1), 7: (6, -1, -1, -1, -1, 3)},
    5: {0: (-1, -1, 4, 1, 3, -1), 1: (2, -1, -1, -1, -1, 0), 2: (4, 1, 3, 3, -1, -1), 3: (2, -1, -1, 0, 2, 4),
        4: (0, 2, -1, 3, -1, -1)},
}


@pytest.mark.parametrize("n", sorted(TABLES))
def test_worked_tables(n):
    for r, row in TABLES[n].items():
        t0, t1 = get_dtree(n, r)
        assert t0[:3] + t1[:3] == row, (n, r)


def _check_tree(n, links):
    ups = {r: links[r][0] for r in range(n)}
    roots = [r for r in range(n) if ups[r] == -1]
    assert len(roots) == 1
    for r in range(n):
        for d in links[r][1:3]:
            if d != -1:
                assert ups[d] == r, (n, r, d)            # parent and child agree
    depth = 0
    for r in range(n):                                    # every node reaches the root: the tree spans all
        hops, v = 0, r
        while ups[v] != -1:
            v, hops = ups[v], hops + 1
            assert hops <= n
        depth = max(depth, hops)
    assert depth <= max(1, math.ceil(math.log2(n)) + 1), (n, depth)


@pytest.mark.parametrize("n", range(1, 257))
def test_btree_and_dtree_properties(n):
    t0 = {r: get_dtree(n, r)[0] for r in range(n)}
    t1 = {r: get_dtree(n, r)[1] for r in range(n)}
    _check_tree(n, t0)
    _check_tree(n, t1)
    assert t0 == {r: get_btree(n, r) for r in range(n)}
    if n >= 3:  # the two trees differ: no node is an interior node in both (the point of the double tree) ...
        interior = lambda t, r: t[r][1] != -1 or t[r][2] != -1  # noqa: E731
        if n % 2 == 0:
            assert not any(interior(t0, r) and interior(t1, r) for r in range(n))
        assert any(t0[r][0] != t1[r][0] for r in range(n))


def test_connect_trees_worked_examples():
    t0, t1 = connect_trees([[0, 1], [2, 3]])
    assert (t0[0].up, t0[0].down, t0[2].down, t0[3].up) == (-1, (1, 2), (3,), 2)
    assert (t1[2].up, t1[2].down, t1[0].up, t1[0].down) == (-1, (3, 0), 2, (1,))
    t0, _ = connect_trees([[0, 1], [2, 3], [4, 5], [6, 7]])
    assert (t0[0].down, t0[4].up, t0[4].down, t0[5].down, t0[2].up) == ((1, 4), 0, (5, 6), (2,), 5)


@pytest.mark.parametrize("path", ["rdmatutorial_3x1_p40_graph.log", "trainingoneks_1x4_a100_p4d.log"])
def test_replay_real_nccl_logs(path):
    f = FIXTURES / "nccl_logs" / path
    if not f.exists():
        pytest.skip("shared fixtures not present")
    rep = replay(f.read_text())
    assert rep["matched"] == rep["entries"] > 0, rep["mismatches"][:5]
    assert rep["inter_matched"] == rep["inter_links"]
    assert rep["source"] == ("GRAPH" if "graph" in path else "Trees")  # the P40 log has the tree search's lines


def test_replay_real_two_node_h100_log_from_nccl_tests_issue_319():
    """A real multi-node log from NVIDIA's tracker (nccl-tests#319: 2 nodes x 8 H100, NCCL 2.26.2, 16 channels;
    the tree search chains channel c's GPUs c, c+1, ..., 7, 0, ... so intra-node chains are not the rings')."""
    rep = replay((ROOT / "tests" / "data" / "nccl_tests_319_2x8_h100_trees.log").read_text())
    assert (rep["nranks"], rep["nnodes"], rep["channels"]) == (16, 2, 16)
    assert rep["matched"] == rep["entries"] == 16 * 16, rep["mismatches"][:5]
    assert rep["inter_matched"] == rep["inter_links"] == 32
    assert rep["pattern"] == "BALANCED_TREE"


def test_replay_real_four_node_collnet_log_from_nccl_tests_issue_311():
    """nccl-tests#311: 4 nodes x 2 A100, NCCL 2.23.4 with CollNet on: 3 channels, i.e. Postset's 2 (tree 0, tree 1)
    plus a CollNet copy of channel 0.  Only BALANCED_TREE reproduces it (TREE and SPLIT_TREE attach elsewhere)."""
    rep = replay((ROOT / "tests" / "data" / "nccl_tests_311_4x2_a100_collnet_trees.log").read_text())
    assert (rep["nranks"], rep["nnodes"], rep["channels"], rep["doubled"]) == (8, 4, 3, 2)
    assert rep["matched"] == rep["entries"] == 24, rep["mismatches"][:5]
    assert rep["inter_matched"] == rep["inter_links"] == 18
    assert rep["pattern"] == "BALANCED_TREE" and rep["patterns"]["TREE"] < 24 and rep["patterns"]["SPLIT_TREE"] < 24


def test_replay_takes_chains_and_patterns_from_graph_lines():
    """With GRAPH lines (Pattern 1|2|3 and ' c : NET/x GPU/r ... NET/y') every node's chain and pattern come from its
    own tree search; here node 0 chains [1, 0] with TREE and node 1 [2, 3] with BALANCED_TREE."""
    from collectives.graph.trees import trees_log_line
    chains = [[1, 0], [2, 3]]
    trees = list(connect_trees(chains, ["TREE", "BALANCED_TREE"]))
    lines = []
    for host, pattern, chain in (("hostA", 3, chains[0]), ("hostB", 1, chains[1])):
        pid = 100 + chain[0]
        lines.append(f"{host}:{pid}:{pid} [0] NCCL INFO Pattern {pattern}, crossNic 0, nChannels 1, bw 20.000000/"
                     f"20.000000, type NVL/PIX, sameChannels 1")
        lines.append(f"{host}:{pid}:{pid} [0] NCCL INFO  0 : NET/0 " + " ".join(f"GPU/{r}" for r in chain) + " NET/0")
    for r in range(4):
        host = "hostA" if r < 2 else "hostB"
        lines.append(f"{host}:{100 + r}:{100 + r} [{r % 2}] NCCL INFO comm 0x1 rank {r} nRanks 4 nNodes 2 "
                     f"localRanks 2 localRank {r % 2} MNNVL 0")
        lines.append(f"{host}:{100 + r}:{100 + r} [{r % 2}] NCCL INFO " + trees_log_line(r, trees))
    rep = replay("\n".join(lines) + "\n")
    assert rep["source"] == "GRAPH" and rep["pattern"] == "from GRAPH lines: node 0 TREE, node 1 BALANCED_TREE"
    assert rep["matched"] == rep["entries"] == 8, rep["mismatches"]


def test_tree_index_of_doubled_and_copied_channels():
    from collectives.graph.replay import tree_index
    assert [tree_index(c, 4) for c in range(6)] == [0, 0, 1, 1, 0, 0]      # 4 doubled, then copies of 0 and 1
    assert [tree_index(c, 2) for c in range(3)] == [0, 1, 0]               # CollNet's n + n/2 with n = 2
    assert [tree_index(c, 8) for c in range(16)] == [0] * 4 + [1] * 4 + [0] * 4 + [1] * 4  # Hopper x2 copy


@pytest.mark.parametrize("nranks,nodes,rings", [(4, 2, None), (8, 4, [list(range(8)), [0, 1, 3, 2, 5, 4, 7, 6]])])
def test_replay_our_own_logs(tmp_path, nranks, nodes, rings):
    env = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT", "NCCL_DEBUG_FILE": str(tmp_path / "log.%p")}
    run_ranks(nranks, "bitwise", Case(channels=2 if rings else 1, counts=[7], dtypes=['float32'],
                                      colls=['allreduce'], rings=rings).arg(),
              env=env, nodes=nodes, timeout=300)
    text = "\n".join(p.read_text() for p in sorted(tmp_path.glob("log.*")))
    rep = replay(text)
    assert rep["nnodes"] == nodes and rep["matched"] == rep["entries"] == nranks * rep["channels"]
    assert rep["inter_links"] > 0 and rep["inter_matched"] == rep["inter_links"]


def test_replay_cli_and_errors(tmp_path):
    log = tmp_path / "nccl.log"
    log.write_text("some other program output\n"
                   "h0:1:1 [0] NCCL INFO comm 0x1 rank 0 nRanks 2 nNodes 2 localRanks 1 localRank 0 MNNVL 0\n"
                   "h0:1:1 [0] NCCL INFO Trees [0] 1/-1/-1->0->-1\n"
                   "h1:2:2 [0] NCCL INFO Trees [0] -1/-1/-1->1->0\n")
    proc = subprocess.run([sys.executable, "-m", "collectives.graph.replay", str(log)], capture_output=True,
                          text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 0 and "matched 2 of 2" in proc.stdout
    bad = tmp_path / "bad.log"
    bad.write_text("h0:1:1 [0] NCCL INFO Trees [0] 1/-1/-1->0->-1 [1] garbage\n")
    proc = subprocess.run([sys.executable, "-m", "collectives.graph.replay", str(bad)], capture_output=True,
                          text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 2 and "line 1" in proc.stderr
    with pytest.raises(LogError, match="no 'Trees"):
        replay("nothing here\n")
