"""Collectives inside a group (``collectives/group_plan.py`` over ``enqueue.prepare_colls`` / ``schedule_colls``:
NCCL's ncclPrepareTasks, scheduleCollTasksToPlan, then scheduleP2pTasksToPlan into the same plan): the planner
against NCCL's rules worked out by hand here, then real ranks over SHM and over NET (2 emulated nodes), bitwise
against separate calls and the reference, the one plan read back from the trace."""
import glob
import json

import pytest

from collectives import enqueue
from collectives.include.protocols import buffer_sizes
from collectives.perf import reference
from conftest import run_ranks

BUFFS = buffer_sizes()


def tuning(n: int, nch: int) -> enqueue.Tuning:
    return enqueue.default_tuning(n, nch, BUFFS)


def test_one_task_schedules_as_the_reference_splits_a_call():
    """A plan of one task is the single call's split, as ``reference.channel_parts`` writes it separately."""
    t = tuning(4, 4)
    for count in (1, 7, 1000, 4097, 65536, 100003, 1 << 20, 3 << 20):
        for proto in ("LL", "LL128", "Simple"):
            n_max, n_warps = enqueue.topo_get_algo_info(t, "Ring", proto, count * 4)
            [grouped] = enqueue.schedule_colls(t, [enqueue.CollSpec("AllReduce", count, 4, "Ring", proto, n_max,
                                                                    n_warps)])
            want = reference.channel_parts("AllReduce", count, 4, 4, 4, proto, BUFFS[proto],
                                           threads=t.max_threads[("Ring", proto)])
            assert [(w.part_offset, w.part_count, w.chunk_count) for w in grouped.works] == want, (count, proto)
            assert [w.channel for w in grouped.works] == list(range(len(want)))


def test_eight_allreduces_fill_the_channels_two_by_two():
    """8 AllReduces of 64 Ki floats, Ring/Simple, 4 channels: each moves 512 KiB of traffic (x2 for AllReduce), the
    plan's traffic per channel is 8 * 512 KiB / 4 = 1 MiB, a task's 16 cells of 16 KiB fit whole on the current
    channel; after two tasks the channel's traffic reaches 1 MiB and the next task starts on the next channel."""
    t = tuning(4, 4)
    n_max, n_warps = enqueue.topo_get_algo_info(t, "Ring", "Simple", 65536 * 4)
    assert n_max == 4
    plans = enqueue.schedule_colls(t, [enqueue.CollSpec("AllReduce", 65536, 4, "Ring", "Simple", n_max, n_warps)] * 8)
    assert [[(w.channel, w.part_offset, w.part_count) for w in p.works] for p in plans] == \
        [[(i // 2, 0, 65536)] for i in range(8)]


def test_a_task_starts_where_the_last_one_stopped():
    """Three AllReduces of 40 000 floats on 2 channels, Simple: 320 000 bytes of traffic each (cells of 16 KiB,
    32 KiB of traffic; 40 000 floats = 160 000 bytes = 10 cells, the last short), traffic per channel 3 * 320 000 /
    2 = 480 000 -> 15 cells.  Task 0: 10 cells on channel 0 (10 * 4096 * 8 = 327 680 of 480 000).  Task 1: 5 cells
    fill channel 0 (cellsLo = ceil(152 320 / 32 768) = 5), the other 5 go to channel 1, its last channel, whole.
    Task 2: channel 1 is the last: everything there."""
    t = tuning(2, 2)
    specs = [enqueue.CollSpec("AllReduce", 40000, 4, "Ring", "Simple", 2, 8)] * 3
    plans = enqueue.schedule_colls(t, specs)
    assert [[(w.channel, w.part_offset, w.part_count) for w in p.works] for p in plans] == [
        [(0, 0, 40000)], [(0, 0, 5 * 4096), (1, 5 * 4096, 40000 - 5 * 4096)], [(1, 0, 40000)]]


def test_prepare_aggregates_within_4x_and_counts_pipelined_ops():
    """ncclPrepareTasks: tasks of one (function, op, type) within 4x of the smallest share one algorithm choice,
    made for their summed bytes with numPipeOps = ceil(tasks / channels); the order comes from NCCL's size-binned
    sorter (largest bin first, then each (fn,op,ty) bin ascending)."""
    calls = []

    def choose(func, nbytes, num_pipe_ops=1):
        calls.append((func, nbytes, num_pipe_ops))
        return "Ring", "LL", 1.5 * len(calls), 0  # CostModel.choose's AlgoInfo: no tuner channel count

    t = tuning(4, 2)
    tasks = [("AllReduce", 1000, 4, "sum", "float32")] * 3 + [("AllReduce", 100000, 4, "sum", "float32"),
                                                                ("AllGather", 1000, 4, "sum", "float32")]
    order, specs, estimated = enqueue.prepare_colls(t, choose, tasks)
    # 5 tasks on 2 channels: 3 ops per channel; AllReduce 100 000 comes first out of the sorter (largest), so its
    # bin is walked first: the three of 1000 (within 4x of each other) then the one of 100 000 alone; AllGather
    # last, in bytes (its count x 4, retyped as int8), and over nranks blocks
    assert calls == [("AllReduce", 3 * 4000, 3), ("AllReduce", 400000, 3), ("AllGather", 4 * 4000, 3)]
    assert order == [0, 1, 2, 3, 4]
    assert [s.proto for s in specs] == ["LL"] * 5
    assert estimated == 4.5  # the last choice's time, as ncclSimInfo_t.estimatedTime keeps it


@pytest.mark.parametrize("n,nodes", [(3, 1), (4, 2)])
def test_group_of_eight_allreduces_is_one_plan(n, nodes, tmp_path):
    """Eight AllReduces in one group: bitwise equal to eight separate calls (and to the reference where NCCL's
    rules give each the same channel part as alone), one plan in the trace holding all eight; then a group
    mixing collectives with a ring of sends and receives, also one plan."""
    # NCCL_TUNER_PLUGIN=none: with more ranks than cores the lab's tuner takes Tree/Simple from 512 B, so a group
    # whose summed size crosses that would plan another algorithm than its calls alone (as NCCL would), and the
    # worker compares them bitwise
    proc = run_ranks(n, "group_colls", nodes=nodes, env={"NCCLLAB_TRACE": str(tmp_path), "NCCL_TUNER_PLUGIN": "none"},
                     script="p2p_workers.py", timeout=300)
    assert proc.stdout.count("ok group_colls") == n, proc.stdout
    for path in sorted(glob.glob(str(tmp_path / "trace-rank*.jsonl"))):
        events = [json.loads(line) for line in open(path)][1:]
        plans = [e for e in events if e["kind"] == "plan"]
        colls = {e["seq"]: e for e in events if e["kind"] == "coll"}
        sizes = [len(p["colls"]) for p in plans]
        # 16 separate calls (16 plans), then the three groups: 8, 8 and the mixed one's 2 collectives
        assert sizes == [1] * 16 + [8, 8, 2], (path, sizes)
        for p in plans[16:]:
            assert all(colls[s]["plan"] == p["plan"] for s in p["colls"]), p
            assert len({colls[s]["t0"] for s in p["colls"]}) == 1  # one launch: one start for all
        # the ring's send and receive: one work per round of this rank's p2pSchedule they fall in
        rounds = 1 if nodes == 1 else 2  # across nodes, rank+1 and rank-1 are met in different rounds
        assert [p["p2p"] for p in plans] == [0] * 18 + [rounds]
        assert sorted(plans[16]["colls"]) == list(range(16, 24))  # each call's own opCount
        if n == 4:  # the big ones spread over the channels, two or more tasks sharing one
            spread = [colls[s]["nchannels"] for s in plans[17]["colls"]]
            assert sum(spread) >= 8, spread


def test_group_end_simulate_returns_the_cost_models_time():
    """``group_end(simulate=True)`` (ncclGroupSimulateEnd) on 2 ranks: the worker checks each estimate against the
    cost model's formula written again, and that nothing ran."""
    proc = run_ranks(2, "simulate", script="p2p_workers.py")
    assert proc.stdout.count("ok simulate") == 2, proc.stdout


def test_a_group_against_calls_one_by_one_is_a_mismatch():
    """Two AllReduces grouped on rank 0, made one by one on rank 1: other plans, other channel parts; the status
    pages tell them apart at once (the group publishes its summed count), well before the 30 s deadline."""
    proc = run_ranks(2, "group_vs_alone", script="p2p_workers.py", check=False, timeout=120)
    assert proc.returncode != 0
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if "mismatch" in line.lower()]
    assert any("count=200000" in line and "count=100000" in line for line in lines), proc.stderr[-3000:]
