"""The p2p schedule and channels (``collectives/graph/p2p_schedule.py``) against NCCL's formulas, written again here in
another form: the group deltas as closed-form triangular numbers, the groups as slices of each node's ranks."""
from math import gcd

import pytest

from collectives.include.device import MAXCHANNELS
from collectives.graph.p2p_schedule import P2pChannels, compute_p2p_channels, p2p_channels, p2p_schedule

from conftest import run_ranks


def node_major(nranks: int, nnodes: int) -> list[int]:
    """Ranks in node order, the first ``nranks % nnodes`` nodes one rank larger."""
    sizes = [nranks // nnodes + (i < nranks % nnodes) for i in range(nnodes)]
    return [n for n, size in enumerate(sizes) for _ in range(size)]


def reference_schedule(rank: int, node_of_rank: list[int]) -> list[tuple[int, int]]:
    nodes = [[r for r, n in enumerate(node_of_rank) if n == k] for k in range(max(node_of_rank) + 1)]
    size = 8 if len(nodes) > 1 else max(map(len, nodes))
    for ranks in nodes:
        if len(ranks) % size or len(ranks) < size:
            size = gcd(size, len(ranks))
    groups = [ranks[i:i + size] for ranks in nodes for i in range(0, len(ranks), size)]
    mine = next(g for g, ranks in enumerate(groups) if rank in ranks)
    local = groups[mine].index(rank)
    pow2 = 1
    while pow2 < len(groups):
        pow2 *= 2
    deltas = [d for d in ((x * (x + 1) // 2) % pow2 for x in range(pow2)) if d < len(groups)]
    out = []
    for d in deltas:
        send, recv = groups[(mine + d) % len(groups)], groups[(mine - d) % len(groups)]
        out += [(send[(local + i) % size], recv[(local - i) % size]) for i in range(size)]
    return out


@pytest.mark.parametrize("nnodes", [1, 2, 3, 4])
def test_schedule_matches_nccl_formula(nnodes):
    for nranks in range(max(1, nnodes), 17):
        layout = node_major(nranks, nnodes)
        for rank in range(nranks):
            got = p2p_schedule(rank, layout)
            assert got == reference_schedule(rank, layout), (nranks, nnodes, rank)
            assert sorted(s for s, _ in got) == list(range(nranks)), (nranks, nnodes, rank)
            assert sorted(r for _, r in got) == list(range(nranks)), (nranks, nnodes, rank)
            assert got[0] == (rank, rank)  # round 0 is the self round


@pytest.mark.parametrize("nnodes", [1, 2, 3, 4])
def test_rounds_pair_up_across_ranks(nnodes):
    """Whom I send to in round r receives from me in its round r: the rounds of all ranks match."""
    for nranks in range(max(1, nnodes), 17):
        layout = node_major(nranks, nnodes)
        scheds = [p2p_schedule(r, layout) for r in range(nranks)]
        for rank in range(nranks):
            for rnd, (send, recv) in enumerate(scheds[rank]):
                assert scheds[send][rnd][1] == rank and scheds[recv][rnd][0] == rank, (nranks, nnodes, rank, rnd)


def test_sixteen_rank_sequence_of_nccl_comment():
    # 16 groups of one rank (16 nodes): the peer deltas are the sequence in ncclP2pSchedule's comment
    layout = list(range(16))
    want = [0, 1, 3, 6, 10, 15, 5, 12, 4, 13, 7, 2, 14, 11, 9, 8]
    for rank in range(16):
        assert [(s - rank) % 16 for s, _ in p2p_schedule(rank, layout)] == want
        assert [(rank - r) % 16 for _, r in p2p_schedule(rank, layout)] == want


def test_interleaved_nodes_and_group_size():
    layout = [0, 1, 0, 1, 0, 1]  # ranks alternate between two nodes: localRankToRank is not contiguous
    for rank in range(6):
        assert p2p_schedule(rank, layout) == reference_schedule(rank, layout)
    layout = [0] * 16 + [1] * 16  # two nodes of 16: groups of NCCL_P2P_SCHEDULE_GROUP_SIZE = 8
    for rank in (0, 9, 17, 31):
        assert p2p_schedule(rank, layout) == reference_schedule(rank, layout)


def test_group_size_parameter(monkeypatch):
    monkeypatch.setenv("NCCL_P2P_SCHEDULE_GROUP_SIZE", "2")
    layout = [0] * 8 + [1] * 8
    assert p2p_channels(2, layout, 4 << 20).group_size == 2
    got = p2p_schedule(3, layout)
    monkeypatch.delenv("NCCL_P2P_SCHEDULE_GROUP_SIZE")
    assert got != p2p_schedule(3, layout)
    assert sorted(s for s, _ in got) == list(range(16))


def reversed_bits(x: int, nbits: int) -> int:
    out = 0
    for i in range(nbits):
        out |= ((x >> i) & 1) << (nbits - 1 - i)
    return out


def reference_base(p2p_round: int, nchannels: int, nnodes: int, group: int) -> int:
    if nnodes > 1:
        base = (p2p_round // group) * -(-group // 8) + (p2p_round % group) // 8
    else:
        base = p2p_round
    nbits = (nchannels - 1).bit_length()
    return reversed_bits(base % (1 << nbits), nbits) % 256


@pytest.mark.parametrize("nchannels,nnodes,group", [(1, 1, 4), (2, 1, 4), (4, 1, 16), (8, 2, 8), (16, 2, 16),
                                                    (64, 4, 8), (32, 3, 2)])
def test_channel_base_and_parts(nchannels, nnodes, group):
    ch = P2pChannels(nchannels, min(2, nchannels), group, 1 << 17, nnodes)
    for rnd in range(4 * group * nnodes):
        base = ch.channel_base_for_round(rnd)
        assert base == reference_base(rnd, nchannels, nnodes, group), rnd
        for part in range(nchannels):
            assert ch.channel_for_part(base, part) == (base + part) % nchannels
        assert ch.channels_of_round(rnd) == [(base + p) % nchannels for p in range(ch.n_channels_per_peer)]


def reference_counts(nchannels: int, per_peer: int, nranks: int, nnodes: int, max_p2p: int = MAXCHANNELS,
                     min_p2p: int = 1, net_peer_set: bool = False) -> tuple[int, int]:
    pow2 = lambda x: 1 << max(0, (x - 1).bit_length())  # noqa: E731
    n = min(pow2(max(min(nchannels, max_p2p), min_p2p)), MAXCHANNELS)
    per_peer = pow2(per_peer)
    if nnodes > 1 and not net_peer_set:
        while per_peer * -(-nranks // 8) > n and per_peer > 1:
            per_peer //= 2
    return n, min(n, per_peer)


@pytest.mark.parametrize("nchannels,nranks,nnodes", [(1, 1, 1), (2, 2, 1), (2, 4, 1), (3, 3, 1), (4, 4, 2),
                                                     (8, 16, 2), (2, 40, 4), (24, 8, 1), (64, 64, 8)])
def test_channel_counts(nchannels, nranks, nnodes, monkeypatch):
    layout = node_major(nranks, nnodes)
    got = p2p_channels(nchannels, layout, 4 << 20)
    per_peer = MAXCHANNELS if nranks == 1 else 2  # PCIe-class local peers and NICless remote ones: 2 each
    assert (got.n_channels, got.n_channels_per_peer) == reference_counts(nchannels, per_peer, nranks, nnodes)
    assert got.chunk_size == 1 << 17
    monkeypatch.setenv("NCCL_MAX_P2P_NCHANNELS", "1")
    assert p2p_channels(nchannels, layout, 4 << 20).n_channels == 1
    monkeypatch.setenv("NCCL_MAX_P2P_NCHANNELS", "64")
    monkeypatch.setenv("NCCL_MIN_P2P_NCHANNELS", "5")
    assert p2p_channels(nchannels, layout, 4 << 20).n_channels == max(8, got.n_channels)
    monkeypatch.delenv("NCCL_MIN_P2P_NCHANNELS")
    monkeypatch.setenv("NCCL_NCHANNELS_PER_NET_PEER", "4")
    per_peer = per_peer if nnodes == 1 else 4 if nranks == nnodes else 2  # the local peers' 2 stays the minimum
    got = p2p_channels(nchannels, layout, 4 << 20)
    assert (got.n_channels, got.n_channels_per_peer) == reference_counts(nchannels, per_peer, nranks, nnodes,
                                                                         net_peer_set=True)


def test_per_peer_minimum_across_ranks():
    # ncclTopoComputeP2pChannels runs on the allgather's minimum of every rank's p2pnChannelsPerPeer
    assert compute_p2p_channels(4, [4, 3, 8], 3, 1, 1 << 17, 3).n_channels_per_peer == 4  # pow2Up(3)
    assert compute_p2p_channels(2, [8, 8], 2, 1, 1 << 17, 2).n_channels_per_peer == 2     # at most p2pnChannels


def test_chunk_size_clamped_to_a_simple_slot(monkeypatch):
    layout = [0, 0, 1, 1]
    assert p2p_channels(2, layout, 1 << 20).chunk_size == (1 << 20) // 8
    monkeypatch.setenv("NCCL_P2P_NET_CHUNKSIZE", "65536")
    assert p2p_channels(2, layout, 4 << 20).chunk_size == 65536
    assert p2p_channels(2, [0, 0], 4 << 20).chunk_size == 1 << 17  # one node: the PCI chunk size
    monkeypatch.setenv("NCCL_P2P_PCI_CHUNKSIZE", "32768")
    assert p2p_channels(2, [0, 0], 4 << 20).chunk_size == 32768


@pytest.mark.parametrize("nranks,nodes", [(3, 1), (4, 2)])
def test_communicator_schedule(nranks, nodes):
    """``Communicator.p2p_schedule()`` on real ranks (emulated nodes are node-major) is NCCL's schedule."""
    proc = run_ranks(nranks, "p2p_schedule", nodes=nodes, script="p2p_workers.py")
    lines = sorted(line for line in proc.stdout.splitlines() if line.startswith("schedule "))
    assert len(lines) == nranks
    layout = node_major(nranks, nodes)
    for line in lines:
        _, rank, text = line.split(" ", 2)
        assert eval(text) == reference_schedule(int(rank), layout)  # noqa: S307 - our own worker's repr
