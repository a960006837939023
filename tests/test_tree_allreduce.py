"""Tree AllReduce (NCCL's runTreeSplit / runTreeUpDown): bitwise against the tree reference order, on one node and
on emulated nodes over NET, for Simple, LL and LL128; its chunking, proxy step counts, log lines and CLI."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from collectives import enqueue
from collectives.perf import reference
from collectives.graph.trees import channel_trees, connect_trees
from workers import Case
from conftest import FIXTURES, ROOT, run_ranks
from graph_files import graph_file

PROTOS = ["Simple", "LL", "LL128"]
# 0, 1, a prime, a non-multiple of 16 B, past one LL chunk (8192 floats), past one Simple chunk (131072 floats)
COUNTS = [0, 1, 7, 1021, 70_001, 300_007]
TREE_ENV = {"NCCL_ALGO": "Tree"}


def _as_ref(tree: dict) -> dict:
    return {r: (t.up, list(t.down)) for r, t in tree.items()}


def test_reference_is_the_worked_example_of_two_nodes_of_two():
    """The double binary tree (``ncclGetDtree`` over 2 nodes): tree 0 sums (x0 + x1) + (x2 + x3), tree 1 (x2 + x3) + (x0 + x1); and it is not the ring."""
    t0, t1 = connect_trees([[0, 1], [2, 3]])
    rng = np.random.default_rng(5)
    xs = [rng.uniform(-1, 1, 40_000).astype(np.float32) for _ in range(4)]
    got0 = reference.all_reduce(xs, algo="Tree", trees=[_as_ref(t0)])
    got1 = reference.all_reduce(xs, algo="Tree", trees=[_as_ref(t1)])
    assert np.array_equal(got0.view(np.uint32), ((xs[0] + xs[1]) + (xs[2] + xs[3])).view(np.uint32))
    assert np.array_equal(got1.view(np.uint32), ((xs[2] + xs[3]) + (xs[0] + xs[1])).view(np.uint32))
    ring = reference.all_reduce(xs, rings=[[0, 1, 2, 3]])
    assert not np.array_equal(got0.view(np.uint32), ring.view(np.uint32))  # the order is really different


def test_reference_uses_tree_one_on_the_copied_channels():
    """Channel c + n copies ring c with tree 1: with two channels each half of the data takes its own tree."""
    trees = channel_trees([[0, 1, 2, 3]], [0, 0, 1, 1])
    assert trees[0][0].up == -1 and trees[1][2].up == -1  # roots: rank 0 in tree 0, rank 2 in tree 1
    rng = np.random.default_rng(6)
    count = 1 << 18
    xs = [rng.uniform(-1, 1, count).astype(np.float32) for _ in range(4)]
    parts = reference.channel_parts("AllReduce", count, 4, 4, 2, "Simple", algo="Tree")
    assert len(parts) == 2
    got = reference.all_reduce(xs, nchannels=2, algo="Tree", trees=[_as_ref(t) for t in trees])
    (s0, n0, _), (s1, n1, _) = parts
    a, b = slice(s0, s0 + n0), slice(s1, s1 + n1)
    assert np.array_equal(got[a], ((xs[0] + xs[1]) + (xs[2] + xs[3]))[a])
    assert np.array_equal(got[b], ((xs[2] + xs[3]) + (xs[0] + xs[1]))[b])


def test_tree_chunking_matches_calc_coll_chunking():
    """Tree: one step per chunk (Simple 512 KiB, LL 32 KiB); LL128 halves for small parts (nstepsLL128 rule)."""
    t = enqueue.default_tuning(16, 2, {"LL": 1 << 19, "LL128": 4915200, "Simple": 1 << 22}, nnodes=2)
    assert enqueue.calc_coll_chunking(t, "AllReduce", "Tree", "Simple", 1 << 30) == 524288
    assert enqueue.calc_coll_chunking(t, "AllReduce", "Tree", "LL", 1 << 30) == 32768
    assert enqueue.calc_coll_chunking(t, "AllReduce", "Tree", "LL128", 1 << 30) == 576000
    # ppn 8, nsteps = 1 + 1 + 0.8 = 2.8: halve while nBytes/chunk < 22.4 (above 128 KiB), then < 5.6 (above 32 KiB)
    assert enqueue.calc_coll_chunking(t, "AllReduce", "Tree", "LL128", 4 << 20) == 144000 // 1920 * 1920
    assert enqueue.calc_coll_chunking(t, "AllReduce", "Tree", "LL128", 64 << 10) == 18000 // 1920 * 1920
    for count in [1, 1000, 65_537, 1 << 20, 5_000_011]:
        for proto in PROTOS:
            plan = enqueue.schedule_coll(t, "AllReduce", count, 4, "Tree", proto)
            ref = reference.channel_parts("AllReduce", count, 4, 16, 2, proto, algo="Tree", nnodes=2)
            assert [(w.part_offset, w.part_count, w.chunk_count) for w in plan.works] == ref, (count, proto)


def test_tree_proxy_steps_follow_the_tree():
    """ncclPatternTreeUpDown: one step per chunk on every tree connection; a leaf talks only to its parent."""
    t0, _ = connect_trees([[0, 1], [2, 3]])
    work = enqueue.ChannelWork(0, 0, 1_000_000, 131072, 1_000_000)
    assert enqueue.tree_calls(work, t0[0]) == ({1: 8, 2: 8}, {1: 8, 2: 8})  # root: children 1 and 2
    assert enqueue.tree_calls(work, t0[3]) == ({2: 8}, {2: 8})              # leaf: only up
    assert enqueue.tree_calls(enqueue.ChannelWork(0, 0, 0, 131072, 0), t0[0]) == ({}, {})


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_single_node_bitwise_all_protocols(n):
    dtypes = ["float32", "bfloat16"] if n != 8 else ["float32"]
    counts = COUNTS if n <= 4 else [0, 1, 1021, 70_001, 300_007]
    run_ranks(n, "tree_bitwise", json.dumps(PROTOS), json.dumps(counts), json.dumps(dtypes), '["sum"]',
              env=TREE_ENV, timeout=400)


def test_ops_and_in_place_and_up_down_variant():
    """Avg (pre-multiply for floats, post-divide at the root for integers), prod/max/min, and runTreeUpDown."""
    run_ranks(3, "tree_bitwise", '["Simple", "LL"]', "[7, 70001]", '["float32", "int32", "float16"]',
              '["avg", "prod", "max", "min"]', env=TREE_ENV)
    run_ranks(4, "tree_bitwise", json.dumps(PROTOS), "[1021, 300007]", '["float32"]', '["sum", "avg"]',
              env={**TREE_ENV, "NCCLLAB_TREE_UPDOWN": "1"})


@pytest.mark.parametrize("proto", PROTOS)
def test_two_nodes_of_two_over_net_bitwise(proto):
    run_ranks(4, "tree_bitwise", json.dumps([proto]), "[0, 1, 1021, 70001, 300007]", '["float32", "bfloat16"]',
              '["sum"]', env=TREE_ENV, nodes=2, timeout=400)


def test_four_nodes_of_two_over_net_bitwise():
    run_ranks(8, "tree_bitwise", '["Simple", "LL128"]', "[1021, 200003]", '["float32"]', '["sum"]', env=TREE_ENV,
              nodes=4, timeout=400)


def test_log_lines_and_auto_choice_across_nodes():
    """INIT prints every channel's Trees and `Connected all trees`; across nodes the CPU model picks Tree for
    small messages (the NET step costs more than a tree level) and Ring for large ones, and both are right."""
    proc = run_ranks(4, "bitwise", Case(channels=1, counts=[7, 4000000], dtypes=['float32'], colls=['allreduce']).arg(),
                     env={"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,TUNING"}, nodes=2, timeout=300)
    out = proc.stdout + proc.stderr
    assert out.count("Connected all trees") == 4
    assert "Trees [0] 1/2/-1->0->-1 [1] 1/-1/-1->0->2" in out
    assert "AllReduce: 28 Bytes -> Algo Tree" in out
    assert "AllReduce: 16000000 Bytes -> Algo Ring" in out


def test_tree_cli_runs_and_replays(tmp_path):
    env = {**os.environ, "NCCL_SOCKET_IFNAME": "lo", "NCCLLAB_TIMEOUT": "30"}
    env.pop("NCCL_ALGO", None)
    proc = subprocess.run([sys.executable, "-m", "collectives.tree", "-g", "2", "-b", "8", "-e", "1M", "-f", "32",
                           "-n", "2", "-w", "1"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "algo Tree," in proc.stdout and "Out of bounds values : 0 OK" in proc.stdout
    rows = [line.split() for line in proc.stdout.splitlines() if line.strip() and line.split()[0].isdigit()]
    assert [r[0] for r in rows] == ["8", "256", "8192", "262144"] and all(r[8] == "0" for r in rows)
    bad = subprocess.run([sys.executable, "-m", "collectives.tree", "--from-log"], cwd=ROOT, env=env,
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "needs an NCCL INFO log" in bad.stderr
    logs = sorted((FIXTURES / "nccl_logs").glob("*.log")) if (FIXTURES / "nccl_logs").is_dir() else []
    if not logs:
        pytest.skip("../shared/fixtures/nccl_logs is absent")
    rep = subprocess.run([sys.executable, "-m", "collectives.tree", "--from-log", str(logs[0])], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=60)
    assert rep.returncode == 0, rep.stdout + rep.stderr
    last = rep.stdout.strip().splitlines()[-1].split()
    assert last[0] == "matched" and last[1] == last[3]


def test_trace_shows_every_tree_edge_both_ways(tmp_path):
    """Traced tree AllReduce over 2 nodes x 2: each channel's part goes up every tree edge once and down it once."""
    from tracing import export
    count = 300_000
    run_ranks(4, "traced_allreduce", "1", str(count), env={**TREE_ENV, "NCCLLAB_TRACE": str(tmp_path)}, nodes=2)
    meta, _ = export.load(str(tmp_path))
    parts = reference.channel_parts("AllReduce", count, 4, 4, meta["nchannels"], "Simple", algo="Tree")
    rows = [r for r in export.movements(str(tmp_path)) if r["seq"] == 0]
    for c, (_, length, _) in enumerate(parts):
        tree = {int(r): v for r, v in meta["trees"][c].items()}
        edges = {(r, up) for r, (up, _) in tree.items() if up != -1}
        want = {e: 4 * length for e in edges} | {(p, r): 4 * length for r, p in edges}
        got: dict = {}
        for row in rows:
            if row["channel"] == c:
                got[(row["from"], row["to"])] = got.get((row["from"], row["to"]), 0) + row["bytes"]
        assert got == want, (c, got, want)


@pytest.mark.parametrize("pattern", ["SPLIT_TREE", "TREE"])
def test_selectable_pattern_on_four_nodes_of_two(pattern, tmp_path):
    """The tree graph's pattern in NCCL_GRAPH_FILE picks the attachment ranks (as the search's would): the Trees
    lines follow connect_trees with that pattern, and the AllReduce is bitwise the order of those trees."""
    from collectives.graph.search import PATTERN_NAMES
    from collectives.graph.trees import channel_trees, trees_log_line
    number = {name: p for p, name in PATTERN_NAMES.items()}[pattern]
    path = graph_file(tmp_path / "graphs.xml", [[0, 1]], tree_pattern=number, nets=True)
    env = {**TREE_ENV, "NCCL_GRAPH_FILE": path, "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT"}
    proc = run_ranks(8, "tree_bitwise", '["Simple"]', "[70001]", '["float32"]', '["sum"]', env=env, nodes=4,
                     timeout=300)
    trees = channel_trees([list(range(8))], [0, 0, 1, 1, 2, 2, 3, 3], pattern)
    out = proc.stdout + proc.stderr
    for r in range(8):
        assert trees_log_line(r, trees) in out, (r, trees_log_line(r, trees))
    assert trees != channel_trees([list(range(8))], [0, 0, 1, 1, 2, 2, 3, 3], "BALANCED_TREE")


def test_unknown_tree_pattern_is_an_error_on_every_rank(tmp_path):
    path = graph_file(tmp_path / "graphs.xml", [[0, 1]], tree_pattern=7)
    proc = run_ranks(2, "tree_bitwise", '["Simple"]', "[7]", '["float32"]', '["sum"]',
                     env={**TREE_ENV, "NCCL_GRAPH_FILE": path}, check=False, timeout=60)
    assert proc.returncode != 0
    assert proc.stderr.count("<graph id=1> pattern=7") == 2, proc.stderr[-2000:]
