"""What a point-to-point work tells the kernel (NCCL ``src/include/device.h``: ``struct ncclDevWorkP2p``,
``ncclP2pPartBounds``, ``ncclP2pChannelForPart`` and ``ncclP2pChannelToPart``): host planner and kernels share it.

One work holds one round's send and receive of one rank: the peers, the byte counts, over how many channels each
is striped (starting at ``channel_base``, wrapping modulo the p2p channel count), the protocol and the chunk size
in NCCL's 8-bit float.  Where we differ on purpose: the buffers travel as numpy byte arrays, not addresses, and
the registration flags (``sendNetReg``, ``sendIpcReg``) are absent: no user buffer is ever registered here.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .bitops import div_up, round_up


@dataclass
class DevWorkP2p:
    """``ncclDevWorkP2p``; a direction with nothing to do has 0 channels and 0 bytes."""
    n_p2p_channels: int
    channel_base: int
    send_rank: int
    recv_rank: int
    send_bytes: int
    recv_bytes: int
    n_send_channels: int
    n_recv_channels: int
    send_chunk_u32fp8: int
    recv_chunk_u32fp8: int
    send_proto_ll: bool
    recv_proto_ll: bool
    send_buff: np.ndarray | None = None  # uint8 views of the user's buffers (NCCL: sendAddr, recvAddr)
    recv_buff: np.ndarray | None = None
    p2p_round: int = -1  # ours, not NCCL's: the schedule's round, for error lines and the trace


def p2p_part_bounds(nparts: int, part: int, nbytes: int) -> tuple[int, int]:
    """``ncclP2pPartBounds``: the bytes of part ``part`` of ``nparts``, parts a multiple of 4 KiB."""
    part_bytes = round_up(div_up(nbytes, nparts), 4 << 10)
    return min(part * part_bytes, nbytes), min((part + 1) * part_bytes, nbytes)


def p2p_channel_for_part(n_p2p_channels: int, base: int, part: int) -> int:
    """``ncclP2pChannelForPart``: the channel of part ``part`` of a round starting at ``base``."""
    return (base + part) & (n_p2p_channels - 1)


def p2p_channel_to_part(n_p2p_channels: int, base: int, channel: int) -> int:
    """``ncclP2pChannelToPart``, the inverse: which part ``channel`` runs."""
    return (channel - base) & (n_p2p_channels - 1)
