"""``python -m collectives.tools.tune --topo XML --nodes K``: NCCL's TUNING table for a cluster from the multi-node
search (collectives.graph.init_cluster).  No real NCCL log of these machines across nodes carries a TUNING table,
so the table is checked against ncclTopoTuneModel's formulas for nNodes > 1 written out again here, on the NDv4 x2
(A100, AMD hosts) and NDv5 x2 (H100, Intel hosts) searches."""
import contextlib
import functools
import io
import math
import re
from unittest import mock

import pytest

from collectives.graph.init_cluster import run_cluster
from collectives.graph.topo import PATH_TYPES
from collectives.graph.topo_xml import StandIns
from collectives.tools import tune
from conftest import ROOT

NDV4 = ROOT / "topologies" / "azure-ndv4-topo.xml"
NDV5 = ROOT / "topologies" / "azure-ndv5-topo.xml"
ALGOS = ("Tree", "Ring", "CollNetDirect", "CollNetChain", "NVLS", "NVLSTree", "PAT")
FUNCS = ("Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce")
PATHS = ("LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "P2C", "PXN", "PHB", "SYS", "NET", "DIS")
# NCCL 2.30.7's default tuner constants, typed again from tuning.cc (rows: LL, LL128, Simple)
BASE = {"Tree": (6.8, 14.0, 8.4), "Ring": (6.6, 14.0, 8.4), "CollNetDirect": (0, 0, 0), "CollNetChain": (0, 0, 0),
        "PAT": (8.0, 8.0, 8.0)}
HW_NVL = {"Tree": (.6, 1.25, 4.0), "Ring": (.6, 1.9, 3.4), "CollNetDirect": (0, 0, 3.7), "CollNetChain": (0, 0, 2.8),
          "PAT": (0, 0, 4.0)}
HW_NET = {"Tree": (5.0, 8.5, 14), "Ring": (2.7, 4.0, 14.0), "CollNetDirect": (0, 0, 31), "CollNetChain": (0, 0, 30),
          "PAT": (0, 0, 14)}
LL_MAX_2NODES = {"intel": 39.0, "amd": 22.5}            # llMaxBws[Intel 0 | AMD 1][nNodes - 1], nNodes = 2
TREE_MAX_2NODES = {80: 23.6, 90: 41.4}                  # perChMaxTreeBws[cc index][1]
RING_LL128_MAX = {80: 20.0, 90: 36.7}
TREE_LL128_MAX_2NODES = {80: 20.0, 90: 36.7}
TREE_CORR = {"LL": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0),
             "LL128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0,
                       1.0),
             "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9)}
CASES = {"ndv4": (NDV4, 80, "amd"), "ndv5": (NDV5, 90, "intel")}


@functools.lru_cache(maxsize=None)
def _search(case: str, nranks: int | None):
    xml, sm, _ = CASES[case]
    return run_cluster(str(xml), 2, nranks, StandIns(sm=sm))


def search(case: str, nranks: int | None = None):
    """One multi-node search per case and module (the NDv4 2 x 8 search takes tens of seconds here)."""
    return _search(case, nranks)


@functools.lru_cache(maxsize=None)
def tuned(case: str, nranks: int | None = None) -> str:
    """The command's output; its search is the cached one (the same arguments)."""
    xml, sm, _ = CASES[case]
    argv = ["--topo", str(xml), "--sm", str(sm), "--nodes", "2", "-b", "8", "-e", "1G", "-f", "8"]
    if nranks:
        argv += ["--nranks", str(nranks)]
    out = io.StringIO()

    def cached(path, nodes, local, stand):
        assert (path, nodes, local, stand) == (str(xml), 2, nranks, StandIns(sm=sm))
        return search(case, nranks)
    with contextlib.redirect_stdout(out), mock.patch("collectives.graph.init_cluster.run_cluster", cached):
        assert tune.main(argv) == 0
    return out.getvalue()


def table(text: str) -> dict:
    """{(func, algo, proto): (lat, bw)} from the printed TUNING rows."""
    lines = [ln[2:] for ln in text.splitlines() if ln.startswith("# ") and "|" in ln]
    out, algos = {}, []
    for ln in lines:
        cells = [c.strip() for c in ln.split("|")]
        if cells[0] == "Algorithm":
            algos = [c for c in cells[1:] if c]
        elif cells[0] in FUNCS:
            vals = [c for c in cells[1:] if c]
            for i, v in enumerate(vals):
                lat, bw = v.split("/")
                out[(cells[0], algos[i // 3], ("LL", "LL128", "Simple")[i % 3])] = (float(lat), float(bw))
    return out


def expected(case: str, nranks: int | None = None) -> dict:
    """ncclTopoTuneModel for nNodes = 2, from the aligned graphs, in plain doubles; NCCL_NET's latencies, the
    inter-node bandwidth (bwIntra while nNodes <= 2), the Tree and LL128 factors across nodes, the net overhead."""
    _, sm, cpu = CASES[case]
    r = search(case, nranks)
    ring, tree = r.aligned
    nch = min(ring.n_channels, tree.n_channels)
    nodes, n = 2, r.nranks
    ppn = n // nodes
    graphs = {"Tree": tree, "Ring": ring, "PAT": tree}
    tree_pattern = max(t.pattern for t in r.trees)
    overhead = 2.0 if cpu == "amd" else 1.0
    pat = ppn == 1
    out = {}
    for func in FUNCS:
        nsteps = {"AllReduce": 2 * (n - 1), "AllGather": n - 1, "ReduceScatter": n - 1}.get(func, n)
        for algo in ALGOS:
            for pi, proto in enumerate(("LL", "LL128", "Simple")):
                lat = bw = 0.0
                g = graphs.get(algo)
                if algo == "Ring":
                    bus = nch * g.bw_intra
                    bus = {"LL": min(LL_MAX_2NODES[cpu], bus / 2), "LL128": min(bus * .92, nch * RING_LL128_MAX[sm]),
                           "Simple": bus}[proto]
                    bw = bus * n / nsteps
                    hw = HW_NET["Ring"][pi]
                    if func in ("Broadcast", "Reduce"):
                        lat = BASE["Ring"][pi] + (hw if g.same_channels else
                                                  nsteps * (HW_NET["Tree"][pi] if proto == "Simple" else hw))
                    else:
                        intra = max(HW_NVL["Ring"][pi], overhead * (3 if proto == "Simple" else 1))
                        inter_steps = 2 if func == "AllReduce" else 1
                        inter = HW_NET["Tree" if ppn == 1 else "Ring"][pi]
                        lat = BASE["Ring"][pi] + (nsteps - inter_steps) * intra + inter_steps * inter
                elif algo == "Tree" and func == "AllReduce":
                    bus = min(nch * g.bw_intra * .92, nch * TREE_MAX_2NODES[sm])
                    if proto == "LL":
                        bus = min(bus / 3.8, LL_MAX_2NODES[cpu])
                    if proto == "LL128":
                        bus = min(bus * 120 / 128, nch * TREE_LL128_MAX_2NODES[sm])
                    if tree_pattern == 3:
                        bus *= .85
                    bw = bus / 2
                    inter = HW_NET["Tree"][pi]
                    lat = BASE["Tree"][pi] + 2 * ((ppn - 1) * HW_NVL["Tree"][pi] + 1 * inter)
                elif algo == "CollNetDirect" and func not in ("Broadcast", "Reduce"):
                    inter = HW_NET["Tree" if ppn == 1 else "CollNetDirect"][pi]
                    lat = 2 * (min(1, ppn - 1) * HW_NVL["CollNetDirect"][pi] + (ppn - 1) * .4) + inter
                elif algo == "CollNetChain" and func == "AllReduce":
                    inter = HW_NET["Tree" if ppn == 1 else "CollNetChain"][pi]
                    lat = 2 * (ppn - 1) * HW_NVL["CollNetChain"][pi] + inter
                elif algo == "PAT" and func in ("AllGather", "ReduceScatter") and proto == "Simple" and pat:
                    bw = nch * g.bw_intra * .75
                    lat = BASE["PAT"][2] + 1 * (HW_NET["Tree"][2] / 3.5) + n * 2.8
                # LL128 across nodes: path types up to PXB (sm < 90) or PXN (sm >= 90), NVB inside the node
                if proto == "LL128" and algo in graphs:
                    limit = PATHS.index("PXN" if sm >= 90 else "PXB")
                    if not (PATHS.index(PATH_TYPES[g.type_inter]) <= limit
                            and PATHS.index(PATH_TYPES[g.type_intra]) <= PATHS.index("NVB")):
                        bw = 0.0
                out[(func, algo, proto)] = (lat, bw)
    return out


def test_the_command_no_longer_refuses_nodes():
    text = tuned("ndv4")
    assert "2 node(s) x 8" in text
    assert "multi-node search is not ported" not in text


@pytest.mark.parametrize("case", ["ndv4", "ndv5"])
def test_table_matches_the_formulas_across_nodes(case):
    ours, want = table(tuned(case)), expected(case)
    assert len(ours) == 5 * 7 * 3
    for key, (lat, bw) in want.items():
        assert ours[key][0] == pytest.approx(lat, abs=.051), key
        assert ours[key][1] == pytest.approx(bw, abs=.051), key


def test_table_has_every_block_and_the_zero_bandwidth_latencies():
    """Every algorithm block is printed; CollNet's latencies are computed with collnet off (bandwidth 0)."""
    text = tuned("ndv4")
    rows = [ln for ln in text.splitlines() if ln.startswith("# ") and "|" in ln]
    assert len(rows) == 3 * 8
    t = table(text)
    assert t[("AllReduce", "CollNetDirect", "LL")] == (5.6, 0.0)          # 2 * 7 * 0.4, no hardware term
    assert t[("AllReduce", "CollNetDirect", "Simple")] == (44.0, 0.0)     # 2 * (3.7 + 2.8) + 31
    assert t[("AllReduce", "CollNetChain", "Simple")] == (69.2, 0.0)      # 2 * 7 * 2.8 + 30
    assert t[("AllGather", "CollNetDirect", "Simple")] == (44.0, 0.0)
    assert t[("AllReduce", "NVLS", "Simple")] == (0.0, 0.0)
    assert t[("AllGather", "PAT", "Simple")] == (0.0, 0.0)                # 8 GPUs per node: no PAT


def test_fields_filled_as_init_transports_rank():
    from collectives.graph.topo_feed import cluster_machine
    r = search("ndv4")
    m = cluster_machine(r, "ndv4 x2")
    ring, tree = r.aligned
    assert (m.n_nodes, m.gpus_per_node, m.n_ranks) == (2, 8, 16)
    assert (m.min_comp_cap, m.max_comp_cap, m.cpu_arch, m.cpu_vendor) == (80, 80, "x86", "amd")
    assert m.ring.n_channels == m.tree.n_channels == min(ring.n_channels, tree.n_channels)
    assert (m.ring.bw_intra, m.ring.bw_inter, m.tree.bw_intra) == (ring.bw_intra, ring.bw_inter, tree.bw_intra)
    assert m.ring.type_inter == PATH_TYPES[ring.type_inter]
    assert m.comm_channels == r.channels[0].n
    assert m.max_tree_pattern == max(t.pattern for t in r.trees)
    m5 = cluster_machine(search("ndv5"), "ndv5 x2")
    assert (m5.cpu_vendor, m5.max_tree_pattern) == ("intel", 3)


def rows(text: str) -> dict:
    """{size: (cells, reason)} from the per-size lines: the size in 12 columns, then six 20-column cells."""
    out, last = {}, None
    for ln in text.splitlines():
        if re.match(r"  +\d+ ", ln):
            last = int(ln[2:14])
            out[last] = [ln[15 + 21 * i:15 + 21 * i + 20] for i in range(6)]
        elif last is not None and ln.strip().startswith("->"):
            out[last] = (out[last], ln.strip()[3:])
    return out


@pytest.mark.parametrize("case", ["ndv4", "ndv5"])
def test_times_apply_the_ring_plateau_and_tree_corrections(case):
    """ncclTopoGetAlgoTime across nodes: Ring/Simple AllReduce latency x1.4 (sm >= 80) once a rank's share per
    channel reaches 64 B, Tree bandwidth times the correction factor of its size."""
    text = tuned(case)
    want = expected(case)
    r = search(case)
    nch, n = r.channels[0].n, r.nranks
    sizes = rows(text)
    assert list(sizes) == [8 * 8 ** i for i in range(10)]
    for size, (cells, reason) in sizes.items():
        assert sum(c.strip().endswith("*") for c in cells) == 1, cells
        times = {}
        for (algo, proto), cell in zip([(a, p) for a in ("Tree", "Ring") for p in ("LL", "LL128", "Simple")], cells):
            if cell.strip() != "-":
                times[(algo, proto)] = float(cell.split()[0])
        for (algo, proto), t in times.items():
            lat, bw = want[("AllReduce", algo, proto)]
            if algo == "Tree":
                log = int(math.log2(size >> 6)) if size >> 6 else -1
                if 0 <= log < 23:
                    bw *= TREE_CORR[proto][log]
            if algo == "Ring" and proto == "Simple" and size // (nch * n) >= 64:
                lat *= 1.4
            assert t == pytest.approx(lat + size / (1000 * bw), rel=1e-3, abs=.051), (size, algo, proto)
        best = min(times, key=lambda k: times[k])
        assert reason.startswith(f"{best[0]}/{best[1]}:"), (size, reason)


def test_one_gpu_per_node_opens_pat_and_the_tree_net_latency():
    """nNodes == nRanks: ncclPatEnable's automatic rule allows PAT, and ppn = 1 takes NET's Tree latencies."""
    text = tuned("ndv5", 1)
    assert "2 node(s) x 1" in text
    ours, want = table(text), expected("ndv5", 1)
    assert ours[("AllGather", "PAT", "Simple")][1] > 0
    for key, (lat, bw) in want.items():
        assert ours[key][0] == pytest.approx(lat, abs=.051), key
        assert ours[key][1] == pytest.approx(bw, abs=.051), key


def test_topo_with_a_preset_still_refused(capsys):
    assert tune.main(["--topo", str(NDV4), "--preset", "dgx-a100", "--nodes", "2"]) == 2
    assert "--preset" in capsys.readouterr().err


@pytest.mark.parametrize("case,type_inter,on", [("ndv4", "PXB", True), ("ndv4", "PXN", False),
                                                ("ndv5", "PXN", True), ("ndv5", "PHB", False)])
def test_ll128_across_nodes_follows_the_nic_path(case, type_inter, on):
    """LL128's automatic rule reads typeInter: up to PXB below sm90, up to PXN from sm90 (NCCL_LL128_C2C=1)."""
    from dataclasses import replace

    from collectives.graph.cost_model import CostModel
    from collectives.graph.topo_feed import cluster_machine
    m = cluster_machine(search(case), case)
    m = replace(m, ring=replace(m.ring, type_inter=type_inter), tree=replace(m.tree, type_inter=type_inter))
    model = CostModel(m)
    for algo in (0, 1):
        assert (model.bw["AllReduce"][algo][1] > 0) == on, (algo, type_inter)
        assert model.bw["AllReduce"][algo][2] > 0 and model.lat["AllReduce"][algo][1] > 0
