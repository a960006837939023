"""The compiled Simple path (``collectives/device/compiled.py`` over ``simple_compiled.py``) against the readable
primitives (``prims_simple.py``), beyond the checks every compiled protocol has (``test_compiled.py``): FIFOs small
enough to wrap and slices that end empty, the record's bound, the reduction loops against numpy, and compiled and
readable ranks in one collective (for LL and LL128 too)."""
import numpy as np
import pytest

from collectives import enqueue
from collectives.device import compiled
from conftest import run_ranks
from workers import ALL, Case


def test_compiled_simple_with_small_fifos_wraps_and_slices_end_empty():
    # 4 KiB Simple buffers: 512-byte slots, so every call spans many steps, the FIFO wraps many times per call,
    # and counts below a slice leave SlicePerChunk-1 empty slices that still wait and post.
    case = Case(counts=[3, 129, 5000, 65_537], dtypes=["float32", "int32", "uint8"], ops=["sum", "max"], channels=2,
                colls=ALL, proto="Simple")
    proc = run_ranks(3, "compiled_paths", case.arg(), env={"NCCL_BUFFSIZE": "4096"})
    assert proc.stdout.count(" ok ") == 3, proc.stdout


def test_info_line_names_the_readable_simple_path_when_it_is_off():
    proc = run_ranks(2, "bitwise", Case(counts=[5], dtypes=["float32"], colls=["allreduce"]).arg(),
                     env={"NCCL_DEBUG": "INFO", "NCCL_PROTO": "Simple", "NCCLLAB_SIMPLE_COMPILED": "0"})
    assert "Ring/Simple (NCCLLAB_SIMPLE_COMPILED=0) run the readable primitives" in proc.stdout + proc.stderr


def test_recorded_simple_calls_refuse_more_than_a_slice_carries():
    """numba checks no bounds: a call larger than SlicePerChunk slices of StepPerSlice steps is refused when
    recorded (the readable primitives could not slice it either)."""
    from collectives.device import launch
    from collectives.graph.rings import setup_ring
    t = enqueue.default_tuning(2, 1, {"LL": 1 << 19, "LL128": 1 << 22, "Simple": 1 << 22})
    plan = enqueue.schedule_coll(t, "AllReduce", 1 << 16, 4, "Ring", "Simple")
    run = launch.RING["AllReduce"][0]
    spc, sps = plan.chunk_steps // plan.slice_steps, plan.slice_steps
    carries = (1 << 22) // 8 * sps  # one slice: StepPerSlice slots of the 4 MiB FIFO
    rows = compiled.record(run, setup_ring([0, 1], 1), plan.works[0], 2, -1, False, 4, carries, spc)
    assert len(rows) == 3 * -(-plan.works[0].part_count // (2 * plan.works[0].chunk_count))
    with pytest.raises(ValueError, match="exceeds what it may carry"):
        compiled.record(run, setup_ring([0, 1], 1), plan.works[0], 2, -1, False, 4, 1024, spc)


@pytest.mark.parametrize("op", ["sum", "max"])
def test_compiled_reduce_loops_match_numpy_bitwise(op):
    """The vectorised sum loop and the scalar min/max loop give numpy's (``reduce_copy``'s) bits, NaNs, signed
    zeros and integer wraparound included."""
    from collectives.device.reduce_copy import CANONICAL_NAN, OPS, RedOp, reduce_copy
    from collectives.device.compiled_common import reduce as _reduce
    rng = np.random.default_rng()
    for dt in (np.float32, np.float64, np.int8, np.uint64):
        if np.dtype(dt).kind == "f":
            a, b = (rng.standard_normal(1001).astype(dt) for _ in range(2))
            a[::7], b[::11], a[::13], b[::13] = np.nan, np.nan, 0.0, -0.0
        else:
            info = np.iinfo(dt)
            a, b = (rng.integers(info.min, info.max, 1001, dtype=dt, endpoint=True) for _ in range(2))
        want = np.empty_like(a)
        reduce_copy(RedOp(op, np.dtype(dt), 2), [a, b], [want], pre_op=False, post_op=False)
        got = np.full(1001 + 8, 7, dt)
        canon = np.array(CANONICAL_NAN[np.dtype(dt).itemsize]).view(dt)[()] if np.dtype(dt).kind == "f" else dt(0)
        _reduce(got, 3, a, 0, b, 0, 1001, OPS[op], np.dtype(dt).kind == "f", canon)
        assert np.array_equal(got[3:1004].view(np.uint8), want.view(np.uint8)), dt
        assert (got[:3] == 7).all() and (got[1004:] == 7).all(), dt


@pytest.mark.parametrize("proto", ["Simple", "LL", "LL128"])
def test_compiled_and_readable_ranks_run_one_collective_together(proto):
    """Even ranks compiled, odd ranks readable, on the same FIFOs: each side must move slices, steps, head, tail
    and flags exactly as the other expects (a slice size or step rounding of its own would hang or corrupt here,
    where results of one path alone would not show it)."""
    # Broadcast and Reduce move one step a chunk, AllReduce and AllGather four: alternating them leaves each
    # connection's step off the chunk boundary, which both sides must round up alike.
    case = Case(counts=[3, 4099, 65_537], dtypes=["float32"], ops=["sum", "min"], channels=2,
                colls=["broadcast", "allreduce", "reduce", "allgather", "reducescatter"], proto=proto, mixed=True)
    proc = run_ranks(3, "compiled_paths", case.arg(), env={"NCCL_BUFFSIZE": "8192", "NCCL_LL128_BUFFSIZE": "32768",
                                                           "NCCLLAB_TIMEOUT": "60"})
    assert proc.stdout.count(" ok ") == 3, proc.stdout
