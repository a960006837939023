"""NCCL's cost model: a worked example (one node of 8 GPUs, 16 channels of
20 GB/s, ``ncclTopoTuneModel`` worked by hand), crossovers, ties, the tree correction table, protocol
enablement, the tune CLI, and the communicator choosing what the model chooses."""
import json
import subprocess
import sys

import numpy as np
import pytest

from collectives.graph import tuning
from collectives.graph.cost_model import TREE_CORRECTION, CostModel, GraphFigures, Machine, log2i
from collectives.graph.presets import cpu_lab, dgx_a100, dgx_h100, pcie_box
from workers import Case
from conftest import ROOT, run_ranks

EXAMPLE = Machine("example", 1, 8, 90, ring=GraphFigures(16, 20, 20), tree=GraphFigures(16, 20, 20))
EXPECTED = {("Ring", "LL"): (15.0, 80.6), ("Ring", "LL128"): (40.6, 168.2), ("Ring", "Simple"): (56.0, 182.9),
            ("Tree", "LL"): (15.2, 38.7), ("Tree", "LL128"): (31.5, 114.5), ("Tree", "Simple"): (64.4, 147.2)}


def lat_bw(model, func, algo, proto):
    a, p = ("Tree", "Ring").index(algo), ("LL", "LL128", "Simple").index(proto)
    return float(model.lat[func][a][p]), float(model.bw[func][a][p])


def test_worked_example_tables():
    m = CostModel(EXAMPLE)
    for (algo, proto), (lat, bw) in EXPECTED.items():
        got = lat_bw(m, "AllReduce", algo, proto)
        assert (round(got[0], 1), round(got[1], 1)) == (lat, bw), (algo, proto, got)


def test_worked_example_choices():
    m = CostModel(EXAMPLE)
    assert m.choose("AllReduce", 1 << 20)[:2] == ("Ring", "LL")
    assert round(m.choose("AllReduce", 1 << 20)[2], 1) == 28.0
    assert m.choose("AllReduce", 16 << 20)[:2] == ("Ring", "LL128")
    assert round(m.choose("AllReduce", 16 << 20)[2], 1) == 140.3
    assert m.choose("AllReduce", 256 << 20)[:2] == ("Ring", "Simple")
    assert round(m.choose("AllReduce", 256 << 20)[2]) == 1524


def test_crossover_points_follow_from_the_formulas():
    m = CostModel(EXAMPLE, proto_env="LL,LL128", algo_env="Ring")
    (l1, b1), (l2, b2) = lat_bw(m, "AllReduce", "Ring", "LL"), lat_bw(m, "AllReduce", "Ring", "LL128")
    cross = (l2 - l1) / (1 / (1000 * b1) - 1 / (1000 * b2))  # lat1 + x/bw1 == lat2 + x/bw2
    assert m.choose("AllReduce", int(cross * 0.98))[1] == "LL"
    assert m.choose("AllReduce", int(cross * 1.02))[1] == "LL128"
    assert 3.5e6 < cross < 4.5e6


def test_ties_go_to_the_lower_algorithm_then_protocol():
    m = CostModel(EXAMPLE)
    for a in range(2):
        for p in range(3):
            m.lat["AllReduce"][a][p], m.bw["AllReduce"][a][p] = np.float32(10.0), np.float32(100.0)
    assert m.choose("AllReduce", 1 << 30)[:2] == ("Tree", "LL")
    m.bw["AllReduce"][0] = [np.float32(0.0)] * 3        # Tree unavailable
    assert m.choose("AllReduce", 1 << 30)[:2] == ("Ring", "LL")
    m.lat["AllReduce"][1][0] = np.float32(10.0001)     # a hair slower: strictly smaller wins ...
    assert m.choose("AllReduce", 0)[:2] == ("Ring", "LL128")
    # ... unless float32 (NCCL's type for time) cannot tell them apart: 10747.42 us for 1 GiB either way.
    assert m.choose("AllReduce", 1 << 30)[:2] == ("Ring", "LL")


@pytest.mark.parametrize("nbytes,index", [(0, None), (63, None), (64, 0), (127, 0), (128, 1), (64 << 22, 22),
                                          ((64 << 23) - 1, 22), (64 << 23, None), (1 << 40, None)])
def test_tree_correction_table_boundaries(nbytes, index):
    m = CostModel(EXAMPLE)
    for p in range(3):
        lat, bw = m.lat["AllReduce"][0][p], m.bw["AllReduce"][0][p]
        if index is not None:
            bw = np.float32(bw * np.float32(TREE_CORRECTION[p][index]))
        expect = float(np.float32(np.float32(lat) + np.float32(nbytes / (1000 * float(bw)))))
        assert m.time("AllReduce", 0, p, nbytes) == pytest.approx(expect, rel=1e-6)
    assert log2i(0) == -1 and log2i(1) == 0 and log2i(127) == 6


def test_ll128_auto_enable_rules_and_explicit_override():
    assert lat_bw(CostModel(pcie_box()), "AllReduce", "Ring", "LL128")[1] == 0       # SYS intra path
    assert lat_bw(CostModel(pcie_box(), proto_env="LL128,Simple"), "AllReduce", "Ring", "LL128")[1] > 0
    assert lat_bw(CostModel(dgx_a100()), "AllReduce", "Ring", "LL128")[1] > 0        # NVL / PIX, cc 80
    assert lat_bw(CostModel(cpu_lab(4)), "AllReduce", "Ring", "LL128")[1] == 0        # no GPU: cc 0


def test_restrictions_and_no_choice():
    assert CostModel(EXAMPLE, proto_env="Simple").choose("AllReduce", 8)[1] == "Simple"
    assert CostModel(EXAMPLE, algo_env="Tree").choose("AllReduce", 1 << 30)[0] == "Tree"
    assert CostModel(EXAMPLE, proto_env="^LL").choose("AllReduce", 1 << 20)[:2] != ("Ring", "LL")
    with pytest.raises(tuning.TuningError):
        CostModel(EXAMPLE, algo_env="Tree").choose("Broadcast", 1 << 20)  # Broadcast is Ring-only
    assert CostModel(cpu_lab(4), algo_env="Tree").choose("AllReduce", 1024)[0] == "Tree"  # the lab runs trees
    with pytest.raises(tuning.TuningError):
        CostModel(cpu_lab(4), algo_env="Tree").choose("ReduceScatter", 1024)            # but only for AllReduce


def test_dgx_h100_large_ring_simple_prediction_within_10_percent_of_published():
    # NVIDIA/nccl#1455 (8x H100 SXM, NCCL_ALGO=RING, 2-4 GiB): 365-370 GB/s busbw; NVIDIA/nccl-tests#212: ~370.
    m = CostModel(dgx_h100(), algo_env="Ring", proto_env="Simple")
    t = m.time("AllReduce", 1, 2, 4 << 30)
    busbw = (4 << 30) / (t * 1e3) * 2 * 7 / 8
    assert abs(busbw - 367.5) / 367.5 < 0.10


def test_tune_cli_json_and_series(tmp_path):
    series = tmp_path / "s.json"
    proc = subprocess.run([sys.executable, "-m", "collectives.tools.tune", "--preset", "dgx-h100", "-b", "1G", "-e", "1G",
                           "--json", "-", "--series", str(series)], capture_output=True, text=True, cwd=ROOT,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert {r["size"] for r in rows} == {1 << 30}
    assert set(rows[0]) == {"size", "algo", "proto", "time_us", "algbw", "busbw", "chosen"}
    assert [(r["algo"], r["proto"]) for r in rows if r["chosen"]] == [("Ring", "Simple")]
    assert "bandwidth term dominates" in proc.stderr and "runner-up" in proc.stderr
    pts = json.loads(series.read_text())["points"]
    assert pts[0]["size"] == 1 << 30 and pts[0]["busbw"] > 300


def test_tune_cli_explicit_machine():
    proc = subprocess.run([sys.executable, "-m", "collectives.tools.tune", "--nodes", "2", "--gpus", "4", "--cc", "80",
                           "--intra", "PIX", "--ring-channels", "2", "--ring-bw", "10", "-b", "8", "-e", "8"],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "latency term dominates" in proc.stdout


def test_the_cpu_tuner_prefers_tree_simple_for_small_allreduces_with_more_ranks_than_cores():
    """``cpu_tuner``: on one node with more ranks than cores, AllReduce of 512 B to 512 KiB -> Tree/Simple (its
    cost set to 0, as NCCL's example tuner does), to 128 KiB from 4 ranks a core; elsewhere, and where
    NCCL_ALGO/NCCL_PROTO disable it, the model's own choice."""
    over = CostModel(cpu_lab(4, ranks_per_core=2.0))
    assert [over.choose("AllReduce", s)[:2] for s in (256, 512, 4096, 65536, 512 << 10, (512 << 10) + 1)] == [
        ("Ring", "LL"), ("Tree", "Simple"), ("Tree", "Simple"), ("Tree", "Simple"), ("Tree", "Simple"),
        ("Ring", "Simple")]
    crowded = CostModel(cpu_lab(8, ranks_per_core=4.0))
    assert [crowded.choose("AllReduce", s)[:2] for s in (512, 128 << 10, (128 << 10) + 1)] == [
        ("Tree", "Simple"), ("Tree", "Simple"), ("Ring", "Simple")]
    assert "512 B to 128 KiB -> Tree/Simple" in crowded.m.tuner.describe()
    assert "512 B to 512 KiB -> Tree/Simple" in over.m.tuner.describe()
    assert over.choose("AllReduce", 4096)[2] == 0.0            # NCCL's estimated time of a tuned entry
    assert over.choose("AllGather", 4096)[0] == "Ring"          # AllReduce only: the tree runs nothing else
    plain = CostModel(cpu_lab(4))                                # one rank per core: the constants alone
    assert plain.choose("AllReduce", 4096)[:2] == ("Ring", "Simple")
    assert CostModel(cpu_lab(4, 2, ranks_per_core=2.0)).choose("AllReduce", 4096)[:2] == \
        CostModel(cpu_lab(4, 2)).choose("AllReduce", 4096)[:2]  # across nodes the NET row decides
    assert CostModel(cpu_lab(4, ranks_per_core=2.0), algo_env="Ring").choose("AllReduce", 4096)[0] == "Ring"
    assert CostModel(cpu_lab(4, ranks_per_core=2.0), "LL").choose("AllReduce", 4096)[:2] == ("Ring", "LL")
    assert "Tree/Simple (more ranks than cores on one node)" in over.m.tuner.describe()
    assert CostModel(cpu_lab(4, ranks_per_core=2.0, tuner=False)).choose("AllReduce", 4096)[:2] == \
        ("Ring", "Simple")                                       # NCCL_TUNER_PLUGIN=none


def test_the_cpu_tuner_prefers_ring_simple_for_registered_allreduces_across_nodes():
    """``cpu_tuner``'s second rule, on ``getCollInfo``'s ``regBuff``: across nodes, an AllReduce of 2 MiB or more
    whose send and receive buffers are registered -> Ring/Simple (only its NET steps skip the FIFOs, as NCCL
    registers NET buffers for the ring alone), and with several ranks a node also unregistered; at one rank a node
    unregistered, on one node, below 2 MiB, for other functions and where NCCL_ALGO leaves no ring, the model's own
    choice (Tree/Simple up to 8 MiB at 4 x 1 and 2 x 2)."""
    for nodes in (4, 2):
        m = CostModel(cpu_lab(4, nodes, ranks_per_core=2.0))
        for reg in (True, False):
            ring = reg or nodes == 2
            assert [m.choose("AllReduce", s, reg_buff=reg)[:2] for s in (1 << 20, (2 << 20) - 1, 2 << 20, 8 << 20)] \
                == [("Tree", "Simple")] * 2 + [("Ring" if ring else "Tree", "Simple")] * 2, (nodes, reg)
        assert m.choose("AllReduce", 4 << 20, reg_buff=True)[2] == 0.0
        alone = CostModel(cpu_lab(4, nodes, ranks_per_core=2.0, tuner=False))  # NCCL_TUNER_PLUGIN=none
        assert alone.choose("AllReduce", 4 << 20, reg_buff=True)[:2] == ("Tree", "Simple")
    one = CostModel(cpu_lab(4))
    assert one.choose("AllReduce", 4 << 20, reg_buff=True) == one.choose("AllReduce", 4 << 20)  # no NET step
    m = CostModel(cpu_lab(4, 4))
    assert m.choose("AllGather", 4 << 20, reg_buff=True)[2] != 0.0
    assert CostModel(cpu_lab(4, 4), algo_env="Tree").choose("AllReduce", 4 << 20, reg_buff=True)[:2] == \
        ("Tree", "Simple")
    assert "registered" in m.m.tuner.describe() and "registered" not in one.m.tuner.describe()
    assert "across nodes of several ranks" in CostModel(cpu_lab(4, 2)).m.tuner.describe()


def test_the_cpu_tuner_runs_its_ring_rule_on_one_channel_below_64_mib():
    """``getCollInfo``'s nChannels (``ncclGetAlgoInfo``: a non-zero value replaces ``topoGetAlgoInfo``'s
    nMaxChannels): where ``cpu_tuner``'s ring rule sets Ring/Simple (across nodes, from 2 MiB, registered or several
    ranks a node) below ``RING_ONE_CHANNEL_BELOW`` (64 MiB), with more ranks than cores, it asks one channel; at 64
    MiB and above, with a core a rank, and wherever the rule does not fire, 0 (NCCL's own count)."""
    sizes = ((2 << 20) - 1, 2 << 20, 32 << 20, (64 << 20) - 1, 64 << 20, 128 << 20)
    for nodes, reg in ((4, True), (2, True), (2, False)):
        m = CostModel(cpu_lab(4, nodes, ranks_per_core=2.0))
        assert [m.choose("AllReduce", s, reg_buff=reg).n_channels for s in sizes] == [0, 1, 1, 1, 0, 0], (nodes, reg)
        assert m.choose("AllReduce", 4 << 20, reg_buff=reg)[:3] == ("Ring", "Simple", 0.0)
    assert CostModel(cpu_lab(4, 4, ranks_per_core=2.0)).choose("AllReduce", 4 << 20).n_channels == 0  # 4 x 1 unreg.
    assert CostModel(cpu_lab(4, 4), algo_env="Tree").choose("AllReduce", 4 << 20, reg_buff=True).n_channels == 0
    assert CostModel(cpu_lab(4, 4, tuner=False)).choose("AllReduce", 4 << 20, reg_buff=True).n_channels == 0
    assert CostModel(cpu_lab(4, ranks_per_core=2.0)).choose("AllReduce", 4096).n_channels == 0  # the one-node rule
    assert CostModel(cpu_lab(4, 2)).choose("AllReduce", 4 << 20).n_channels == 0  # a core a rank: not measured
    assert "one channel below 64 MiB" in CostModel(cpu_lab(4, 2, ranks_per_core=2.0)).m.tuner.describe()
    assert "one channel" not in CostModel(cpu_lab(4, 2)).m.tuner.describe()


def test_a_tuned_channel_count_reaches_the_plan_and_the_reference():
    """The tuner's nChannels becomes the task's nMaxChannels (``ncclGetAlgoInfo``), so ``scheduleCollTasksToPlan``
    lays a 4 MiB registered AllReduce across 4 nodes on one of the communicator's two channels, and at 64 MiB on
    both; the reference, told the same count (``max_channels``), splits it the same way."""
    from collectives import enqueue
    from collectives.perf import reference
    m = CostModel(cpu_lab(4, 4, ranks_per_core=2.0))
    t = enqueue.default_tuning(4, 2, {"Simple": 1 << 25, "LL": 1 << 19, "LL128": 4915200}, nnodes=4)
    for count, channels in (((4 << 20) // 4 + 7, 1), ((64 << 20) // 4, 2)):
        p = enqueue.plan_coll(t, m.choose, "AllReduce", count, 4, reg_buff=True)
        assert (p.algo, p.proto, p.nchannels, p.tuner_channels) == ("Ring", "Simple", channels, 2 - channels)
        parts = reference.channel_parts("AllReduce", count, 4, 4, 2, "Simple", 1 << 25, max_channels=p.tuner_channels)
        assert [(w.part_offset, w.part_count, w.chunk_count) for w in p.works] == parts
    unreg = enqueue.plan_coll(t, m.choose, "AllReduce", (4 << 20) // 4, 4)
    assert (unreg.algo, unreg.nchannels, unreg.tuner_channels) == ("Tree", 2, 0)


def test_tuner_plugin_none_turns_the_cpu_tuner_off(monkeypatch):
    from collectives.graph.cpu_tuner import tuner_plugin
    monkeypatch.delenv("NCCL_TUNER_PLUGIN", raising=False)
    assert tuner_plugin()
    monkeypatch.setenv("NCCL_TUNER_PLUGIN", "None")  # strcasecmp, as ncclTunerPluginLoad
    assert not tuner_plugin()


@pytest.mark.parametrize("proto", ["", "LL,LL128"])
def test_communicator_choice_equals_the_model_for_the_cpu_preset(proto):
    env = {"NCCL_PROTO": proto} if proto else {}
    run_ranks(3, "auto_choice", env=env)


def test_tuning_table_is_logged_in_nccl_format():
    proc = run_ranks(2, "bitwise", Case(channels=1, counts=[7], dtypes=['float32']).arg(),
                     env={"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "TUNING"})
    lines = [ln for ln in proc.stdout.splitlines() if "NCCL INFO" in ln]
    assert any(ln.rstrip().endswith("|") and "AllReduce |" in ln and "/" in ln for ln in lines), lines[:10]
    assert any(ln.endswith("AllReduce: 28 Bytes -> Algo Ring proto LL channel{Lo..Hi}={0..0}") for ln in lines)
    assert any(ln.endswith(" Max NThreads |" + "".join(f" {n:14d} |" for n in (512, 640, 512, 512, 640, 256, 0, 0,
                                                                                640))) for ln in lines), lines[:10]
