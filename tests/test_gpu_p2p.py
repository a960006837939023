"""Point-to-point on the GPU path (collectives/device/cuda/sendrecv.py) under numba's CUDA simulator, bitwise.

Ranks are threads of one process connected by direct pointers (``ThreadComm``); each rank's group of sends and
receives is planned by the CPU path's own NCCL rules (``collectives/p2p.py``: ``p2pSchedule`` rounds, channels
per part, chunk sizes, LL below ``NCCL_P2P_LL_THRESHOLD`` per channel) and run by ``runSend``/``runRecv`` kernels
over connIndex-1 connectors made at a pair's first use.  p2p moves bytes, so every check is equality of bytes
with the sender's input; receive buffers start poisoned (0xA5) and inputs are fresh random bits.  Small FIFOs and
a low LL threshold make a few KiB span many steps of both protocols, so FIFOs wrap round their 8 slots.
"""
import re

import ml_dtypes
import numpy as np
import pytest

from collectives.device.backend import get_device
from tracing import debug

DEV = get_device("cudasim")  # before anything imports numba.cuda for a real GPU

from collectives.device.common import CollectiveError  # noqa: E402
from collectives.device.cuda.threads import ThreadComm  # noqa: E402
from collectives import p2p_threads  # noqa: E402

# Simple steps of 512 B (p2pChunkSize = NCCL_BUFFSIZE / 8), LL steps of 128 data bytes, LL up to 1500 B per channel
SMALL = {"NCCL_BUFFSIZE": "4096", "NCCL_LL_BUFFSIZE": "2048", "NCCL_P2P_LL_THRESHOLD": "1500"}
# bytes of a pair: empty, one byte, odd, LL just under the switch (12 LL steps: wraps), Simple just over it, and
# Simple over 9 steps (wraps)
PAIR_BYTES = (0, 1, 7, 1499, 1501, 4613)


@pytest.fixture
def small_fifos(monkeypatch):
    for k, v in SMALL.items():
        monkeypatch.setenv(k, v)


def _random(rng, nbytes: int, dtype=np.uint8) -> np.ndarray:
    return np.frombuffer(rng.bytes(nbytes), np.uint8).view(dtype).copy()


def _poisoned(nbytes: int, dtype=np.uint8) -> np.ndarray:
    return np.full(nbytes, 0xA5, np.uint8).view(dtype)


def _bits(a) -> np.ndarray:
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def _exchange(comm, rng, nbytes_of) -> None:
    """Every rank sends ``nbytes_of(src, dst)`` fresh bytes to every rank (itself included) in one group."""
    n = comm.n
    sent = {(s, d): _random(rng, nbytes_of(s, d)) for s in range(n) for d in range(n)}
    got = {(s, d): _poisoned(nbytes_of(s, d)) for s in range(n) for d in range(n)}
    ops = [[op for p in range(n) for op in (("send", sent[r, p], p), ("recv", got[p, r], p))] for r in range(n)]
    p2p_threads.run_p2p(comm, ops)
    for (s, d), want in sent.items():
        bad = np.flatnonzero(_bits(got[s, d]) != _bits(want))
        assert bad.size == 0, f"{s} -> {d}, {want.size} B: {bad.size} bytes differ, first at {bad[0]}"


@pytest.mark.parametrize("n", (2, 3, 4))
def test_every_pair_bitwise(small_fifos, n):
    """A ring exchange first (it connects some pairs), then every (sender, receiver) pair, self included, twice
    with other sizes: the connectors of the new pairs are added to the pool at their first use, the old ones keep
    their steps."""
    comm = ThreadComm(n, 1, DEV)
    rng = np.random.default_rng(n)
    ring = [[("send", _random(rng, 601), (r + 1) % n), ("recv", _poisoned(601), (r - 1) % n)] for r in range(n)]
    sent = [ops[0][1] for ops in ring]
    p2p_threads.run_p2p(comm, ring)
    for r in range(n):
        assert np.array_equal(ring[r][1][1], sent[(r - 1) % n])
    first = len(comm.p2p.ids)
    for shift in (0, 3):
        _exchange(comm, rng, lambda s, d: PAIR_BYTES[(s * n + d + shift) % len(PAIR_BYTES)])
    assert len(comm.p2p.ids) == n * (n - 1) > first or n == 2


def test_protocols_follow_the_ll_threshold(small_fifos):
    """The plan the kernel ran: LL at and below the threshold per channel, Simple above it, never for a copy."""
    comm = ThreadComm(2, 1, DEV)
    rng = np.random.default_rng(5)
    for nbytes, ll in ((1500, True), (1501, False)):
        x, y = _random(rng, nbytes), _poisoned(nbytes)
        works = p2p_threads.run_p2p(comm, [[("send", x, 1), ("send", x, 0), ("recv", y, 0)], [("recv", _poisoned(nbytes), 0)]])
        assert np.array_equal(y, x)  # the self copy
        protos = {(w.send_rank, w.send_proto_ll) for w in works[0]}
        assert protos == {(1, ll), (0, False)}


def test_channels_stripe_a_large_send(monkeypatch):
    """Two p2p channels per peer, p2pChunkSize 256 B: a 9 KiB send is cut into parts of more than 32 steps' worth
    only while channels are left (``addP2pToPlan``), so it goes over both channels, Simple (the threshold is low)."""
    monkeypatch.setenv("NCCL_P2P_PCI_CHUNKSIZE", "256")
    monkeypatch.setenv("NCCL_P2P_LL_THRESHOLD", "64")
    comm = ThreadComm(2, 2, DEV)
    rng = np.random.default_rng(9)
    x, y = _random(rng, 9001), _poisoned(9001)
    works = p2p_threads.run_p2p(comm, [[("send", x, 1)], [("recv", y, 0)]])
    assert works[0][0].n_send_channels == 2 and works[1][0].n_recv_channels == 2
    assert np.array_equal(y, x)


@pytest.mark.parametrize("dtype", (np.float32, np.float16, ml_dtypes.bfloat16, np.int8, np.float64))
@pytest.mark.parametrize("n", (2, 3, 4))
def test_all_to_all_bitwise(small_fifos, n, dtype):
    comm = ThreadComm(n, 1, DEV)
    rng = np.random.default_rng(n * 31 + np.dtype(dtype).itemsize)
    count = 251  # per peer: odd; LL for 1-byte types, Simple for the others
    xs = [_random(rng, n * count * np.dtype(dtype).itemsize, dtype) for _ in range(n)]
    outs = p2p_threads.all_to_all(comm, xs)
    for r in range(n):
        for q in range(n):
            assert np.array_equal(_bits(outs[r][q * count:(q + 1) * count]), _bits(xs[q][r * count:(r + 1) * count]))


@pytest.mark.parametrize("n", (2, 3, 4))
def test_gather_and_scatter_bitwise_every_root(small_fifos, n):
    comm = ThreadComm(n, 1, DEV)
    rng = np.random.default_rng(100 + n)
    count = 333
    for root in range(n):
        xs = [_random(rng, count * 4, np.float32) for _ in range(n)]
        gathered = p2p_threads.gather(comm, xs, root)
        assert np.array_equal(_bits(gathered), _bits(np.concatenate(xs)))
        x = _random(rng, n * count * 2, np.float16)
        outs = p2p_threads.scatter(comm, x, root)
        for r in range(n):
            assert np.array_equal(_bits(outs[r]), _bits(x[r * count:(r + 1) * count]))


def test_all_to_all_gather_scatter_at_8_ranks(small_fifos):
    """Eight ranks on one node: one schedule group of 8 (``p2pSchedGroupSize``), a round per local delta."""
    comm = ThreadComm(8, 1, DEV)
    rng = np.random.default_rng(8)
    xs = [_random(rng, 8 * 37, np.uint8) for _ in range(8)]
    outs = p2p_threads.all_to_all(comm, xs)
    for r in range(8):
        for q in range(8):
            assert np.array_equal(outs[r][q * 37:(q + 1) * 37], xs[q][r * 37:(r + 1) * 37])
    ys = [_random(rng, 4 * 19, np.int32) for _ in range(8)]
    assert np.array_equal(_bits(p2p_threads.gather(comm, ys, 5)), _bits(np.concatenate(ys)))
    x = _random(rng, 8 * 8 * 21, np.float64)
    for r, out in enumerate(p2p_threads.scatter(comm, x, 3)):
        assert np.array_equal(_bits(out), _bits(x[r * 21:(r + 1) * 21]))


@pytest.mark.parametrize("nbytes,what", [(3000, "tail"), (100, "LL flag")])
def test_recv_from_a_peer_that_never_posts_fails_in_one_line(small_fifos, monkeypatch, nbytes, what):
    """Rank 1's kernel never runs: rank 0's receive waits at step 0 until its deadline; one line names the op,
    both ranks, the channel and the step."""
    monkeypatch.setenv("NCCLLAB_TIMEOUT", "1")
    comm = ThreadComm(2, 1, DEV)
    ops = [[("recv", _poisoned(nbytes), 1)], [("send", np.zeros(nbytes, np.uint8), 0)]]
    with pytest.raises(CollectiveError) as err:
        p2p_threads.run_p2p(comm, ops, absent=(1,))
    msg = str(err.value)
    assert "\n" not in msg
    assert msg == (f"rank 0: SendRecv (opCount 0) made no progress for 1 s (NCCLLAB_TIMEOUT): channel 0 step 0 "
                   f"waiting for {what} from rank 1 (recv)")


def test_send_to_a_peer_that_never_posts_fails_in_one_line(small_fifos, monkeypatch):
    """A Simple send of 10 steps to a rank that never runs: the first NCCL_STEPS fill the FIFO, the 9th waits for
    credit (head) until its deadline."""
    monkeypatch.setenv("NCCLLAB_TIMEOUT", "1")
    comm = ThreadComm(2, 1, DEV)
    ops = [[("send", np.zeros(5000, np.uint8), 1)], [("recv", _poisoned(5000), 0)]]
    with pytest.raises(CollectiveError) as err:
        p2p_threads.run_p2p(comm, ops, absent=(1,))
    assert str(err.value) == ("rank 0: SendRecv (opCount 0) made no progress for 1 s (NCCLLAB_TIMEOUT): channel 0 "
                              "step 8 waiting for head from rank 1 (send credit)")


def test_unmatched_self_send_and_a_block_too_small_are_refused(small_fifos, monkeypatch):
    comm = ThreadComm(2, 1, DEV)
    with pytest.raises(ValueError, match="to itself without a matching recv"):
        p2p_threads.run_p2p(comm, [[("send", np.zeros(4, np.uint8), 0)], []])
    monkeypatch.setenv("NCCLLAB_SIM_THREADS", "1")
    comm = ThreadComm(2, 1, DEV)
    with pytest.raises(ValueError, match="NCCLLAB_SIM_THREADS must be at least 2"):
        p2p_threads.run_p2p(comm, [[("send", np.zeros(4, np.uint8), 1)], [("recv", np.zeros(4, np.uint8), 0)]])


def test_connections_are_logged_at_first_use(small_fifos, capsys, monkeypatch):
    """NCCL's connIndex-1 line, once per (channel, sender, receiver), when the pair is first used."""
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    debug.reset()
    try:
        comm = ThreadComm(3, 1, DEV)
        capsys.readouterr()
        x = np.arange(10, dtype=np.uint8)
        for _ in range(2):
            p2p_threads.run_p2p(comm, [[("send", x, 2)], [], [("recv", _poisoned(10), 0)]])
        err = capsys.readouterr()
    finally:
        monkeypatch.delenv("NCCL_DEBUG")
        debug.reset()
    lines = [ln for ln in (err.out + err.err).splitlines() if "/1 :" in ln]
    assert len(lines) == 1 and lines[0].endswith("Channel 00/1 : 0[0] -> 2[2] via P2P/direct pointer"), lines


# after test_gpu_ptx.py's prelude (a stand-in H200 for the compute capability, the array types)
_PTX = r"""
from collectives.device.cuda import sendrecv as S
u8 = types.uint8
sig = (A(i64, 1), A(i64, 4), A(i64, 2), A(u8, 2), A(u8, 2), A(u8, 2), A(u64, 3), A(u8, 5),  # sendrecv.ARGS
       A(types.uint32, 5), A(i64, 2), A(i64, 2), A(i64, 2), A(i64, 4), A(i64, 1), A(u8, 1))
ptx, _ = cuda.compile_ptx(S.get_kernel().py_func, sig, cc=(9, 0))
open(sys.argv[1] + "/SendRecv.ptx", "w").write(ptx)
print("{}")
"""


def test_sendrecv_kernel_lowers_for_sm90_with_nccls_polling(tmp_path):
    """The real-GPU side, without a GPU (as tests/test_gpu_ptx.py checks the collectives' kernels): the SendRecv
    kernel, Simple and LL inlined, lowers to PTX for sm_90; its spin loops poll with volatile or relaxed loads
    only, its one atomic is the abort record's claim, its groups meet at named barriers (no block-wide
    ``__syncthreads``), and every publication follows a system-scope fence."""
    from test_gpu_ptx import _PRELUDE, _cuda_home, _memory_ops, _run, _spin_loops
    if _cuda_home() is None:
        pytest.skip("no CUDA toolkit with NVVM here")
    _run(_PRELUDE + _PTX, str(tmp_path), cache_dir=tmp_path / "cache")
    lines = (tmp_path / "SendRecv.ptx").read_text().splitlines()
    assert any(".target sm_90" in x for x in lines) and any("%globaltimer" in x for x in lines)
    spins = _spin_loops(lines)
    assert len(spins) >= 4, spins  # Simple's tail and head waits, LL's credit wait and line reads
    for first, last in spins:
        bad = [op for op in _memory_ops(lines[first:last + 1]) if not op.startswith(("ld.volatile.global",
                                                                                      "ld.relaxed."))]
        assert not bad, f"spin loop at PTX lines {first}-{last} does {bad}"
    atoms = {m.group(0) for x in lines for m in re.finditer(r"(?<![\w.])(atom|red)\.[\w.]+", x)}
    assert atoms == {"atom.global.cas.b64"}, atoms
    assert any("barrier.red.or.pred" in x for x in lines)
    assert not any(re.search(r"\b(bar|barrier)\.sync\s+0\b", x) for x in lines)
    for i in [i for i, x in enumerate(lines) if "st.relaxed.sys.global" in x]:
        j = i - 1
        while j >= 0 and not re.search(r"\b(ld|st|atom|fence|membar)\.", lines[j]):
            j -= 1
        assert "fence.acq_rel.sys" in lines[j], f"publication at PTX line {i} follows {lines[j].strip()!r}"
