"""The compiled ring kernels (``collectives/device/compiled.py`` over ``ll_compiled.py`` for LL and LL128 and
``simple_compiled.py`` for Simple) against the readable primitives: the same bits for every collective, type, op
and odd size, edge values included, over SHM and over NET with its proxy, with ranks that sleep (more ranks than
cores); a mismatch still named; what runs compiled, and the INFO line that says so.  Simple's own checks (small
FIFOs, slices, the loops, compiled and readable ranks together) are in ``test_simple_compiled.py``."""
import re
import time

import numpy as np
import pytest

from collectives import enqueue
from collectives.device import compiled, compiled_common
from conftest import run_ranks
from workers import ALL, Case

EVERY_OP = {  # per protocol: counts (odd, one step, many steps) and the FIFO size that makes them wrap
    "LL": ([1, 7, 4099, 40_009], {}),
    "LL128": ([1, 7, 481, 4099, 40_009], {"NCCL_LL128_BUFFSIZE": str(16 << 10)}),
    "Simple": ([1, 7, 4099, 40_009, 300_001], {}),
}


@pytest.mark.parametrize("proto", list(EVERY_OP))
def test_compiled_matches_readable_two_ranks_every_op(proto):
    """LL128's lines go through the LL kernel (``ctl[LL128]``): the warp layout of each 2048-byte wire slice, whole
    zero-padded slices, 64-bit flags; its 16 KiB FIFO makes every call many steps."""
    counts, env = EVERY_OP[proto]
    case = Case(counts=counts, dtypes=["float32", "float64", "int8", "uint64"], ops=["sum", "prod", "min", "max"],
                channels=2, proto=proto)
    proc = run_ranks(2, "compiled_paths", case.arg(), env=env)
    assert proc.stdout.count(" ok ") == 2, proc.stdout


@pytest.mark.parametrize("proto,counts", [("LL", [3, 5000, 65_537]), ("LL128", [3, 5000, 65_537]),
                                          ("Simple", [3, 5000, 200_003])])
def test_compiled_matches_readable_over_net_with_sleeping_ranks(proto, counts):
    # 4 ranks on 2 emulated nodes: NET between them (the proxy reads LL's flags, LL128's flags and tail, Simple's
    # tail, and connFifo), SHM inside; more ranks than this machine's 2 cores, so blocked ranks sleep on the
    # doorbell, tail and head.
    case = Case(counts=counts, dtypes=["float32", "int32" if proto != "Simple" else "int64"],
                ops=["sum", "max" if proto != "Simple" else "min"], channels=1, colls=ALL, proto=proto)
    proc = run_ranks(4, "compiled_paths", case.arg(), nodes=2)
    assert proc.stdout.count(" ok ") == 4, proc.stdout


@pytest.mark.parametrize("n,nodes,mixed,fan", [(5, 1, False, 1), (6, 3, False, 2), (6, 3, True, 2)])
def test_compiled_tree_matches_readable(n, nodes, mixed, fan):
    # Tree/Simple AllReduce (runTreeSplit) compiled against the readable primitives, bitwise: a chain on one node
    # (one peer each way); 3 emulated nodes x 2 over NET, whose trees give a rank two down peers (FanAsymmetric<3,
    # 1> up, <1, 3> down), also with compiled and readable ranks in one collective (sharing FIFOs, head, tail and
    # step counters).
    case = Case(counts=[1, 1001, 70_001], dtypes=["float32", "int64"], ops=["sum", "prod", "max", "min"],
                channels=1, colls=["allreduce"], proto="Simple", mixed=mixed)
    proc = run_ranks(n, "compiled_paths", case.arg(), nodes=nodes, env={"NCCL_ALGO": "Tree"})
    assert proc.stdout.count(" ok ") == n, proc.stdout
    fans = [int(f) for f in re.findall(r"tree fan (\d+)", proc.stdout)]
    assert max(fans) == fan, proc.stdout


def test_kernel_caches_are_stamped_with_every_source_they_are_built_from(tmp_path):
    """``kernel_cache``: numba stamps a cached function with a hash of its own file only, so a kernel that inlines
    ``compiled_common``'s helpers kept stale code when only that file changed.  The kernels' entries carry a hash of
    all of ``SOURCES``, which follows every file's content; other cached functions keep numba's stamp."""
    import os
    from collectives import api
    from collectives.device import kernel_cache, ll_compiled, ll_kernels, simple_compiled
    assert os.path.abspath(compiled_common.__file__) in kernel_cache.SOURCES
    for fn in (ll_compiled.run_ops, simple_compiled.run_ops, compiled_common.reduce, ll_kernels.ll128_pack):
        assert fn._cache._impl.locator.get_source_stamp() == kernel_cache.sources_stamp(), fn
    assert api._host_starts._cache._impl.locator.get_source_stamp() != kernel_cache.sources_stamp()
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("x = 1\n")
    b.write_text("y = 2\n")
    before = kernel_cache.sources_stamp((str(a), str(b)))
    assert kernel_cache.sources_stamp((str(a), str(b))) == before
    b.write_text("y = 20\n")
    assert kernel_cache.sources_stamp((str(a), str(b))) != before


def test_crowded_calls_of_256_kib_or_more_sleep_after_fewer_yields():
    """``compiled.waits_for``: with 4 ranks a core or more and no proxied connection, a call moving
    ``FEW_YIELDS_FROM`` bytes or more (its larger buffer) yields ``FEW_YIELDS`` times before it sleeps, a smaller one
    ``YIELDS_BEFORE_SLEEP``; under 4 ranks a core, with a proxy, or a core each, the policy does not depend on the
    size."""
    few, many = compiled.FEW_YIELDS, compiled.YIELDS_BEFORE_SLEEP
    assert compiled.FEW_YIELDS_FROM == 256 << 10 and few < many and compiled.FEW_YIELDS_RANKS_PER_CORE == 4
    assert compiled.waits_for(True, False, (256 << 10) - 1, 4) == (2, compiled.SLEEPS_EACH, many)
    assert compiled.waits_for(True, False, 256 << 10, 4) == (2, compiled.SLEEPS_EACH, few)
    assert compiled.waits_for(True, False, 128 << 20, 6.5) == (2, compiled.SLEEPS_EACH, few)
    assert compiled.waits_for(True, False, 128 << 20, 3.5) == (2, compiled.SLEEPS_EACH, many)
    for sleep, proxied in ((False, False), (False, True), (True, True)):
        assert compiled.waits_for(sleep, proxied, 8, 4) == compiled.waits_for(sleep, proxied, 128 << 20, 4) == \
            compiled.WAITS[sleep, proxied]


def test_compiled_waits_of_oversubscribed_ranks_leave_no_sleep_mark():
    # 3 ranks on this machine's 2 cores: a blocked compiled call yields, then marks and sleeps on the doorbell or
    # head itself (rank 0 comes late to the first call of each kind, so that the others do sleep); after every
    # call no mark of a rank may stay set (a stale one makes every post a futex wake) and the bits stay the
    # readable path's.
    case = Case(counts=[3, 5000], dtypes=["float32", "int64"], ops=["sum", "min"], channels=1,
                colls=["allreduce", "allgather", "reducescatter"])
    proc = run_ranks(3, "compiled_paths", case.arg())
    assert proc.stdout.count(" ok ") == 3, proc.stdout


def test_a_mark_set_on_tail_is_taken_back_after_the_channel_moved_on_to_head():
    """Regression (CI, Simple with 4 KiB FIFOs): a call armed on its tail's mark, moved, and by then waited for
    head; taking the mark back looked up the wait's word again and cleared head's, so tail's stayed set."""
    ctl = np.zeros(compiled_common.HEADER + compiled_common.COLS, np.int64)
    words = {k: np.zeros(1, np.uint64 if k in ("head", "tail") else np.uint32) for k in
             ("head", "tail", "head_mark", "tail_mark")}
    st = ctl[compiled_common.HEADER:]
    for col, k in ((compiled_common.SHEAD, "head"), (compiled_common.RTAIL, "tail"),
                   (compiled_common.S_HEADSLEEP, "head_mark"), (compiled_common.R_TAILSLEEP, "tail_mark")):
        st[col] = words[k].ctypes.data
    ctl[compiled_common.NCH], ctl[compiled_common.MAX_IDLE], ctl[compiled_common.SLEEPS] = 1, 1, 1
    st[compiled_common.END], st[compiled_common.WAIT] = 1, compiled_common.WAIT_TAIL
    w = compiled_common.new_wait()
    assert not compiled_common.blocked(ctl, 1, w)  # idle long enough: mark tail's line, look once more
    assert words["tail_mark"][0] == 1 and words["head_mark"][0] == 0
    st[compiled_common.WAIT] = compiled_common.WAIT_HEAD  # the data came: now it waits for credit
    compiled_common.moved(ctl, w)
    assert words["tail_mark"][0] == 0 and words["head_mark"][0] == 0


@pytest.mark.parametrize("proto", ["LL", "Simple"])
def test_mismatch_is_still_named_on_the_compiled_path(proto):
    t0 = time.monotonic()
    proc = run_ranks(3, "mismatch", "count", env={"NCCLLAB_TIMEOUT": "20", "NCCL_PROTO": proto}, check=False,
                     timeout=120)
    assert proc.returncode != 0 and "unexpected success" not in proc.stdout
    assert "collective mismatch" in proc.stderr and "rank 1" in proc.stderr, proc.stderr[-3000:]
    assert time.monotonic() - t0 < 20


@pytest.mark.parametrize("mode,line", [("1", "Ring/LL, Ring/LL128, Ring/Simple and Tree/Simple collectives run "
                                              "compiled"),
                                       ("0", "Ring/LL (NCCLLAB_LL_COMPILED=0) run the readable primitives")])
def test_info_line_says_which_path_runs(mode, line):
    proc = run_ranks(2, "bitwise", Case(counts=[5], dtypes=["float32"], colls=["allreduce"]).arg(),
                     env={"NCCL_DEBUG": "INFO", "NCCL_PROTO": "LL", "NCCLLAB_LL_COMPILED": mode})
    assert line in proc.stdout + proc.stderr


def test_what_runs_compiled(monkeypatch):
    t = enqueue.default_tuning(2, 2, {"LL": 1 << 19, "LL128": 1 << 22, "Simple": 1 << 22})
    ll = enqueue.schedule_coll(t, "AllReduce", 1000, 4, "Ring", "LL")
    simple = enqueue.schedule_coll(t, "AllReduce", 1000, 4, "Ring", "Simple")
    f32 = np.dtype(np.float32)
    assert compiled.eligible(ll, f32, "sum", tracing=False)
    tree = enqueue.schedule_coll(t, "AllReduce", 1000, 4, "Tree", "Simple")  # runTreeSplit's groups as rows
    assert compiled.eligible(tree, f32, "sum", tracing=False)
    monkeypatch.setenv("NCCLLAB_TREE_UPDOWN", "1")  # runTreeUpDown: one group whose peers change mid-call
    assert not compiled.eligible(tree, f32, "sum", tracing=False)
    monkeypatch.delenv("NCCLLAB_TREE_UPDOWN")
    assert not compiled.eligible(ll, f32, "avg", tracing=False)          # PreMulSum: readable path
    assert not compiled.eligible(ll, np.dtype(np.float16), "sum", False)  # no native half in numba
    assert not compiled.eligible(ll, f32, "sum", tracing=True)           # the trace needs every step's events
    assert compiled.eligible(simple, f32, "sum", tracing=False)               # Ring/Simple too (its own tests)
    ll128 = enqueue.schedule_coll(t, "AllReduce", 1000, 4, "Ring", "LL128")
    assert compiled.eligible(ll128, f32, "sum", tracing=False)               # LL128: the LL kernel, its lines
    tree_ll = enqueue.schedule_coll(t, "AllReduce", 1000, 4, "Tree", "LL")
    assert not compiled.eligible(tree_ll, f32, "sum", tracing=False)          # Tree/LL: readable primitives


def test_recorded_calls_are_run_rings():
    """The schedule is recorded from ``all_reduce.run_ring`` itself: 2(n-1)+1 calls per loop, NCCL's order."""
    from collectives.device import launch
    from collectives.graph.rings import setup_ring
    t = enqueue.default_tuning(4, 1, {"LL": 1 << 19, "LL128": 1 << 22, "Simple": 1 << 22})
    plan = enqueue.schedule_coll(t, "AllReduce", 64, 4, "Ring", "LL")
    rows = compiled.record(launch.RING["AllReduce"][0], setup_ring([0, 1, 2, 3], 1), plan.works[0], 4, -1,
                              False, 4, 32768)
    names = [compiled_common.PRIMS[p] for p in rows[:, compiled_common.PRIM]]
    assert names == ["send", "recv_reduce_send", "recv_reduce_send", "recv_reduce_copy_send", "recv_copy_send",
                     "recv_copy_send", "recv"]
    assert rows[:, compiled_common.NELEM].sum() == 7 * 16
