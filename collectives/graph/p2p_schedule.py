"""Who a rank talks to in each point-to-point round, and on which channels (NCCL ``src/init.cc``: ``ncclP2pSchedule``
and ``computeBuffSizes``' ``p2pChunkSize``; ``src/graph/paths.cc``: ``ncclTopoComputeP2pChannelsPerPeer``,
``ncclTopoComputeP2pChannels``; ``src/include/channel.h``: ``ncclP2pChannelBaseForRound``; the per-part channel is
``collectives/include/p2p_work.py``'s).

The schedule has ``nranks`` rounds.  In round ``r`` this rank sends to ``send_rank`` and receives from
``recv_rank``, and every rank's round ``r`` pairs up with its peers' (if I send to p in round r, p receives from me
in its round r).  Ranks are cut into groups of ``p2pSchedGroupSize`` local ranks (a whole node on one node, else
``NCCL_P2P_SCHEDULE_GROUP_SIZE``, 8, shrunk to a common divisor of every node's rank count); the group deltas are
enumerated by the quadratic residues ``(x*x + x) / 2`` mod the next power of two, skipping those past the group
count, and inside each group delta every local delta follows in order.
Where we differ on purpose: NCCL reads a peer's channel count off the topology's path (NVLink bandwidth, NIC count
and speed); the lab's ranks share no NVLink and its topology holds no NIC, so every local peer is a PCIe-class
peer (2 channels) and every remote one gets NCCL's no-NIC default (2), unless NCCL_NCHANNELS_PER_NET_PEER says.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import gcd

from collectives.include.bitops import div_up, log2_up, pow2_down, pow2_up, reverse_bits
from collectives.include.device import MAXCHANNELS, NCCL_STEPS
from collectives.include.p2p_work import p2p_channel_for_part
from collectives.misc.param import env_int

NCCL_MAX_DEV_WORK_P2P_PER_BATCH = 8  # src/include/device.h: p2p works a channel runs side by side
P2P_NET_CHUNKSIZE = 1 << 17          # NCCL_P2P_NET_CHUNKSIZE: ranks on several nodes
P2P_PCI_CHUNKSIZE = 1 << 17          # NCCL_P2P_PCI_CHUNKSIZE: one node, not all NVLink
P2P_NVL_CHUNKSIZE = 1 << 19          # NCCL_P2P_NVL_CHUNKSIZE: one node, all NVLink
PCI_PEER_CHANNELS = 2                # ncclTopoGetNchannels for a local peer over PCIe
NET_PEER_CHANNELS = 2                # ncclTopoGetNchannels for a remote peer when no NIC is known


def node_ranks(node_of_rank: list[int]) -> list[list[int]]:
    """``comm->nodeRanks[n].localRankToRank``: each node's ranks in rank order."""
    nodes: list[list[int]] = [[] for _ in range(max(node_of_rank) + 1)]
    for r, n in enumerate(node_of_rank):
        nodes[n].append(r)
    return nodes


def sched_group_size(node_of_rank: list[int]) -> int:
    """``p2pSchedGroupSize``: the whole largest node on one node, else NCCL_P2P_SCHEDULE_GROUP_SIZE; then cut to a
    divisor of every node's rank count, node by node as NCCL does."""
    nodes = node_ranks(node_of_rank)
    size = env_int("NCCL_P2P_SCHEDULE_GROUP_SIZE", NCCL_MAX_DEV_WORK_P2P_PER_BATCH) if len(nodes) > 1 else \
        max(len(n) for n in nodes)
    for ranks in nodes:
        if len(ranks) % size != 0 or len(ranks) < size:
            size = gcd(size, len(ranks))
    return size


def p2p_schedule(rank: int, node_of_rank: list[int]) -> list[tuple[int, int]]:
    """``ncclP2pSchedule``: this rank's (send peer, recv peer) of each of the ``nranks`` rounds."""
    nranks = len(node_of_rank)
    nodes = node_ranks(node_of_rank)
    size = sched_group_size(node_of_rank)
    my_node = node_of_rank[rank]
    local_rank = nodes[my_node].index(rank)
    local, group = local_rank % size, local_rank // size
    # every group's node and its first local rank; my group counts the groups of the nodes before mine
    group_node, group_local = [], []
    for n, ranks in enumerate(nodes):
        for g in range(len(ranks) // size):
            group_node.append(n)
            group_local.append(g * size)
        if n < my_node:
            group += len(ranks) // size
    ngroups = nranks // size
    if len(group_node) != ngroups:
        raise RuntimeError(f"p2p schedule: {len(group_node)} groups of {size} for {nranks} ranks")
    ngroups_pow2 = pow2_up(ngroups)
    schedule = []
    group_round = group_delta = 0
    while True:
        if group_delta < ngroups:  # the residues past the group count give no group: skip them
            send_group, recv_group = (group + group_delta) % ngroups, (group - group_delta + ngroups) % ngroups
            for delta in range(size):
                send_local = group_local[send_group] + (local + delta) % size
                recv_local = group_local[recv_group] + (local - delta + size) % size
                schedule.append((nodes[group_node[send_group]][send_local],
                                 nodes[group_node[recv_group]][recv_local]))
        group_round += 1
        group_delta = (group_delta + group_round) & (ngroups_pow2 - 1)  # the next triangular number, mod 2^k
        if group_round == ngroups_pow2:
            break
    if len(schedule) != nranks:
        raise RuntimeError(f"p2p schedule has {len(schedule)} rounds for {nranks} ranks")
    return schedule


def p2p_channels_per_peer_for_rank(rank: int, node_of_rank: list[int]) -> int:
    """``ncclTopoComputeP2pChannelsPerPeer``: the fewest channels any peer gets (itself excluded; MAXCHANNELS with
    no peer)."""
    per_net_peer = env_int("NCCL_NCHANNELS_PER_NET_PEER", -1)
    net = per_net_peer if per_net_peer > 0 else NET_PEER_CHANNELS  # NCCL ignores a value <= 0
    counts = [PCI_PEER_CHANNELS if node_of_rank[r] == node_of_rank[rank] else net
              for r in range(len(node_of_rank)) if r != rank]
    return min([MAXCHANNELS] + counts)


@dataclass(frozen=True)
class P2pChannels:
    """``comm->p2pnChannels``, ``p2pnChannelsPerPeer``, ``p2pSchedGroupSize`` and ``p2pChunkSize``."""
    n_channels: int
    n_channels_per_peer: int
    group_size: int
    chunk_size: int
    nnodes: int

    def channel_base_for_round(self, p2p_round: int) -> int:
        """``ncclP2pChannelBaseForRound``: the first channel of a round, bit-reversed so that consecutive rounds
        land far apart; on several nodes, rounds of one batch of a group delta share a base."""
        if self.nnodes > 1:
            group_delta, local_delta = divmod(p2p_round, self.group_size)
            base = group_delta * div_up(self.group_size, NCCL_MAX_DEV_WORK_P2P_PER_BATCH)
            base += local_delta // NCCL_MAX_DEV_WORK_P2P_PER_BATCH
        else:
            base = p2p_round
        return reverse_bits(base, log2_up(self.n_channels)) & 0xFF  # NCCL returns it as a uint8_t

    def channel_for_part(self, base: int, part: int) -> int:
        """``ncclP2pChannelForPart``: the channel of part ``part`` of a round starting at ``base``."""
        return p2p_channel_for_part(self.n_channels, base, part)

    def channels_of_round(self, p2p_round: int, nparts: int | None = None) -> list[int]:
        """The channels of the first ``nparts`` parts of a round (all ``n_channels_per_peer`` by default)."""
        base = self.channel_base_for_round(p2p_round)
        return [self.channel_for_part(base, p) for p in range(self.n_channels_per_peer if nparts is None else nparts)]


def p2p_chunk_size(nnodes: int, all_nvlink: bool, simple_buff_size: int) -> int:
    """``computeBuffSizes``' ``p2pChunkSize``: by transport class, never more than a Simple FIFO slot."""
    if nnodes > 1:
        chunk = env_int("NCCL_P2P_NET_CHUNKSIZE", P2P_NET_CHUNKSIZE)  # ratio 1: not an ARM host with Blackwell
    elif all_nvlink:
        chunk = env_int("NCCL_P2P_NVL_CHUNKSIZE", P2P_NVL_CHUNKSIZE)
    else:
        chunk = env_int("NCCL_P2P_PCI_CHUNKSIZE", P2P_PCI_CHUNKSIZE)
    if chunk * NCCL_STEPS > simple_buff_size:
        chunk = simple_buff_size // NCCL_STEPS
    return chunk


def compute_p2p_channels(nchannels: int, per_peer_of_rank: list[int], nranks: int, nnodes: int,
                         chunk_size: int, group_size: int) -> P2pChannels:
    """``ncclTopoComputeP2pChannels`` after the allgather's minimum of every rank's ``p2pnChannelsPerPeer``: the p2p
    channel count between NCCL_MIN_P2P_NCHANNELS and NCCL_MAX_P2P_NCHANNELS, both counts powers of two, and on
    several nodes (NCCL_NCHANNELS_PER_NET_PEER unset) fewer channels per peer so that a round's peers fit."""
    n = min(nchannels, env_int("NCCL_MAX_P2P_NCHANNELS", MAXCHANNELS))
    n = max(n, env_int("NCCL_MIN_P2P_NCHANNELS", 1))
    per_peer = pow2_up(min(per_peer_of_rank))
    # pow2Down(ncclDevMaxChannelsForArgsBytes(NCCL_WORK_ARGS_BYTES)): MAXCHANNELS with the default args size
    n = min(pow2_up(n), pow2_down(MAXCHANNELS))
    if nnodes > 1 and env_int("NCCL_NCHANNELS_PER_NET_PEER", -1) <= 0:
        max_peers = nranks  # comm->p2pMaxPeers: no maxP2pPeers in the config
        while per_peer * div_up(max_peers, NCCL_MAX_DEV_WORK_P2P_PER_BATCH) > n and per_peer > 1:
            per_peer //= 2
    else:
        per_peer = min(n, per_peer)
    return P2pChannels(n, per_peer, group_size, chunk_size, nnodes)


def p2p_channels(nchannels: int, node_of_rank: list[int], simple_buff_size: int) -> P2pChannels:
    """Everything above for a communicator of ``nchannels`` channels (every rank computes the same)."""
    nranks, nnodes = len(node_of_rank), max(node_of_rank) + 1
    per_peer = [p2p_channels_per_peer_for_rank(r, node_of_rank) for r in range(nranks)]
    return compute_p2p_channels(nchannels, per_peer, nranks, nnodes, p2p_chunk_size(nnodes, False, simple_buff_size),
                                sched_group_size(node_of_rank))
