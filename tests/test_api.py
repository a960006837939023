"""The public API in both forms: ours (keywords) and nccl4py's (buffers first), shapes kept, bad buffers refused
with a message, and Reduce leaving a non-root rank's buffer as it was.  One rank, then a real 3-rank job."""
import re

import numpy as np
import pytest

import collectives
from conftest import run_ranks


@pytest.fixture
def comm():
    c = collectives.Communicator.init(nranks=1, rank=0, unique_id=collectives.get_unique_id())
    yield c
    c.destroy()


def test_nccl4py_forms_on_one_rank(comm):
    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    y = np.empty_like(x)
    comm.allreduce(x, y, collectives.SUM)
    assert np.array_equal(y, x)
    z = np.empty(16, np.float32)
    comm.allgather(x.reshape(-1), z)
    assert np.array_equal(z, x.reshape(-1))
    w = np.empty_like(x)
    comm.reduce(x, w, collectives.MAX)  # no root: nccl4py's AllReduce
    assert np.array_equal(w, x)


def test_shapes_are_kept(comm):
    x = np.ones((4, 4), np.float32)
    assert comm.all_reduce(x).shape == (4, 4)
    assert comm.all_gather(x).shape == (4, 4)  # one rank: the inputs concatenated along axis 0
    assert comm.reduce_scatter(x).shape == (4, 4)
    assert comm.broadcast(x.copy()).shape == (4, 4)


def test_bad_buffers_get_a_message(comm):
    with pytest.raises(TypeError, match="expected a numpy array, got list .*np.asarray"):
        comm.all_reduce([1.0, 2.0])
    with pytest.raises(TypeError, match="receive buffer dtype"):
        comm.all_reduce(np.ones(4, np.float32), np.ones(4, np.float64), "sum")
    with pytest.raises(ValueError, match="root 3 out of range"):
        comm.reduce(np.ones(4, np.float32), root=3)


def test_both_forms_across_ranks():
    run_ranks(3, "api_forms")


def test_the_same_buffers_again_run_every_call_as_asked():
    """A repeated call with the same arrays skips the checks and the task lookup, never what the call asks: the
    op, in place, a group, a destroyed communicator (3 ranks, so the summation order matters)."""
    proc = run_ranks(3, "repeated_buffers")
    assert sorted(re.findall(r"rank \d ok", proc.stdout)) == ["rank 0 ok", "rank 1 ok", "rank 2 ok"], proc.stdout
