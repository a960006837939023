"""Diagrams through the real `dot`, curves from nccl-tests output and our runs, and NCCL log parsing."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from collectives.graph.trees import channel_trees, get_dtree, trees_log_line
from conftest import FIXTURES, ROOT, run_ranks
from graph_files import graph_file
from tracing import export, nccl_log
from visualize import curves, diagrams, nccl_tests

DATA = Path(__file__).parent / "data"


def edges(dot_source: str) -> set[tuple[str, str]]:
    return set(re.findall(r"\s(\S+) -> (\S+) \[", dot_source))


@pytest.fixture(scope="module")
def traced_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("trace")
    graphs = d / "graphs.xml"     # NCCL_GRAPH_FILE: both search channels ring 0 2 1 3
    graph_file(graphs, [[0, 2, 1, 3], [0, 2, 1, 3]])
    run_ranks(4, "traced_allreduce", "2", "200000", env={"NCCLLAB_TRACE": str(d), "NCCL_GRAPH_FILE": str(graphs)})
    return d


def test_topology_diagram_renders_with_ring_edges(traced_run, tmp_path):
    metas, _ = export.load_all(str(traced_run))
    meta = metas[0]
    src = diagrams.topology(meta["nranks"], meta["node_of_rank"], meta["rings"], export.edge_transports(metas))
    assert {("r0", "r2"), ("r2", "r1"), ("r1", "r3"), ("r3", "r0")} <= edges(src)
    assert "SHM" in src and "NET" not in src
    png, svg = diagrams.render(src, str(tmp_path / "topo"))
    assert Path(png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and b"<svg" in Path(svg).read_bytes()


def test_trees_diagram_has_one_edge_per_link_parent_to_child(tmp_path):
    tl = channel_trees([[0, 1, 2, 3]], [0, 0, 1, 1])     # 2 nodes x 2 ranks: ncclGetDtree over 2 nodes, worked by hand
    trees = [{r: (n.up, list(n.down)) for r, n in tl_c.items()} for tl_c in tl]
    assert trees[0][0] == (-1, [1, 2]) and trees[1][2] == (-1, [3, 0])
    src = diagrams.trees(trees, 4, node_of_rank=[0, 0, 1, 1])
    assert edges(src) == {("c0r0", "c0r1"), ("c0r0", "c0r2"), ("c0r2", "c0r3"),
                          ("c1r2", "c1r3"), ("c1r2", "c1r0"), ("c1r0", "c1r1")}
    assert src.count("dir=both") == 6 and "channel 1: tree 1 of ring 0" in src
    diagrams.render(src, str(tmp_path / "trees"), formats=("png",))
    assert (tmp_path / "trees.png").stat().st_size > 1000


def test_channel_roles_follow_postset_doubling_and_copies():
    assert diagrams.channel_roles(16)[4] == (4, 0, None) and diagrams.channel_roles(16)[12] == (4, 1, None)
    assert diagrams.channel_roles(3, 2) == [(0, 0, None), (0, 1, None), (0, 0, 0)]  # CollNet's n + n/2
    assert diagrams.channel_roles(1) == [(0, 0, None)]


def test_trees_log_line_format():
    tl = channel_trees([[0, 1, 2, 3]], [0, 0, 1, 1])
    assert trees_log_line(2, tl) == "Trees [0] 3/-1/-1->2->0 [1] 3/0/-1->2->-1"
    assert get_dtree(5, 0)[1][:3] == (1, 3, -1)


def test_diagrams_from_a_real_nccl_log(tmp_path):
    path = FIXTURES / "nccl_logs" / "rdmatutorial_3x1_p40_graph.log"
    if not path.exists():
        pytest.skip("shared fixtures not present")
    log = nccl_log.parse(path.read_text())
    assert log.nranks == 3 and log.nnodes == 3 and log.rings[0] == [0, 1, 2]
    assert log.trees[0][0][0] == -1 and log.patterns and log.patterns[0][1] == 1
    proc = subprocess.run([sys.executable, "-m", "visualize", "log", str(path), "-o", str(tmp_path / "log")],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "log-rings.png").exists() and (tmp_path / "log-trees.png").exists()
    big = FIXTURES / "nccl_logs" / "trainingoneks_1x4_a100_p4d.log"
    log2 = nccl_log.parse(big.read_text())
    assert log2.ring_total == 24 and len(log2.rings) == 24 and log2.nranks == 4


def test_parser_reads_both_formats_and_several_tables():
    tables = nccl_tests.parse((DATA / "all_reduce_perf_218.txt").read_text())
    assert len(tables) == 2
    assert tables[0].rows[-1].size == 134217728 and tables[0].rows[-1].out_of_place["busbw"] == 117.60
    assert tables[0].oob_ok and tables[0].avg_busbw == pytest.approx(31.6178)
    assert tables[1].rows[0].dtype == "half" and tables[1].rows[0].in_place["wrong"] is None
    old = nccl_tests.parse((DATA / "all_reduce_perf_noroot.txt").read_text())[0]
    assert [r.size for r in old.rows] == [4, 8, 16] and old.rows[0].root == -1
    assert old.rows[0].in_place["wrong"] == pytest.approx(4e-07)
    legacy = FIXTURES / "nccl_tests" / "a3mega_2x8_h100_allreduce.txt"
    if legacy.exists():
        t = nccl_tests.parse(legacy.read_text())[0]
        assert t.rows[0].size == 8 and t.rows[-1].out_of_place["busbw"] > 100


def test_curves_from_nccl_tests_our_json_and_model(tmp_path):
    ours = tmp_path / "ours.json"
    ours.write_text(json.dumps([{"size": 1024 * 2 ** i, "algbw": 0.1 * i + .05, "busbw": 0.15 * i + .05,
                                 "nranks": 2, "coll": "AllReduce", "placement": "out-of-place"} for i in range(8)]))
    model = tmp_path / "model.json"
    subprocess.run([sys.executable, "-m", "collectives.tools.tune", "--preset", "dgx-h100", "-b", "1K", "-e", "1G", "-f", "8",
                    "--series", str(model)], check=True, capture_output=True, cwd=ROOT, timeout=60)
    inputs = [str(ours), str(DATA / "all_reduce_perf_218.txt"), str(model)]
    labels = [s["label"] for p in inputs for s in curves.load_series(p)]
    assert labels[0].startswith("nccl-lab") and sum(lab.startswith("NCCL:") for lab in labels) == 2
    out = curves.plot(inputs, str(tmp_path / "curve.png"))
    assert Path(out).read_bytes()[:4] == b"\x89PNG" and os.path.getsize(out) > 10_000
