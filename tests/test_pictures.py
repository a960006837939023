"""Every picture checked for what it claims, read back through the real ``dot`` (tests/dotgraph.py): transports on
the edges against the run's own NCCL log, tree labels against the channel index, chunk-flow arrows against the
trace's sends and receives.  Plus ``explain`` and the command lines' one-line errors."""
import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

import dotgraph
from collectives.graph.replay import tree_index
from conftest import FIXTURES, ROOT, run_ranks
from tracing import export, nccl_log
from visualize import curves

DATA = Path(__file__).parent / "data"
H100 = DATA / "nccl_tests_319_2x8_h100_trees.log"
COLLNET = DATA / "nccl_tests_311_4x2_a100_collnet_trees.log"
BOX = re.compile(r"^r(\d+)_(\d+)$")


def cli(*args: str, ok: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, cwd=ROOT, timeout=120)
    if ok:
        assert proc.returncode == 0, proc.stderr
    return proc


def traced(tmp_path_factory, algo: str) -> Path:
    """A traced 2 nodes x 2 ranks AllReduce with its NCCL_DEBUG=INFO log (INIT, NET, SHM, TUNING)."""
    d = tmp_path_factory.mktemp(algo)
    run_ranks(4, "traced_allreduce", "1", "40000", nodes=2,
              env={"NCCLLAB_TRACE": str(d / "trace"), "NCCL_ALGO": algo, "NCCL_DEBUG": "INFO",
                   "NCCL_DEBUG_SUBSYS": "INIT,NET,SHM,TUNING", "NCCL_DEBUG_FILE": str(d / "nccl.%p.log")})
    (d / "nccl.log").write_text("".join(p.read_text() for p in sorted(d.glob("nccl.*.log"))))
    return d


@pytest.fixture(scope="module")
def ring_run(tmp_path_factory):
    return traced(tmp_path_factory, "Ring")


@pytest.fixture(scope="module")
def tree_run(tmp_path_factory):
    return traced(tmp_path_factory, "Tree")


def picture(kind: str, src: Path, out: Path, *flags: str, layout: bool = False) -> dotgraph.Graph:
    cli("visualize", kind, str(src), "-o", str(out), *flags)
    return dotgraph.parse((out.parent / (out.name + ".dot")).read_text(), layout)


def boxes(g: dotgraph.Graph) -> dict:
    return {n: a for n, a in g.nodes.items() if BOX.match(n) and a.get("style") != "invis"}


# --- (a) topology ---------------------------------------------------------------------------------------------
def test_topology_edges_carry_the_transport_of_the_runs_own_log(ring_run, tmp_path):
    g = picture("topology", ring_run / "trace", tmp_path / "topo")
    log = nccl_log.parse((ring_run / "nccl.log").read_text())
    meta, _ = export.load(str(ring_run / "trace"))
    node = meta["node_of_rank"]
    assert node == [0, 0, 1, 1]
    assert {c["label"]: c["nodes"] for c in g.clusters.values()} == {"node 0": {"r0", "r1"}, "node 1": {"r2", "r3"}}
    seen = set()
    for t, h, a in g.edges:  # one arrow per link: "ch0,1 NET/Socket/0"
        chans, via = re.fullmatch(r"ch([\d,]+) (\S+)", a["label"]).groups()
        a_, b_ = int(t[1:]), int(h[1:])
        for ch in map(int, chans.split(",")):
            logged = log.transports[(ch, a_, b_)]       # "Channel 00/0 : 1[1] -> 2[0] [send] via NET/Socket/0"
            assert via.split("/")[0] == logged.split("/")[0], (t, h, via, logged)
            seen.add((ch, a_, b_))
        assert (via == "NET/Socket/0") == (node[a_] != node[b_])
    assert seen == {(c, r, ring[(ring.index(r) + 1) % 4]) for c, ring in enumerate(meta["rings"]) for r in ring}


# --- (b) trees ------------------------------------------------------------------------------------------------
def test_trees_of_a_run_pair_the_channels_and_label_edges_with_their_transport(tree_run, tmp_path):
    g = picture("trees", tree_run / "trace", tmp_path / "trees")
    log = nccl_log.parse((tree_run / "nccl.log").read_text())
    assert g.clusters["cluster_c0"]["label"] == "channel 0: tree 0 of ring 0"
    assert g.clusters["cluster_c1"]["label"] == "channel 1: tree 1 of ring 0"
    assert {"c0r0", "c1r0"} <= g.clusters["cluster_ring0"]["nodes"]
    for c in (0, 1):
        want = {(f"c{c}r{r}", f"c{c}r{d}") for r, (_, downs) in log.trees[c].items() for d in downs}
        got = {(t, h) for t, h in g.edge_set() if t.startswith(f"c{c}r")}
        assert got == want
    links = [{(t.split("r")[1], h.split("r")[1]) for t, h in g.edge_set() if t.startswith(f"c{c}r")} for c in (0, 1)]
    assert links[0] != links[1]  # across nodes the two trees differ: what the picture is there to show
    vias = set()
    for t, h, a in g.edges:
        c, p, d = int(t[1]), int(t.split("r")[1]), int(h.split("r")[1])
        logged = log.transports.get((c, p, d)) or log.transports[(c, d, p)]
        assert a["label"].split("/")[0] == logged.split("/")[0]
        vias.add(a["label"].split("/")[0])
    assert vias == {"SHM", "NET"}  # trees of 2 nodes: both kinds of link
    roots = {n for n, a in g.nodes.items() if a.get("shape") == "doublecircle"}
    assert roots == {f"c{c}r{r}" for c in (0, 1) for r, (up, _) in log.trees[c].items() if up == -1}


def test_tree_labels_come_from_the_real_channel_index_2x8_h100(tmp_path):
    cli("visualize", "log", str(H100), "-o", str(tmp_path / "h100"), "--max-rings", "8")
    g = dotgraph.parse((tmp_path / "h100-trees.dot").read_text())
    log = nccl_log.parse(H100.read_text())
    assert len(log.trees) == 16
    for c in range(16):
        assert g.clusters[f"cluster_c{c}"]["label"] == f"channel {c}: tree {tree_index(c, 16)} of ring {c % 8}"
        want = {(f"c{c}r{r}", f"c{c}r{d}") for r, (_, downs) in log.trees[c].items() for d in downs}
        assert {(t, h) for t, h in g.edge_set() if t.startswith(f"c{c}r")} == want
    assert g.clusters["cluster_c4"]["label"] == "channel 4: tree 0 of ring 4"   # the example
    assert g.clusters["cluster_c12"]["label"] == "channel 12: tree 1 of ring 4"  # the mirrored tree is drawn
    assert {"c4r0", "c12r0"} <= g.clusters["cluster_ring4"]["nodes"]
    cli("visualize", "log", str(H100), "-o", str(tmp_path / "d"))
    default = dotgraph.parse((tmp_path / "d-trees.dot").read_text())
    assert {c for c in default.clusters if c.startswith("cluster_c")} == {f"cluster_c{c}" for c in
                                                                        (0, 1, 2, 3, 8, 9, 10, 11)}


def test_collnet_copy_channel_is_labelled_a_copy_not_tree_2(tmp_path):
    cli("visualize", "log", str(COLLNET), "-o", str(tmp_path / "cn"))
    g = dotgraph.parse((tmp_path / "cn-trees.dot").read_text())
    labels = {c: v["label"] for c, v in g.clusters.items() if c.startswith("cluster_c")}
    assert labels == {"cluster_c0": "channel 0: tree 0 of ring 0", "cluster_c1": "channel 1: tree 1 of ring 0",
                      "cluster_c2": "channel 2: tree 0 of ring 0, copy of channel 0"}


# --- (c) chunk flow -------------------------------------------------------------------------------------------
def test_ring_flow_is_a_rank_by_step_grid_with_every_send_paired(ring_run, tmp_path):
    g = picture("flow", ring_run / "trace", tmp_path / "flow", layout=True)
    meta, events = export.load(str(ring_run / "trace"))
    ring, n = meta["rings"][0], 4
    prims = [e for e in events if e["kind"] == "prim" and e["seq"] == 0 and e["channel"] == 0]
    loop = min(e["loop"] for e in prims)
    calls = {r: sorted((e for e in prims if e["rank"] == r and e["loop"] == loop), key=lambda e: e["t0"])
             for r in range(n)}
    got = boxes(g)
    assert set(got) == {f"r{r}_{i}" for r in range(n) for i in range(2 * n - 1)}  # no stray box
    for name, a in got.items():
        r, i = map(int, BOX.match(name).groups())
        e = calls[r][i]
        assert a["label"] == f"rank {r} · chunk {e['chunk']}\\n{e['prim']}"
        assert a["fillcolor"] == ("#fde0dd" if "reduce" in e["prim"] else "#e0ecf4")
    # logical arrows (a wrap-around is two stubs with the same id): call i of a rank feeds call i+1 of its next
    moves = {a["id"] for _, _, a in g.edges if a.get("id", "").startswith("move:")}
    nxt = {r: ring[(ring.index(r) + 1) % n] for r in ring}
    assert moves == {f"move:r{r}_{i}:r{nxt[r]}_{i + 1}" for r in range(n) for i in range(2 * n - 2)}
    last, first = ring[-1], ring[0]
    for i in range(2 * n - 2):
        assert f"to rank {first}" in g.nodes[f"wo{i}"]["label"]
        assert f"from rank {last}" in g.nodes[f"wi{i + 1}"]["label"]
    # columns under their rank headers, rows on their step
    for name in got:
        r, i = map(int, BOX.match(name).groups())
        assert abs(g.pos(name)[0] - g.pos(f"h{r}")[0]) < 1 and abs(g.pos(name)[1] - g.pos(f"axis{i}")[1]) < 1
    assert [g.nodes[f"axis{i}"]["label"] for i in range(2 * n - 1)] == [f"step {i}" for i in range(2 * n - 1)]
    xs = [g.pos(f"h{r}")[0] for r in ring]
    assert xs == sorted(xs)  # ring order, left to right
    assert "red = reduce" in g.label and "blue = copy" in g.label


def test_tree_flow_pairs_sends_with_receives_up_to_the_root_and_down(tree_run, tmp_path):
    g = picture("flow", tree_run / "trace", tmp_path / "flow", layout=True)
    meta, events = export.load(str(tree_run / "trace"))
    tree = {int(r): (up, downs) for r, (up, downs) in meta["trees"][0].items()}
    prims = [e for e in events if e["kind"] == "prim" and e["seq"] == 0 and e["channel"] == 0]
    first = min((e["loop"], e["chunk"]) for e in prims)
    calls = {r: sorted((e for e in prims if e["rank"] == r and (e["loop"], e["chunk"]) == first),
                       key=lambda e: e["t0"]) for r in range(4)}
    got = boxes(g)
    assert set(got) == {f"r{r}_{i}" for r in range(4) for i in range(len(calls[r]))}  # no stray box
    prim_of = {n: calls[int(BOX.match(n)[1])][int(BOX.match(n)[2])]["prim"] for n in got}
    steps = [e for e in events if e["kind"] == "step" and e["seq"] == 0 and e["channel"] == 0]
    arrows = {}
    for t, h, a in g.edges:
        if a.get("style") == "invis":
            continue  # the grid's scaffolding
        src, dst = int(BOX.match(t)[1]), int(BOX.match(h)[1])
        # the trace has this very message: src's call sends to dst, dst's call receives from src
        assert any(e["rank"] == src and e["send_peer"] == dst and e["prim"] == prim_of[t] for e in steps)
        assert any(e["rank"] == dst and e["recv_peer"] == src and e["prim"] == prim_of[h] for e in steps)
        arrows[(src, dst)] = (a["xlabel"].split(" ")[0], prim_of[t], prim_of[h])
        assert g.pos(t)[1] > g.pos(h)[1]  # a V: every arrow goes down the page, up to the root, then down again
    for r, (up, downs) in tree.items():
        if up != -1:
            assert arrows[(r, up)][0] == "up" and arrows[(up, r)][0] == "down"
    assert len(arrows) == 2 * sum(up != -1 for up, _ in tree.values())
    leaf_under_middle = next(r for r, (up, downs) in tree.items() if not downs and up != -1 and tree[up][0] != -1)
    mid = tree[leaf_under_middle][0]
    assert arrows[(leaf_under_middle, mid)][1:] == ("send", "recv_reduce_send")  # not into recv_copy_send
    assert arrows[(mid, leaf_under_middle)][1:] == ("recv_copy_send", "recv")
    assert g.nodes[f"axis{max(i for i in range(9) if f'axis{i}' in g.nodes) // 2}"]["label"] == "root"


def test_flow_channel_out_of_range_is_one_line(ring_run, tmp_path):
    proc = cli("visualize", "flow", str(ring_run / "trace"), "-o", str(tmp_path / "f"), "--channel", "7", ok=False)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().count("\n") == 0 and "channel 7 is out of range" in proc.stderr
    assert "channels 0..1" in proc.stderr and not list(tmp_path.iterdir())


# --- explain --------------------------------------------------------------------------------------------------
def explain(log: Path, out: Path) -> str:
    cli("tracing", "explain", str(log), "-o", str(out))
    assert {"report.txt"} <= {p.name for p in out.iterdir()}
    return (out / "report.txt").read_text()


def test_explain_2x8_h100(tmp_path):
    rep = explain(H100, tmp_path / "x")
    assert "ranks: 16, nodes: 2, GPUs per node: 8 (hosts lccn09, lccn19)" in rep
    assert "ranks by node: node 0: 0-7; node 1: 8-15" in rep
    assert "channels: 16" in rep and "rings (8 distinct" in rep
    assert "trees: matched 256 of 256 entries by replay" in rep and "16 after Postset doubling" in rep
    assert "NCCL version: not in the log" in rep and "unusual: nothing" in rep
    assert {"rings.png", "trees.png", "rings.svg", "trees.svg"} <= {p.name for p in (tmp_path / "x").iterdir()}


def test_explain_collnet_and_the_shared_fixtures(tmp_path):
    assert "trees: matched 24 of 24" in explain(COLLNET, tmp_path / "c")
    logs = FIXTURES / "nccl_logs"
    if not logs.exists():
        pytest.skip("shared fixtures not present")
    p40 = explain(logs / "rdmatutorial_3x1_p40_graph.log", tmp_path / "p")
    assert "ranks: 3, nodes: 3, GPUs per node: 1" in p40 and "trees: matched 3 of 3" in p40
    assert re.search(r"0 -> 1 \(inter-node\): NET/\S+ on channels 0", p40)
    a100 = explain(logs / "trainingoneks_1x4_a100_p4d.log", tmp_path / "a")
    assert "NCCL version: 2.27.7" in a100 and "GPUs per node: 4" in a100 and "channels: 24" in a100
    assert "trees: matched 96 of 96" in a100


def test_explain_our_own_log_lists_every_edges_transport_and_tuning(ring_run, tmp_path):
    rep = explain(ring_run / "nccl.log", tmp_path / "o")
    log = nccl_log.parse((ring_run / "nccl.log").read_text())
    for (c, a, b), via in log.transports.items():
        line = next(x for x in rep.splitlines() if x.startswith(f"  {a} -> {b} "))
        assert via in line and ("inter-node" in line) == ((a < 2) != (b < 2))
    assert "TUNING:" in rep and re.search(r"AllReduce \d+ B -> Ring/", rep)


def test_explain_partial_logs_say_what_is_missing(tmp_path):
    text = H100.read_text()
    cut = tmp_path / "cut.log"
    cut.write_text(text[: len(text) // 2])  # cut mid-line, half the ranks gone
    rep = explain(cut, tmp_path / "cut")
    assert "unusual:" in rep and "print no comm or Trees line" in rep
    lines = text.splitlines()
    i = next(k for k, x in enumerate(lines) if "Trees [0]" in x and "->5->" in x)
    lines[i] = lines[i][: lines[i].index(" [8]")]  # rank 5 prints 8 channels, the others 16
    odd = tmp_path / "odd.log"
    odd.write_text("\n".join(lines) + "\n")
    rep = explain(odd, tmp_path / "odd")
    assert "different channel counts (8 channels: ranks 5; 16 channels: ranks 0-4,6-15)" in rep


# --- command lines: one line, non-zero, nothing left behind --------------------------------------------------
@pytest.mark.parametrize("args", [("visualize", "log", "missing.log"), ("visualize", "curves", "missing.json"),
                                  ("visualize", "log", "all_reduce_perf_218.txt"), ("visualize", "topology", "EMPTY"),
                                  ("tracing", "perfetto", "EMPTY"), ("tracing", "csv", "EMPTY"),
                                  ("tracing", "explain", "pyproject.toml"), ("tracing", "explain", "missing.log"),
                                  ("visualize", "log", "nccl_tests_319_2x8_h100_trees.log", "--max-rings", "0")])
def test_bad_input_is_one_line_and_leaves_no_output(args, tmp_path):
    (tmp_path / "EMPTY").mkdir()
    args = [str(tmp_path / a) if a in ("EMPTY", "missing.log", "missing.json") else
            str(DATA / a) if a.endswith((".txt", ".log")) and a != "missing.log" else
            str(ROOT / a) if a.endswith(".toml") else a for a in args]
    proc = cli(*args, "-o", str(tmp_path / "EMPTY" / "out"), ok=False)
    assert proc.returncode == 2, proc
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert list((tmp_path / "EMPTY").iterdir()) == []
    if any(a.endswith((".txt", ".toml")) for a in args):
        assert "not an NCCL INFO log" in proc.stderr


def test_help_describes_each_kind_and_every_flag_has_a_default():
    from visualize.__main__ import KINDS, _parser
    out = cli("visualize", "--help").stdout
    for kind, text in KINDS.items():
        assert re.search(rf"^  {kind} +{re.escape(text[:40])}", out, re.M), kind
    sub = next(a for a in _parser()._actions if a.dest == "kind")
    for kind, parser in sub.choices.items():
        for act in parser._actions:
            if act.dest == "help" or not act.option_strings:
                continue
            assert act.help and (act.required or "default" in act.help), (kind, act.dest)
    assert "explain" in cli("tracing", "--help").stdout


def test_tracing_modules_import_nothing_of_ours():
    """The layering rule: only tracing's command line reaches up (for explain), and only when that runs."""
    ours = {"collectives", "visualize", "transports", "benchmarks"}
    for path in (ROOT / "tracing").glob("*.py"):
        tree = ast.parse(path.read_text())
        top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
        for node in ast.walk(tree) if path.name != "__main__.py" else top:
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                assert node.module.split(".")[0] not in ours, (path.name, node.module)
            elif isinstance(node, ast.Import):
                assert not {a.name.split(".")[0] for a in node.names} & ours, path.name
    code = ("import sys, tracing.__main__, tracing.log_facts, tracing.export, tracing.hang, tracing.nccl_log; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('collectives', 'visualize')))")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          check=True).stdout.strip() == "[]"


# --- curves ---------------------------------------------------------------------------------------------------
def test_curve_legend_has_no_repeated_entry_and_explains_the_cpu_model(tmp_path):
    series = [{"label": "nccl-lab AllReduce Ring n=8", "size": [1 << 20, 1 << 24], "busbw": [0.9, 1.2],
               "algbw": [0.5, 0.6], "file": "ring.json"},
              {"label": "nccl-lab ring n=8", "size": [1 << 20], "busbw": [0.8], "algbw": [None], "file": "mpi.json"},
              {"label": "nccl-lab AllReduce Ring n=8", "size": [1 << 20], "busbw": [1.0], "algbw": [None],
               "file": "again.json"},
              {"label": "NCCL model: cpu-lab n=8", "size": [1 << 20, 1 << 24], "busbw": [5.4, 5.9],
               "algbw": [None, None], "file": "model.json"}]
    kept = curves._unique(series, skip=("nccl-lab ring n=",))
    labels = [s["label"] for s in kept]
    assert len(labels) == len(set(labels)) == 3 and "nccl-lab ring n=8" not in labels
    assert "nccl-lab AllReduce Ring n=8 (again.json)" in labels
    note = curves.model_note(kept)
    assert note.startswith("The cpu-lab model sits 5-6x above what was measured") and "one rank per core" in note
    assert curves.model_note(kept[:1]) == ""
