"""The GPU kernels (collectives/device/cuda) under numba's CUDA simulator, bitwise against the NCCL-order reference.

Ranks are threads of one process connected by direct pointers (``ThreadComm``), 1 channel, small counts (0, odd,
a few thousand), fresh random inputs and poisoned outputs.  Small FIFOs (``NCCL_BUFFSIZE``/``NCCL_LL_BUFFSIZE``/
``NCCL_LL128_BUFFSIZE``) make a few thousand elements span many steps, so the FIFO wraps round its 8 slots, credit
runs out and LL / LL128 flags of older steps sit in the slots.  Each communicator runs several collectives in a row
(steps carry over).  Simple, LL and LL128: LL128's 128-byte lines in NCCL's warp layout are checked bit for bit
here; that a warp's line store is seen whole (data with its flag) is a property of the hardware the simulator
cannot show.  Integer sums that overflow their type wrap as NCCL's do, and integer Avg divides the wrapped sum.
"""
import os
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from collectives.perf import reference
from collectives.device.backend import DeviceError, get_device

DEV = get_device("cudasim")  # before anything imports numba.cuda for a real GPU

from collectives.device.common import CollectiveError  # noqa: E402
from collectives.device.cuda.threads import ThreadComm  # noqa: E402
from collectives.graph.trees import tree_table  # noqa: E402
from collectives.perf.threads_runner import schedule  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # integer sums wrap, as on a GPU
SMALL_FIFOS = {"NCCL_BUFFSIZE": "65536", "NCCL_LL_BUFFSIZE": "16384", "NCCL_LL128_BUFFSIZE": "65536"}
COUNTS = (0, 1001, 3000)
RING_FUNCS = ("AllReduce", "ReduceScatter", "AllGather", "Broadcast", "Reduce")
PROTOS = ("Simple", "LL", "LL128")
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def small_fifos(monkeypatch):
    for k, v in SMALL_FIFOS.items():
        monkeypatch.setenv(k, v)


def _inputs(rng, n, count, dtype):
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        return [rng.integers(-1000 if dtype.kind == "i" else 0, 1000, count).astype(dtype) for _ in range(n)]
    return [(rng.standard_normal(count) * 8).astype(np.float32).astype(dtype) for _ in range(n)]


def _bits(a):
    return np.ascontiguousarray(a).view(np.uint8)


def _check(comm, func, xs, outs, op, proto, algo="Ring", root=0):
    n = comm.n
    kw = dict(op=op, rings=comm.rings, nchannels=1, proto=proto)
    for r in range(n):
        if func == "AllReduce":
            want = reference.all_reduce(xs, algo=algo, trees=tree_table(comm.trees) if algo == "Tree" else None, **kw)
        elif func == "ReduceScatter":
            want = reference.reduce_scatter(xs, r, **kw)
        elif func == "AllGather":
            want = reference.all_gather(xs)
        elif func == "Broadcast":
            want = reference.broadcast(xs, root)
        else:
            want = reference.reduce(xs, root, **kw) if r == root else None
        if want is None:  # Reduce leaves a non-root's output alone: still the poison
            assert np.all(_bits(outs[r]) == 0xA5), f"rank {r}: Reduce wrote a non-root output"
            continue
        assert outs[r].size == want.size
        bad = np.flatnonzero(_bits(outs[r]) != _bits(want))
        assert bad.size == 0, f"{func}/{algo}/{proto} n={n} rank {r}: {bad.size} bytes differ, first at {bad[0]}"


@pytest.mark.parametrize("n", (2, 3))
@pytest.mark.parametrize("proto", PROTOS)
@pytest.mark.parametrize("func,algo", [(f, "Ring") for f in RING_FUNCS] + [("AllReduce", "Tree")])
def test_collectives_bitwise(small_fifos, func, algo, proto, n):
    comm = ThreadComm(n, 1, DEV)
    rng = np.random.default_rng(hash((func, algo, proto, n)) & 0xFFFF)
    for i, count in enumerate(COUNTS):
        root = i % n
        total = count * n if func == "ReduceScatter" else count
        xs = _inputs(rng, n, total, np.float32)
        outs = comm.run(func, xs, schedule(comm, func, xs, proto, algo), root=root)
        _check(comm, func, xs, outs, "sum", proto, algo, root)


@pytest.mark.parametrize("proto", PROTOS)
@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float64, np.int32, np.int8, np.uint8])
def test_datatypes_bitwise(small_fifos, dtype, proto):
    """half and bfloat16 round per operation as __hadd does; 1- and 8-byte types fill LL lines differently."""
    comm = ThreadComm(3, 1, DEV)
    rng = np.random.default_rng(7)
    for algo in ("Ring", "Tree"):
        xs = _inputs(rng, 3, 1001, dtype)
        outs = comm.run("AllReduce", xs, schedule(comm, "AllReduce", xs, proto, algo))
        _check(comm, "AllReduce", xs, outs, "sum", proto, algo)


@pytest.mark.parametrize("proto", ("Simple", "LL"))
@pytest.mark.parametrize("op", ("prod", "max", "min", "avg"))
@pytest.mark.parametrize("dtype", (np.float32, np.int32))
def test_ops_bitwise(small_fifos, op, dtype, proto):
    """Avg: floats pre-multiply by 1/n in the element type, integers divide the sum (truncating)."""
    comm = ThreadComm(3, 1, DEV)
    xs = _inputs(np.random.default_rng(11), 3, 777, dtype)
    _check(comm, "AllReduce", xs, comm.run("AllReduce", xs, schedule(comm, "AllReduce", xs, proto), op=op), op, proto)
    xs = _inputs(np.random.default_rng(12), 3, 3 * 257, dtype)
    for r, out in enumerate(comm.run("ReduceScatter", xs, schedule(comm, "ReduceScatter", xs, proto), op=op)):
        assert np.array_equal(_bits(out), _bits(reference.reduce_scatter(xs, r, op, comm.rings, 1, proto)))


@pytest.mark.parametrize("proto", PROTOS)
@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int32, np.uint32, np.int64, np.uint64])
def test_integer_sums_that_overflow_wrap_as_nccls(small_fifos, dtype, proto):
    """Inputs in the upper half of the type (negated on one rank for signed types): every sum overflows.  NCCL's
    ``FuncSum<T>`` wraps in T and Avg divides that wrapped sum; uint64 Avg must stay integer (numba would make
    ``uint64 // int64`` a float64 division, which loses the low bits: the simulator shows that one; the wrap of
    int8 sums it cannot show, and tests/test_gpu_ptx.py checks it in the lowered PTX)."""
    info = np.iinfo(dtype)
    rng = np.random.default_rng(int(info.bits))
    xs = [rng.integers(info.max // 2, info.max, 257, dtype=dtype, endpoint=True) for _ in range(3)]
    if info.min < 0:
        xs[1] = -xs[1]
    comm = ThreadComm(3, 1, DEV)
    for op in ("avg", "sum"):
        _check(comm, "AllReduce", xs, comm.run("AllReduce", xs, schedule(comm, "AllReduce", xs, proto), op=op), op, proto)


@pytest.mark.parametrize("proto,what", [("Simple", "tail"), ("LL", "LL flag"), ("LL128", "LL128 flag")])
def test_peer_that_never_posts_fails_in_one_line(monkeypatch, proto, what):
    """Rank 1's kernel never runs: rank 0 sends its first chunk, then its wait for rank 1 runs out; the launch
    aborts (everyone's spins see the abort word) with one line naming rank, channel, step and peer."""
    monkeypatch.setenv("NCCLLAB_TIMEOUT", "1")
    comm = ThreadComm(2, 1, DEV)
    xs = _inputs(np.random.default_rng(3), 2, 100, np.float32)
    with pytest.raises(CollectiveError) as err:
        comm.run("AllReduce", xs, schedule(comm, "AllReduce", xs, proto), absent=(1,))
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith("rank 0: AllReduce (opCount 0) made no progress for 1 s (NCCLLAB_TIMEOUT): channel 0 ")
    assert msg.endswith(f"step 0 waiting for {what} from rank 1 (recv)")


def test_threadcomm_chooses_the_simulator_itself():
    """A fresh process that never set NUMBA_ENABLE_CUDASIM: importing the thread harness loads no kernels, so
    ``ThreadComm(2, 1, "cudasim")`` can still choose the simulator (it used to fail, blaming the environment)."""
    code = ("import numpy as np; from collectives.device.cuda.threads import ThreadComm; "
            "from collectives.perf.threads_runner import schedule; c = ThreadComm(2, 1, 'cudasim'); "
            "xs = [np.ones(8, np.float32)] * 2; print(c.run('AllReduce', xs, schedule(c, 'AllReduce', xs))[0].sum())")
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_ENABLE_CUDASIM", "NCCLLAB_DEVICE")}
    p = subprocess.run([sys.executable, "-c", code], env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip() == "16.0"


def test_numpy_buffers_go_to_a_gpu_as_the_kernels_element_type():
    """``device/cuda/rank.py``'s staged path (numpy buffers on ``--device cuda``): cupy has no bfloat16, so a buffer goes up
    and comes back as the kernel's element type, its uint16 bits, viewed in place."""
    from collectives.device.cuda.call import kernel_dtype
    from collectives.device.cuda.rank import staged_view
    host = np.arange(6, dtype=np.float32).astype(ml_dtypes.bfloat16).reshape(2, 3)
    bits = staged_view(host, kernel_dtype("AllReduce", host.dtype))
    assert bits.dtype == np.uint16 and bits.shape == (6,) and np.shares_memory(bits, host)
    bits[...] = np.float32(7).astype(ml_dtypes.bfloat16).view(np.uint16)
    assert np.all(host == 7)
    assert staged_view(host, kernel_dtype("AllGather", host.dtype)).dtype == np.uint8


def test_device_selection():
    assert get_device("cpu").name == "cpu" and not get_device("cpu").is_gpu
    with pytest.raises(DeviceError, match="unknown device 'tpu'"):
        get_device("tpu")
    os.environ["NCCLLAB_DEVICE"] = "cudasim"
    try:
        assert get_device().name == "cudasim"
    finally:
        del os.environ["NCCLLAB_DEVICE"]


def test_reference_follows_the_nccl_version_of_the_split():
    """NCCL 2.28's scheduleCollTasksToPlan: MinTrafficPerChannel 16 KiB, traffic per channel max(16 KiB,
    traffic / nChannels).  2 ranks, 4 channels, 16952 floats: 2 usable channels, 67808 B each; 2.28 cuts 8 KiB
    cells (2048 floats), 5 to the first channel; 2.30 cuts 16 KiB cells, 3 to the first."""
    assert reference.channel_parts("AllReduce", 16952, 4, 2, 4, "Simple") == [(0, 12288, 524288),
                                                                               (12288, 4664, 524288)]
    assert reference.channel_parts("AllReduce", 16952, 4, 2, 4, "Simple", nccl_version=(2, 28)) == [
        (0, 10240, 524288), (10240, 6712, 524288)]
