"""Buffers that share bytes are refused in one line, except the exact in-place form (``collectives.api``
``check_overlap``): NCCL leaves a partial overlap undefined, and ours was silently wrong (an AllReduce whose output
is the input shifted by 1,000 elements had 4,000 wrong elements).  Every collective, both API forms, shifts of 1,
1,000 and 50,000 elements either way; exact in place and disjoint slices of one array still run, bitwise right.
One rank in this process, a CUDA-style array (device pointer and nbytes), then two real ranks."""
import os
import subprocess
import sys

import numpy as np
import pytest

import collectives
from collectives.api import check_overlap
from conftest import ROOT, spawn_code

N = 100_000
SHIFTS = (1, 1000, 50_000)
FUNCS = ("AllReduce", "AllGather", "ReduceScatter", "Broadcast", "Reduce")


@pytest.fixture(scope="module")
def comm():
    c = collectives.Communicator.init(nranks=1, rank=0, unique_id=collectives.get_unique_id())
    yield c
    c.destroy()


def calls(comm, func: str, send, recv) -> list:
    """``func`` on (send, recv) in our form and in nccl4py's."""
    return {"AllReduce": [lambda: comm.all_reduce(send, out=recv), lambda: comm.allreduce(send, recv, "sum")],
            "AllGather": [lambda: comm.all_gather(send, out=recv), lambda: comm.allgather(send, recv)],
            "ReduceScatter": [lambda: comm.reduce_scatter(send, out=recv),
                              lambda: comm.reduce_scatter(send, recv, "sum")],
            "Broadcast": [lambda: comm.broadcast(send, root=0, out=recv), lambda: comm.broadcast(send, recv, 0)],
            "Reduce": [lambda: comm.reduce(send, root=0, out=recv), lambda: comm.reduce(send, recv, "sum", 0),
                       lambda: comm.reduce(send, recv, "sum")]}[func]  # the last: nccl4py's AllReduce


@pytest.mark.parametrize("func", FUNCS)
@pytest.mark.parametrize("shift", SHIFTS)
def test_overlap_is_refused(comm, func, shift):
    big = np.arange(N + max(SHIFTS), dtype=np.float32)
    before = big.copy()
    for send, recv in ((big[:N], big[shift:shift + N]), (big[shift:shift + N], big[:N])):
        for call in calls(comm, func, send, recv):
            with pytest.raises(ValueError) as info:
                call()
            msg = str(info.value)
            assert "\n" not in msg and "overlap" in msg and "not in place" in msg, msg
            assert msg.split(":")[0] in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce"), msg
            assert f"{send.ctypes.data:#x}" in msg and f"{recv.ctypes.data:#x}" in msg, msg  # both ranges
    assert np.array_equal(big, before), "a refused call wrote into the buffers"
    assert np.array_equal(comm.all_reduce(big[:4]), big[:4])  # the communicator is still usable


@pytest.mark.parametrize("func", FUNCS)
def test_exact_in_place_and_disjoint_run(comm, func):
    x = np.arange(N, dtype=np.float32)
    want = x.copy()
    for call in calls(comm, func, x, x):
        call()
        assert np.array_equal(x, want), f"{func} in place changed the buffer on one rank"
    big = np.zeros(2 * N, np.float32)
    big[:N] = want
    for call in calls(comm, func, big[:N], big[N:]):
        big[N:] = -1
        call()
        assert np.array_equal(big[N:], want), f"{func} between disjoint slices of one array"


class FakeCudaArray:
    """What ``check_overlap`` sees of a CUDA array: its device pointer and its size in bytes."""

    def __init__(self, ptr: int, nbytes: int):
        self.__cuda_array_interface__ = {"data": (ptr, False), "shape": (nbytes // 4,), "typestr": "<f4",
                                         "version": 3}
        self.nbytes = nbytes


def test_cuda_arrays_are_checked_by_device_pointer():
    ptr, nbytes = 0x7F0000000000, 4 * N
    for k in SHIFTS:
        with pytest.raises(ValueError, match="overlap"):
            check_overlap("all_reduce", "AllReduce", 0, FakeCudaArray(ptr, nbytes), FakeCudaArray(ptr + 4 * k, nbytes))
    check_overlap("all_reduce", "AllReduce", 0, FakeCudaArray(ptr, nbytes), FakeCudaArray(ptr, nbytes))
    check_overlap("all_reduce", "AllReduce", 0, FakeCudaArray(ptr, nbytes), FakeCudaArray(ptr + nbytes, nbytes))
    # rank 1's AllGather: its send buffer is block 1 of the receive buffer; block 0 is not in place
    check_overlap("all_gather", "AllGather", 1, FakeCudaArray(ptr + nbytes, nbytes), FakeCudaArray(ptr, 2 * nbytes))
    with pytest.raises(ValueError, match=r"recvbuff \+ 1 \* count"):
        check_overlap("all_gather", "AllGather", 1, FakeCudaArray(ptr, nbytes), FakeCudaArray(ptr, 2 * nbytes))
    check_overlap("reduce_scatter", "ReduceScatter", 1, FakeCudaArray(ptr, 2 * nbytes), FakeCudaArray(ptr + nbytes,
                                                                                                        nbytes))
    with pytest.raises(ValueError, match=r"sendbuff \+ 1 \* recvcount"):
        check_overlap("reduce_scatter", "ReduceScatter", 1, FakeCudaArray(ptr, 2 * nbytes), FakeCudaArray(ptr, nbytes))


def test_two_ranks_refuse_and_run_in_place():
    env = {**os.environ, "NCCLLAB_TIMEOUT": "30", "NCCL_SOCKET_IFNAME": "lo"}
    code = spawn_code(2, f"[{str(ROOT / 'tests' / 'overlap_workers.py')!r}, 'refuse_and_place']")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"rc {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    assert sorted(proc.stdout.split()) == sorted("rank 0 ok rank 1 ok".split()), proc.stdout
