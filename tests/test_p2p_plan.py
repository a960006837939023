"""The p2p planner (``collectives/enqueue_p2p.py``: NCCL's addP2pToPlan) against its formulas written again here,
and the kernel's send and receive (``collectives/device/sendrecv.py``: runSend / runRecv) moving bytes bitwise
through real connectors: a sender's and a receiver's generators in one kernel, the two connectors of each
channel sharing their memory as SHM's do across processes."""
import numpy as np
import pytest

from collectives.device.common import Kernel
from collectives.device.sendrecv import channel_works
from collectives.enqueue_p2p import add_p2p_to_plan, channel_range, direction_channels
from collectives.include.bitops import u32fp8_decode, u32fp8_encode
from collectives.include.connector import Connector
from collectives.include.p2p_work import p2p_part_bounds
from collectives.include.protocols import PROTOS, buffer_sizes
from collectives.graph.p2p_schedule import P2pChannels

BUFFS = buffer_sizes()


def ref_u32fp8(x: int) -> int:
    """The largest value NCCL's 8-bit float keeps of x: the leading bit and the three below it."""
    if x < 16:
        return x
    top = x.bit_length() - 1
    return (x >> (top - 3)) << (top - 3)


def test_u32fp8_round_trip():
    for x in list(range(0, 300)) + [1 << 17, (1 << 17) - 1, 1 << 15, 3 << 14, 123457, 0xFFFFFFFF]:
        assert u32fp8_decode(u32fp8_encode(x)) == ref_u32fp8(x), x
    assert u32fp8_decode(u32fp8_encode(0xFFFFFFFF)) == 0xF0000000  # u32fp8MaxValue


def test_part_bounds():
    for nbytes in (0, 1, 4095, 4096, 4097, 100000, 1 << 20):
        for nparts in (1, 2, 3, 4):
            parts = [p2p_part_bounds(nparts, p, nbytes) for p in range(nparts)]
            assert parts[0][0] == 0 and parts[-1][1] == nbytes
            assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))
            assert all(beg % 4096 == 0 or beg == nbytes for beg, _ in parts)


def ref_channels(nbytes, step, nnodes, n_min, n_max):
    if nbytes < 0:
        return 0
    if nbytes == 0:
        return 1
    lo, hi = (step // 2, step) if nnodes > 1 else (step // 8, 32 * step)
    n = min(n_min, -(-nbytes // lo))
    while max(lo, -(-nbytes // n)) > hi and n <= n_max // 2:
        n *= 2
        lo = 0  # from the first doubling on, the part is the plain quotient
    return n


@pytest.mark.parametrize("nnodes", [1, 2])
def test_direction_channels(nnodes):
    for nbytes in (-1, 0, 1, 8191, 16384, 16385, 65536, 1 << 20, 5 << 20, 64 << 20, 300 << 20):
        for n_min, n_max in ((1, 1), (1, 2), (2, 2), (1, 8), (4, 8)):
            assert direction_channels(nbytes, 1 << 17, nnodes, n_min, n_max) == \
                ref_channels(nbytes, 1 << 17, nnodes, n_min, n_max), (nbytes, n_min, n_max)


def test_channel_range():
    ch = P2pChannels(4, 2, 4, 1 << 17, 1)
    assert channel_range(ch, 2) == (2, 2)
    assert channel_range(ch, 3) == (1, 2)
    assert channel_range(P2pChannels(64, 8, 8, 1 << 17, 1), 8) == (8, 8)


@pytest.mark.parametrize("nbytes,ll", [(0, True), (1, True), (16384, True), (16385, False), (32768, False)])
def test_protocol_and_chunk(nbytes, ll, monkeypatch):
    ch = P2pChannels(2, 2, 2, 1 << 17, 1)
    work, ops = add_p2p_to_plan(ch, 0, BUFFS, 1, 1, 1, 1, nbytes, 1, nbytes)
    assert work.send_proto_ll == work.recv_proto_ll == ll
    ll_data = BUFFS["LL"] // 8 // 2
    assert u32fp8_decode(work.send_chunk_u32fp8) == (ll_data if ll else 1 << 17)
    assert all(op.proto == ("LL" if ll else "Simple") for op in ops)
    # a self-send never uses LL, and has no proxy op
    work, ops = add_p2p_to_plan(ch, 0, BUFFS, 1, 1, 0, 0, nbytes, 0, nbytes)
    assert not work.send_proto_ll and not ops
    # no LL buffers on the connection (NET p2p without NCCL_ALLOC_P2P_NET_LL_BUFFERS): Simple
    work, _ = add_p2p_to_plan(ch, 0, BUFFS, 1, 1, 1, 1, nbytes, 1, nbytes, ll_buffers=(False, False))
    assert not work.send_proto_ll
    monkeypatch.setenv("NCCL_P2P_LL_THRESHOLD", "0")
    work, _ = add_p2p_to_plan(ch, 0, BUFFS, 1, 1, 1, 1, nbytes, 1, nbytes)
    assert work.send_proto_ll == (nbytes == 0)


def test_network_chunks_and_proxy_steps():
    ch = P2pChannels(4, 2, 2, 1 << 17, 2)
    for nbytes, chunk in ((100000, 1 << 15), (1 << 19, 1 << 16), (1 << 21, 1 << 17)):
        work, ops = add_p2p_to_plan(ch, 0, BUFFS, 1, 2, 1, 2, nbytes, 3, -1, ll_buffers=(False, False),
                                    network=(True, True))
        assert u32fp8_decode(work.send_chunk_u32fp8) == chunk and work.n_recv_channels == 0
        sends = [op for op in ops if op.is_send]
        assert {op.peer for op in sends} == {2} and not [op for op in ops if not op.is_send]
        for part, op in enumerate(sends):
            beg, end = p2p_part_bounds(work.n_send_channels, part, nbytes)
            assert op.nsteps == -(-(end - beg) // chunk) and op.nbytes == min(end - beg, chunk)
            assert op.channel == ch.channel_for_part(work.channel_base, part)


def loopback(peer_of_sender: int, peer_of_receiver: int) -> tuple[Connector, Connector]:
    """A send and a recv connector over the same memory (what SHM maps in two processes)."""
    mem = dict(buffs={p: np.zeros(BUFFS[p], np.uint8) for p in PROTOS}, head=np.zeros(1, np.uint64),
               tail=np.zeros(1, np.uint64), head_sleep=np.zeros(1, np.uint32), tail_sleep=np.zeros(1, np.uint32),
               doorbell=np.zeros(1, np.uint32))
    return (Connector(peer=peer_of_sender, is_send=True, **mem),
            Connector(peer=peer_of_receiver, is_send=False, **mem))


def kernel() -> Kernel:
    return Kernel(0, 0, "SendRecv", lambda k: None, lambda peer: None)


@pytest.mark.parametrize("nchannels,per_peer", [(1, 1), (4, 2), (8, 8)])
def test_send_recv_through_the_kernel(nchannels, per_peer):
    """Rank 0 sends to rank 1 over every channel of the round; sizes across both protocols, several chunks and
    parts; the connectors' steps carry over from one op to the next."""
    ch = P2pChannels(nchannels, per_peer, 2, 1 << 17, 1)
    conns = {c: loopback(1, 0) for c in range(nchannels)}
    rng = np.random.default_rng(7)
    n_min, n_max = channel_range(ch, 2)
    for nbytes in (0, 1, 13, 4097, 16384, 16385, 3 * (1 << 17) + 5, 5 << 20):
        src = rng.integers(0, 256, nbytes, dtype=np.uint8)
        dst = np.full(nbytes, 0xFF, np.uint8)
        send_work, _ = add_p2p_to_plan(ch, 0, BUFFS, n_min, n_max, 1, 1, nbytes, 1, -1)
        recv_work, _ = add_p2p_to_plan(ch, 1, BUFFS, n_min, n_max, 1, 0, -1, 0, nbytes)
        send_work.send_buff, recv_work.recv_buff = src, dst
        k = kernel()
        works = []
        for c in range(nchannels):
            works += channel_works(k, c, 0, send_work, conns[c][0], None)
            works += channel_works(k, c, 1, recv_work, None, conns[c][1])
        k.run(works)
        assert np.array_equal(src, dst), nbytes
        # every used connection moved the same steps on both ends, and the next op starts from there
        assert all(s.step == r.step for s, r in conns.values())


def test_self_send_is_a_copy():
    ch = P2pChannels(4, 2, 1, 1 << 17, 1)
    for nbytes in (0, 1, 4097, 1 << 20):
        src = np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8)
        dst = np.full(nbytes, 0xFF, np.uint8)
        work, ops = add_p2p_to_plan(ch, 0, BUFFS, 2, 2, 0, 0, nbytes, 0, nbytes)
        work.send_buff, work.recv_buff = src, dst
        k = kernel()
        k.run([g for c in range(4) for g in channel_works(k, c, 0, work, None, None)])
        assert np.array_equal(src, dst) and not ops


def test_chunk_size_parameter_must_fit_a_slot(monkeypatch):
    ch = P2pChannels(2, 2, 2, 1 << 17, 1)
    monkeypatch.setenv("NCCL_CHUNK_SIZE", str(BUFFS["Simple"] // 8))
    work, _ = add_p2p_to_plan(ch, 0, BUFFS, 1, 1, 1, 1, 1 << 20, 1, -1)
    assert u32fp8_decode(work.send_chunk_u32fp8) == BUFFS["Simple"] // 8
    monkeypatch.setenv("NCCL_CHUNK_SIZE", str(BUFFS["Simple"] // 4))
    with pytest.raises(ValueError, match="exceeds its FIFO slot"):
        add_p2p_to_plan(ch, 0, BUFFS, 1, 1, 1, 1, 1 << 20, 1, -1)
    with pytest.raises(ValueError, match="LL chunk"):  # 1 KiB is LL, whose slot holds 32 KiB of data
        add_p2p_to_plan(ch, 0, BUFFS, 1, 1, 1, 1, 1024, 1, -1)
