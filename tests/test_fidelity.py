"""Fidelity to NCCL 2.30.7 (issue 13): thread counts, min/max with NaN, NCCL_PROTO prefixes, float rounding of the
cost model, the TUNING table, subsystem masks, log formats and how variables are read.  Each test names the NCCL
source it restates."""
import json
import re
import socket
import time

import ml_dtypes
import numpy as np
import pytest

from collectives import enqueue
from collectives.include.protocols import buffer_sizes
from collectives.perf import reference
from collectives.graph import connect
from collectives.misc import param, sockets
from collectives.misc.listener import SOCKET_TYPE_BOOTSTRAP, Listener, hello
from collectives.device.reduce_copy import RedOp, reduce_copy
from collectives.graph import tuning
from collectives.graph.cost_model import RING, SIMPLE, TREE, CostModel, GraphFigures, Machine
from collectives.graph.presets import cpu_lab, dgx_a100, dgx_h100, pcie_box
from collectives.graph.rings import ring_log_line
from workers import Case
from conftest import run_ranks
from tracing import debug

f32 = np.float32
BUFFS = {"Simple": 1 << 22, "LL": 1 << 19, "LL128": 4915200}


@pytest.fixture
def nccl_log(monkeypatch, capsys):
    """Run with a fresh NCCL_DEBUG state; returns a function giving the INFO/WARN text printed so far."""
    for var in ("NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE", "NCCL_NTHREADS", "NCCL_LL128_NTHREADS",
                "NCCL_MAX_NCHANNELS", "NCCL_MAX_NRINGS", "NCCL_SOCKET_NTHREADS", "NCCL_NSOCKS_PERTHREAD"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    monkeypatch.setattr(param, "_logged", set())
    debug.reset()
    yield lambda: capsys.readouterr().out
    debug.reset()


# --- 1. default thread count: tuning.cc ncclTopoTuneModel (simpleDefaultThreads) and getNthreads ---------------

def test_ring_simple_threads_default_to_256_on_a_pci_class_ring(nccl_log):
    # bwIntra * nChannels <= PCI_BW (12): 256; the lab's CPU ring is 1 channel x 6 GB/s.
    assert tuning.max_threads(6.0, 1)[("Ring", "Simple")] == 256
    assert tuning.max_threads(6.0, 2)[("Ring", "Simple")] == 256      # 12 <= 12
    assert tuning.max_threads(6.0, 3)[("Ring", "Simple")] == 512
    t = tuning.max_threads(6.0, 1)
    assert (t[("Tree", "Simple")], t[("Ring", "LL")], t[("Tree", "LL")], t[("Ring", "LL128")]) == (512, 512, 512, 640)
    assert t[("CollNetDirect", "Simple")] == 640 and t[("PAT", "Simple")] == 0


@pytest.mark.parametrize("var,value,want,line", [
    ("NCCL_NTHREADS", "100", 512, "Invalid NCCL_NTHREADS 100 (must be a multiple of 32)"),
    ("NCCL_NTHREADS", "544", 512, "Invalid NCCL_NTHREADS 544 (maximum 512)."),
    ("NCCL_NTHREADS", "32", 64, "Invalid NCCL_NTHREADS 32 (minimum 64)."),
    ("NCCL_NTHREADS", "128", 128, None),
    ("NCCL_LL128_NTHREADS", "96", 160, "Invalid NCCL_LL128_NTHREADS 96 (minimum 160)."),
])
def test_nthreads_variables_go_through_getnthreads(nccl_log, monkeypatch, var, value, want, line):
    monkeypatch.setenv(var, value)
    monkeypatch.setenv("NCCL_DEBUG_SUBSYS", "GRAPH")
    t = tuning.max_threads(6.0, 1)
    key = ("Ring", "LL128") if var == "NCCL_LL128_NTHREADS" else ("Ring", "Simple")
    assert t[key] == want
    out = nccl_log()
    if line:
        assert f"NCCL INFO {line}\n" in out
    else:
        assert "Invalid" not in out


def test_256_threads_keep_two_channels_where_512_would_shrink_to_one():
    # n=4, 12,288 float32 = 49,152 B: 2 ch x 512 thr x 64 B = 65,536 > 49,152 shrinks, 2 x 256 x 64 = 32,768 doesn't.
    t = enqueue.default_tuning(4, 2, BUFFS, max_threads=tuning.max_threads(6.0, 1))
    plan = enqueue.schedule_coll(t, "AllReduce", 12288, 4)
    assert plan.nchannels == 2
    assert reference.ring_simple_threads(search_channels=1) == 256
    parts = reference.channel_parts("AllReduce", 12288, 4, 4, 2, search_channels=1)
    assert len(parts) == 2
    assert [(w.part_offset, w.part_count, w.chunk_count) for w in plan.works] == parts


def test_bitwise_at_the_thread_count_boundary():
    """The communicator against the reference, which derives 256 threads and 2 channels on its own."""
    run_ranks(4, "bitwise", Case(channels=1, counts=[12288], dtypes=['float32'],
                                 colls=['allreduce', 'reducescatter']).arg())


# --- 2. min/max with NaN: reduce_kernel.h FuncMinMax (fminf/fmaxf, fmin/fmax, __hmin/__hmax) --------------------

NAN_TYPES = [np.float32, np.float64, np.float16, ml_dtypes.bfloat16]


def _u(a):
    return a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


@pytest.mark.parametrize("dt", NAN_TYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("op", ["max", "min"])
def test_minmax_drops_nan_operands(dt, op):
    a = np.array([np.nan, 1, np.nan, 3, -2], dt)
    b = np.array([2, np.nan, np.nan, -1, -np.inf], dt)
    want_num = {"max": [2, 1, None, 3, -2], "min": [2, 1, None, -1, -np.inf]}[op]
    out = np.empty(5, dt)
    reduce_copy(RedOp(op, np.dtype(dt), 2), [a, b], [out], pre_op=False, post_op=False)
    ref = reference.all_reduce([a, b], op)  # two ranks: one element each is reduced once
    canonical = (1 << (8 * np.dtype(dt).itemsize - 1)) - 1
    for got in (out, ref):
        for i, w in enumerate(want_num):
            if w is None:
                assert int(_u(got)[i]) == canonical, (i, hex(int(_u(got)[i])))
            else:
                assert float(got[i]) == w, (i, got[i])


def test_minmax_with_nan_bitwise_on_every_protocol():
    run_ranks(3, "nan_minmax", '["Simple", "LL", "LL128"]')


# --- 3. NCCL_PROTO with a prefix: tuning.cc protoEnable = 2 for LL128, parseList rewrites only named rows --------

def test_proto_prefix_leaves_other_functions_on_the_ll128_rule():
    cpu = CostModel(cpu_lab(4), "allreduce:LL,Simple")   # compute capability 0: the automatic rule says no LL128
    assert float(cpu.bw["Broadcast"][RING][1]) == 0.0
    assert float(cpu.bw["AllReduce"][RING][1]) == 0.0
    h100 = CostModel(dgx_h100(1), "allreduce:LL")          # Hopper over NVLink: the automatic rule says yes
    assert float(h100.bw["Broadcast"][RING][1]) > 0 and float(h100.bw["AllReduce"][RING][1]) == 0.0
    forced = CostModel(cpu_lab(4), "LL128;allreduce:Simple")  # named rows: explicit, even where auto says no
    assert float(forced.bw["Broadcast"][RING][1]) > 0


# --- 4. float32 at NCCL's points: ncclTopoGetAlgoTime and the .85 factor of ncclTopoTuneModel -------------------

def _nccl_time(model, func, a, p, nbytes):
    """ncclTopoGetAlgoTime in C's types: float bw/lat, `lat *= 1.4` in double, nBytes / (1000 * bw) in float."""
    bw, lat = f32(model.bw[func][a][p]), f32(model.lat[func][a][p])
    if bw == 0:
        return -1.0
    if a == RING and p == SIMPLE and model.m.n_nodes > 1 and func == "AllReduce" and \
            nbytes // (model.comm_channels * model.m.n_ranks) >= 64:
        lat = f32(float(lat) * (1.9 if model.m.min_comp_cap < 80 else 1.4))
    return float(f32(f32(lat * f32(1)) + f32(f32(nbytes) / f32(f32(1000) * bw))))


def test_algo_time_is_float_arithmetic():
    sizes = sorted({int(x) for x in np.geomspace(8, 1 << 31, 400)} | {3 * (1 << k) + 1 for k in range(30)})
    differ = 0
    for machine in (dgx_h100(2), dgx_a100(4), pcie_box(), cpu_lab(4, 2)):
        model = CostModel(machine)
        for nbytes in sizes:
            for a, p in ((RING, SIMPLE), (RING, 0), (RING, 1)):
                want = _nccl_time(model, "AllReduce", a, p, nbytes)
                assert model.time("AllReduce", a, p, nbytes) == want, (machine.name, a, p, nbytes)
                bw = float(model.bw["AllReduce"][a][p])
                differ += bw > 0 and float(f32(nbytes / (1000 * bw))) != float(f32(f32(nbytes) / f32(1000 * f32(bw))))
    assert differ > 0  # the double and float divisions do differ somewhere on these sizes


def test_tree_pattern_factor_is_a_double_product():
    for bw in (20.0, 21.7, 30.0, 13.3, 7.77):
        g = GraphFigures(12, bw, bw, "NVL", "PIX")
        plain = CostModel(Machine("m", 2, 8, 90, ring=g, tree=g, max_tree_pattern=1))
        tree = CostModel(Machine("m", 2, 8, 90, ring=g, tree=g, max_tree_pattern=3))
        for p in range(3):
            before = float(plain.bw["AllReduce"][TREE][p]) * 2   # undo the exact * .5
            assert float(tree.bw["AllReduce"][TREE][p]) == float(f32(f32(before * .85) * f32(.5))), (bw, p)


# --- 5. the TUNING table: tuning.cc ncclTopoTuneModel, rank 0's INFO(NCCL_TUNING) rows -------------------------

def test_tuning_table_has_three_blocks_and_max_nthreads():
    lines = CostModel(cpu_lab(4)).tuning_lines(tuning.max_threads(6.0, 1))
    assert len(lines) == 3 * 8
    assert lines[0] == "  Algorithm   |" + "".join(f" {'':>14}   {a:>14}   {'':>14} |"
                                                  for a in ("Tree", "Ring", "CollNetDirect"))
    assert lines[8] == "  Algorithm   |" + "".join(f" {'':>14}   {a:>14}   {'':>14} |"
                                                  for a in ("CollNetChain", "NVLS", "NVLSTree"))
    assert lines[16] == "  Algorithm   |" + f" {'':>14}   {'PAT':>14}   {'':>14} |"
    assert lines[17] == "  Protocol    |" + "".join(f" {p:>14} |" for p in ("LL", "LL128", "Simple") * 3)
    assert lines[2] == " Max NThreads |" + "".join(f" {n:14d} |" for n in (512, 640, 512, 512, 640, 256, 0, 0, 640))
    assert lines[18] == " Max NThreads |" + "".join(f" {n:14d} |" for n in (0, 0, 0))
    assert lines[3].startswith("    Broadcast |") and lines[7].startswith("    AllReduce |")
    assert len(lines[23].split("|")) == 1 + 3 + 1


# --- 6. subsystem masks: debug.cc flags & ncclDebugMask; shm.cc/net.cc log under INIT|SHM, INIT|NET -------------

def test_multi_bit_masks(nccl_log, monkeypatch):
    assert debug.enabled("INFO", "INIT|SHM") and debug.enabled("INFO", "INIT|NET")   # default INIT,BOOTSTRAP,ENV
    assert not debug.enabled("INFO", "SHM|NET")
    monkeypatch.setenv("NCCL_DEBUG_SUBSYS", "SHM")
    debug.reset()
    assert debug.enabled("INFO", "INIT|SHM") and not debug.enabled("INFO", "INIT")
    monkeypatch.setenv("NCCL_DEBUG_SUBSYS", "^INIT")
    debug.reset()
    assert debug.enabled("INFO", "INIT|NET") and not debug.enabled("INFO", "INIT")
    assert debug.enabled("INFO", "ALL")


def test_transport_lines_show_with_the_default_subsystems():
    proc = run_ranks(4, "bitwise", Case(channels=1, counts=[7], dtypes=['float32'], colls=['allreduce']).arg(),
        env={"NCCL_DEBUG": "INFO"},
                     nodes=2)
    out = proc.stdout
    assert "NCCL INFO Channel 00 : 0[0] -> 1[1] via SHM/direct\n" in out                 # 2.30.7's SHM line
    assert "NCCL INFO Channel 00/0 : 1[1] -> 2[0] [send] via NET/Socket/0\n" in out
    assert "NCCL INFO Channel 00/0 : 1[1] -> 2[0] [receive] via NET/Socket/0\n" in out


# --- 7. formats: enqueue.cc's per-call algorithm line, debug.cc's WARN prefix, rings.cc dumpLine ---------------

def test_algorithm_line_per_call_with_nccl_byte_count():
    proc = run_ranks(2, "bitwise", Case(channels=1, counts=[7, 100000], dtypes=['float32'],
                                        colls=['allreduce', 'allgather']).arg(),
                     env={"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "TUNING"})
    lines = [ln.split("NCCL INFO ", 1)[1] for ln in proc.stdout.splitlines() if "Bytes -> Algo" in ln]
    # rank 0 only, once per call (out-of-place and in-place), count x type size; AllGather: the per-rank count
    assert lines.count("AllReduce: 28 Bytes -> Algo Ring proto LL channel{Lo..Hi}={0..0}") == 2, lines
    assert lines.count("AllGather: 28 Bytes -> Algo Ring proto LL channel{Lo..Hi}={0..0}") == 2, lines
    assert sum(ln.startswith("AllReduce: 400000 Bytes -> Algo Ring proto Simple channel{Lo..Hi}={0..")
               for ln in lines) == 2, lines


def test_warn_lines_start_with_newline_and_timestamp(nccl_log):
    debug.warn("something failed")
    out = nccl_log()
    host = socket.gethostname().split(".")[0]
    assert re.fullmatch(rf"\n\[\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d\] {re.escape(host)}:\d+:\d+ \[0\] "
                        r"test_fidelity\.py:\d+ \(test_warn_lines_start_with_newline_and_timestamp\) "
                        r"NCCL WARN something failed\n", out), repr(out)


def test_ring_line_truncates_as_dumpline():
    # width 2 (100 ranks): the 38th rank overflows the 128-byte buffer, the end becomes "..." (127 characters)
    full = "Channel 00/02 :" + "".join(f" {r:2d}" for r in range(100))
    assert ring_log_line(0, 2, list(range(100))) == full[:124] + "..."
    # width 3 (200 ranks): 15 + 28 x 4 = 127 characters fill the buffer exactly; dumpLine stops, without "..."
    full = "Channel 00/02 :" + "".join(f" {r:3d}" for r in range(200))
    assert ring_log_line(0, 2, list(range(200))) == full[:127]
    assert ring_log_line(1, 2, list(range(28))) == "Channel 01/02 :" + "".join(f" {r:2d}" for r in range(28))


# --- 8. variables: param.cc ncclLoadParam (strtoll), init.cc computeBuffSizes, connect.cc ncclMaxNchannels,
#        tuning.cc parseList, socket.cc ncclFindInterfaces, net_socket.cc ncclNetSocketGetNsockNthread -------------

@pytest.mark.parametrize("raw,want", [("010", 8), ("0x10", 16), ("12abc", 12), (" 7", 7), ("abc", 0), ("-2", 99),
                                      ("+5", 5), ("99999999999999999999", 99)])
def test_integers_are_read_as_strtoll(nccl_log, monkeypatch, raw, want):
    monkeypatch.setenv("NCCL_LAB_TEST_X", raw)
    assert param.env_int("NCCL_LAB_TEST_X", 99) == want
    if raw.startswith("9999"):
        assert f"NCCL INFO Invalid value {raw} for NCCL_LAB_TEST_X, using default 99." in nccl_log()
    else:
        assert f"NCCL INFO NCCL_LAB_TEST_X set by environment to {want if raw != '-2' else -2}." in nccl_log()


def test_max_nchannels_zero_is_one(nccl_log, monkeypatch):
    monkeypatch.setenv("NCCL_MAX_NCHANNELS", "0")
    monkeypatch.setenv("NCCL_DEBUG_SUBSYS", "GRAPH")
    assert connect.max_nchannels() == 1
    assert "NCCL INFO User asked for a maximum of 0 channels, setting it to 1\n" in nccl_log()
    monkeypatch.setenv("NCCL_MAX_NCHANNELS", "100")
    assert connect.max_nchannels() == 64


def test_proto_tokens_are_not_stripped():
    with pytest.raises(tuning.TuningError, match="unrecognized element ' Simple'"):
        tuning.parse_list("LL, Simple", tuning.PROTOS, "NCCL_PROTO")
    assert tuning.parse_list("LL,,Simple", tuning.PROTOS, "NCCL_PROTO")["AllReduce"] == \
        {"LL": True, "LL128": False, "Simple": True}
    with pytest.raises(tuning.TuningError, match="All entries except the first"):
        tuning.parse_list(";LL", tuning.PROTOS, "NCCL_PROTO")   # strtok skips the ';', but not at offset 0


def test_any_buffsize_runs_bitwise():
    run_ranks(3, "bitwise", Case(channels=1, counts=[5, 300001], dtypes=['float32', 'float16'],
                                 colls=['allreduce', 'allgather', 'reduce']).arg(),
              env={"NCCL_BUFFSIZE": "1000001", "NCCL_LL_BUFFSIZE": "100003", "NCCL_LL128_BUFFSIZE": "600007",
                   "NCCL_PROTO": "Simple"})
    for proto in ("LL", "LL128"):
        run_ranks(3, "bitwise", Case(channels=1, counts=[5, 300001], dtypes=['float32'],
                                     colls=['allreduce', 'broadcast']).arg(),
                  env={"NCCL_BUFFSIZE": "1000001", "NCCL_LL_BUFFSIZE": "100003", "NCCL_LL128_BUFFSIZE": "600007",
                       "NCCL_PROTO": proto})


def test_simple_fifos_follow_the_cpu_nodes(monkeypatch):
    """computeBuffSizes with the lab's two deliberate defaults: Simple's FIFOs are 512 KiB when every rank is a CPU
    rank of one node (NCCL's 4 MiB steps stream through DRAM there) and 32 MiB when CPU ranks span several nodes
    (each step is one socket message, and loopback TCP costs less per byte in bigger ones); NCCL's 4 MiB otherwise;
    NCCL_BUFFSIZE always wins; the reference states the same rule from the environment alone."""
    monkeypatch.delenv("NCCL_BUFFSIZE", raising=False)
    assert buffer_sizes() == BUFFS                                        # NCCL's defaults (not CPU ranks)
    assert buffer_sizes(cpu_nodes=1) == {**BUFFS, "Simple": 1 << 19}
    assert buffer_sizes(cpu_nodes=3) == {**BUFFS, "Simple": 1 << 25}
    assert reference.config_from_env(2)["buff_sizes"] == {**BUFFS, "Simple": 1 << 19}
    assert reference.config_from_env(2, hosts=["a", "b"])["buff_sizes"] == {**BUFFS, "Simple": 1 << 25}
    monkeypatch.setenv("NCCL_BUFFSIZE", "1048576")
    assert buffer_sizes(cpu_nodes=1)["Simple"] == buffer_sizes(cpu_nodes=2)["Simple"] == 1 << 20
    assert reference.config_from_env(2)["buff_sizes"]["Simple"] == 1 << 20
    assert reference.config_from_env(2, hosts=["a", "b"])["buff_sizes"]["Simple"] == 1 << 20
    monkeypatch.delenv("NCCL_BUFFSIZE")
    for nodes, simple in ((1, 1 << 19), (2, 1 << 25)):
        out = run_ranks(2, "buff_sizes", nodes=nodes).stdout
        got = sorted(line for line in out.splitlines() if line.startswith("rank "))
        want = json.dumps({**BUFFS, "Simple": simple}, sort_keys=True)
        assert got == [f"rank {r} nodes {nodes} {want}" for r in range(2)], out


IFS = [("lo", "127.0.0.1", "255.0.0.0"), ("docker0", "172.17.0.1", "255.255.0.0"),
       ("virbr0", "192.168.122.1", "255.255.255.0"), ("eth0", "10.1.2.3", "255.255.0.0"),
       ("ib0", "10.9.0.5", "255.255.0.0")]


def test_interface_order_of_findinterfaces(monkeypatch):
    monkeypatch.delenv("NCCL_SOCKET_IFNAME", raising=False)
    monkeypatch.setenv("NCCL_COMM_ID", "10.1.0.1:5000")
    assert sockets.find_interface(IFS) == ("ib0", "10.9.0.5")              # ib first, before the COMM_ID subnet
    assert sockets.find_interface(IFS[:4]) == ("eth0", "10.1.2.3")         # then the subnet
    monkeypatch.delenv("NCCL_COMM_ID")
    assert sockets.find_interface([IFS[0], IFS[2], IFS[1]]) == ("docker0", "172.17.0.1")  # docker, lo, virbr
    assert sockets.find_interface([IFS[2], IFS[0]]) == ("lo", "127.0.0.1")
    assert sockets.find_interface([IFS[2], ("enp1s0", "10.0.0.2", "255.0.0.0")])[0] == "enp1s0"
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "e")                          # one character: ignored
    assert sockets.find_interface(IFS) == ("ib0", "10.9.0.5")
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "=lo")
    assert sockets.find_interface(IFS) == ("lo", "127.0.0.1")


def test_socket_threads_times_sockets_is_clamped(nccl_log, monkeypatch):
    monkeypatch.setenv("NCCL_SOCKET_NTHREADS", "8")
    monkeypatch.setenv("NCCL_NSOCKS_PERTHREAD", "16")
    assert sockets.socket_threads() == (8, 8)
    assert ("NCCL WARN NET/Socket : the total number of sockets is greater than the maximum allowed, setting "
            "NCCL_NSOCKS_PERTHREAD to 8\n") in nccl_log()
    monkeypatch.setenv("NCCL_SOCKET_NTHREADS", "20")
    monkeypatch.setenv("NCCL_NSOCKS_PERTHREAD", "1")
    assert sockets.socket_threads() == (16, 1)
    monkeypatch.delenv("NCCL_SOCKET_NTHREADS")
    monkeypatch.delenv("NCCL_NSOCKS_PERTHREAD")
    assert sockets.socket_threads() == (0, 1)


def test_socket_buffer_sizes_only_when_the_user_sets_them(monkeypatch):
    # ncclOsSocketSetFlags: NCCL_SOCKET_SNDBUF / NCCL_SOCKET_RCVBUF (default -1) reach SO_SNDBUF / SO_RCVBUF of
    # both ends; unset, the kernel's autotuned sizes stay (Linux reports twice what was set).
    def pair():
        srv = Listener(sockets.listen("127.0.0.1"), 7, SOCKET_TYPE_BOOTSTRAP, "test listener")
        c = sockets.connect(srv.address(), time.monotonic() + 5, "test peer", hello(7, SOCKET_TYPE_BOOTSTRAP))
        a, _, _ = srv.accept(time.monotonic() + 5, "test peer")
        srv.close()
        return c, a
    sizes = lambda s: (s.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF),  # noqa: E731
                       s.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF))
    for var in ("NCCL_SOCKET_SNDBUF", "NCCL_SOCKET_RCVBUF"):
        monkeypatch.delenv(var, raising=False)
    default = [sizes(s) for s in pair()]
    monkeypatch.setenv("NCCL_SOCKET_SNDBUF", "98304")
    monkeypatch.setenv("NCCL_SOCKET_RCVBUF", "163840")
    for s in pair():
        assert sizes(s) == (2 * 98304, 2 * 163840)
        assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    assert all(d != (2 * 98304, 2 * 163840) for d in default)


def test_reference_config_is_derived_from_the_environment(monkeypatch):
    """The reference's own reading of the environment: Postset doubling, the max/min clamp, forced protocol."""
    for var in ("NCCL_MIN_NCHANNELS", "NCCL_MAX_NRINGS", "NCCL_MIN_NRINGS", "NCCL_ALGO",
                "NCCL_NTHREADS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NCCL_MAX_NCHANNELS", "0")
    monkeypatch.setenv("NCCL_PROTO", "LL128")
    cfg = reference.config_from_env(nranks=4, search_channels=1)
    assert (cfg["nchannels"], cfg["proto"], cfg["algo"]) == (1, "LL128", None)
    monkeypatch.delenv("NCCL_MAX_NCHANNELS")
    monkeypatch.setenv("NCCL_MIN_NCHANNELS", "5")
    monkeypatch.delenv("NCCL_PROTO")
    cfg = reference.config_from_env(nranks=4, search_channels=1, hosts=["b", "a", "b", "a"])
    assert (cfg["nchannels"], cfg["proto"]) == (5, None)
    assert cfg["rings"] == [[0, 2, 1, 3]] * 5
    monkeypatch.setenv("NCCL_NTHREADS", "1000")      # not a multiple of 32: the maximum
    assert reference.ring_simple_threads(1) == 512
    json.dumps(cfg)


def test_automatic_choice_across_nodes_follows_nccl_rules_written_again():
    """workers._nccl_cpu_choice restates ncclTopoTuneModel's formulas for the CPU machine; 2 nodes x 2 ranks."""
    run_ranks(4, "auto_choice", nodes=2)


# --- real input as users paste it: nccl-tests output for `visualize curves` -------------------------------------

from pathlib import Path  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

from conftest import FIXTURES, ROOT  # noqa: E402
from visualize import curves, nccl_tests  # noqa: E402

DATA = Path(__file__).parent / "data"


def _rows(table):
    return [(r.size, r.out_of_place["busbw"], r.in_place["wrong"]) for r in table.rows]


def test_nccl_tests_with_launcher_prefixes_and_nccl_info_lines():
    text = (DATA / "all_reduce_perf_218.txt").read_text()
    want = [_rows(t) for t in nccl_tests.parse(text)]
    assert [len(w) for w in want] == [9, 2]
    info = "node01:12345:12399 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read"
    for prefix in ("0: ", "[1,0]<stdout>:", "[1,0]<stdout>: "):
        pasted = "\n".join(f"{prefix}{line}\n{prefix}{info}" if i % 3 == 0 else f"{prefix}{line}"
                           for i, line in enumerate(text.splitlines()))
        got = nccl_tests.parse(pasted)
        assert [_rows(t) for t in got] == want, prefix
        assert got[0].avg_busbw == pytest.approx(31.6178) and got[1].rows[0].in_place["wrong"] is None


def test_nccl_tests_paste_from_using_devices_and_two_processes_interleaved():
    lines = (DATA / "all_reduce_perf_218.txt").read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("# Using devices"))
    first = lines[start:lines.index("# Avg bus bandwidth    : 31.6178 ") + 1]
    t = nccl_tests.parse("\n".join(first))
    assert len(t) == 1 and len(t[0].rows) == 9 and t[0].hosts == {0: "node01", 1: "node01"}
    assert t[0].shape == (1, 2)
    other = [ln.replace("  0.00       0", "  0.00     N/A") for ln in first]   # a second rank's copy
    mixed = [ln for pair in zip(first, other) for ln in pair]
    got = nccl_tests.parse("\n".join(mixed))
    assert len(got) == 2 and [len(x.rows) for x in got] == [9, 9]
    assert [r.size for r in got[1].rows] == [r.size for r in t[0].rows]
    assert got[1].rows[0].out_of_place["wrong"] is None and got[0].rows[0].out_of_place["wrong"] == 0


def test_curve_legend_says_nodes_by_gpus():
    assert curves.load_series(str(DATA / "all_reduce_perf_218.txt"))[0]["label"].endswith("(1 x 2 GPUs)")
    real = FIXTURES / "nccl_tests" / "a3mega_2x8_h100_allreduce.txt"
    if not real.exists():
        pytest.skip("shared fixtures absent")
    assert curves.load_series(str(real))[0]["label"] == "NCCL: a3mega_2x8_h100_allreduce.txt (2 x 8 GPUs)"


def test_curves_on_a_file_without_a_table_is_one_line(tmp_path):
    bad = tmp_path / "notes.txt"
    bad.write_text("# nccl-tests version 2.13.9\nsomething went wrong before the first size\n")
    proc = subprocess.run([sys.executable, "-m", "visualize", "curves", str(bad), "-o", str(tmp_path / "x.png")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1 and "no nccl-tests table" in proc.stderr


# --- real input as users paste it: `--from-log` ---------------------------------------------------------------

from collectives.graph.replay import replay  # noqa: E402

LOG319 = DATA / "nccl_tests_319_2x8_h100_trees.log"
LOG311 = DATA / "nccl_tests_311_4x2_a100_collnet_trees.log"


def test_from_log_on_one_nodes_output():
    """A user pastes node lccn09's lines only: every entry present is replayed; the missing ranks are named."""
    lines = LOG319.read_text().splitlines()
    first = next(ln.split(":")[0] for ln in lines if "NCCL INFO comm" in ln and " rank 0 " in ln)
    one_node = "\n".join(ln for ln in lines if ln.startswith(first + ":"))
    rep = replay(one_node)
    assert rep["missing_ranks"] == list(range(8, 16)) and rep["nranks"] == 16 and rep["nnodes"] == 2
    assert rep["matched"] == rep["entries"] == 8 * 16, rep["mismatches"][:3]
    assert rep["inter_matched"] == rep["inter_links"] == 16
    log = tmp_log(one_node)
    proc = subprocess.run([sys.executable, "-m", "collectives.tree", "--from-log", log], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "# ranks not in the log: 8-15 (replaying the entries present)" in proc.stdout
    assert "matched 128 of 128" in proc.stdout


def tmp_log(text: str) -> str:
    import tempfile
    f = tempfile.NamedTemporaryFile("w", suffix=".log", delete=False)
    f.write(text)
    f.close()
    return f.name


def test_from_log_with_several_communicators_takes_the_largest_or_comm():
    both = LOG311.read_text() + "\n" + LOG319.read_text()
    rep = replay(both)
    assert [(c["nranks"], len(c["ranks"])) for c in rep["communicators"]] == [(8, 8), (16, 16)]
    assert rep["nranks"] == 16 and rep["matched"] == rep["entries"] == 256
    small = replay(both, comm=rep["communicators"][0]["id"])
    assert small["nranks"] == 8 and small["matched"] == small["entries"] == 24
    proc = subprocess.run([sys.executable, "-m", "collectives.graph.replay", tmp_log(both), "--comm", "x"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "no communicator 'x'" in proc.stderr


def test_from_log_of_one_process_creating_two_communicators():
    """The same processes create a 16-rank and then another 16-rank communicator (NCCL 2.30-style INIT log, no
    GRAPH lines): lines are split by the communicator each process announced last."""
    lines = [ln for ln in LOG319.read_text().splitlines() if not ln.startswith("#")]
    second = [ln.replace("comm 0x", "comm 0xb") if "NCCL INFO comm" in ln else ln for ln in lines]
    broken = [re.sub(r"->(\d+)->(-?\d+)", r"->\1->-1", ln) if "Trees" in ln else ln for ln in second]  # differs
    rep = replay("\n".join(lines + broken))
    assert len(rep["communicators"]) == 2 and rep["comm"] == "16-ranks#0"
    assert rep["matched"] == rep["entries"] == 256


def test_trees_line_cut_at_nccls_buffer_keeps_complete_entries():
    """init.cc prints ``Trees%s`` from a 1024-byte buffer: with 64 channels the line stops mid-entry."""
    from tracing.nccl_log import parse
    entries = "".join(f" [{c}] 15/-1/-1->14->13" for c in range(64))[:1022]
    log = parse("host:1:2 [6] NCCL INFO comm 0x1 rank 14 nRanks 16 nNodes 2 localRanks 8 localRank 6 MNNVL 0\n"
                f"host:1:2 [6] NCCL INFO Trees{entries}\n")
    n = entries.count("[") - 1
    assert sorted(log.trees) == list(range(n)) and log.trees[n - 1][14] == (13, [15])


@pytest.mark.parametrize("proto", ["Simple", "LL", "LL128"])
def test_any_buffsize_runs_bitwise_over_net(proto):
    """The proxy's slots are the kernel's (whole lines per slot) when a buffer size is not a multiple of them."""
    run_ranks(4, "bitwise", Case(channels=1, counts=[5, 300001], dtypes=['float32'],
                                 colls=['allreduce', 'allgather']).arg(),
        nodes=2,
              env={"NCCL_BUFFSIZE": "1000001", "NCCL_LL_BUFFSIZE": "100003", "NCCL_LL128_BUFFSIZE": "600007",
                   "NCCL_PROTO": proto, "NCCLLAB_TIMEOUT": "60"})
