"""Shared-memory transport (NCCL ``src/transport/shm.cc``: ``shmSendSetup``/``shmRecvSetup``/``shmSendConnect``/
``shmRecvConnect``).

With NCCL's default ``NCCL_SHM_LOCALITY=2`` the **receiver** allocates ``ncclRecvMem`` (tail) followed by the FIFO,
and the **sender** allocates ``ncclSendMem`` (head).  Each side publishes its segment name through the bootstrap
(the 256-byte ``ncclConnect`` blob in NCCL), then maps the other's.  Both sides read and write the counters and
the FIFO directly; no proxy is involved (``proxyProgress`` is NULL for SHM).
"""
from __future__ import annotations

import re

from collectives.include.connector import (DOORBELL_OFFSET, HEAD_OFFSET, SENDMEM_BYTES, SLEEP_OFFSET, TAIL_OFFSET, Connector,
                               recv_layout)
from collectives.misc.param import env_int
from collectives.misc.shm_segment import ShmError, ShmSegment
from tracing import debug

from .base import CommInfo, Transport

NAME = "SHM"
_SEGMENT = re.compile(r"nccllab-[0-9a-f]{12}-[A-Za-z0-9-]{1,64}")


def segment_name(blob: bytes, tag: str, peer: int) -> str:
    """A peer's connect blob is the name of its segment: one of this communicator's, nothing else (a name is
    opened under /dev/shm, so a path or another job's segment must never get through)."""
    try:
        name = blob.decode("ascii")
    except UnicodeDecodeError:
        name = ""
    if not _SEGMENT.fullmatch(name) or not name.startswith(f"nccllab-{tag}-"):
        raise ShmError(f"rank {peer} published {blob[:80]!r} as its SHM segment, not one of this communicator's")
    return name


def _index(conn_index: int) -> str:
    """A point-to-point connection's segments are named apart from the collectives' of the same channel and peer."""
    return f"-i{conn_index}" if conn_index else ""


class ShmSetup:
    """Segments this rank creates for one communicator, and the connectors built from the peers' segments."""

    def __init__(self, tag: str, rank: int, buff_sizes: dict):
        self.tag, self.rank, self.buff_sizes = tag, rank, dict(buff_sizes)
        self.offsets, self.recv_bytes = recv_layout(self.buff_sizes)
        self.owned: list[ShmSegment] = []
        self.mapped: list[ShmSegment] = []

    def _create(self, name: str, size: int) -> ShmSegment:
        seg = ShmSegment(name, size, create=True)
        self.owned.append(seg)
        debug.info("SHM", f"MMAP allocated shareable host buffer /dev/shm/{name} size {size} ptr "
                          f"{hex(seg.array.ctypes.data)}")
        return seg

    def recv_setup(self, channel: int, peer: int, conn_index: int = 0) -> str:
        """Receiver side: ncclRecvMem (tail) + the LL, LL128 and Simple FIFOs.  Returns the connect blob (its name)."""
        name = f"nccllab-{self.tag}-r{self.rank}-c{channel}{_index(conn_index)}-recv{peer}"
        self._create(name, self.recv_bytes)
        return name

    def send_setup(self, channel: int, peer: int, conn_index: int = 0) -> str:
        """Sender side: ncclSendMem (head)."""
        name = f"nccllab-{self.tag}-r{self.rank}-c{channel}{_index(conn_index)}-send{peer}"
        self._create(name, SENDMEM_BYTES)
        return name

    def _own(self, name: str) -> ShmSegment:
        return next(s for s in self.owned if s.name == name)

    def _map(self, name: str, size: int) -> ShmSegment:
        seg = ShmSegment(name, size, create=False)
        self.mapped.append(seg)
        return seg

    def _buffs(self, seg: ShmSegment) -> dict:
        return {p: seg.array[off:off + self.buff_sizes[p]] for p, off in self.offsets.items()}

    def send_connect(self, my_blob: str, peer_blob: str, peer: int) -> Connector:
        """Sender: head from our ncclSendMem, tail and FIFOs from the peer's ncclRecvMem."""
        mine, theirs = self._own(my_blob), self._map(peer_blob, self.recv_bytes)
        return Connector(peer=peer, is_send=True, buffs=self._buffs(theirs), head=mine.u64(HEAD_OFFSET),
                         tail=theirs.u64(TAIL_OFFSET), head_sleep=mine.u32(SLEEP_OFFSET),
                         tail_sleep=theirs.u32(SLEEP_OFFSET), doorbell=theirs.u32(DOORBELL_OFFSET), transport=NAME)

    def recv_connect(self, my_blob: str, peer_blob: str, peer: int) -> Connector:
        """Receiver: tail and FIFOs from our ncclRecvMem, head from the peer's ncclSendMem."""
        mine, theirs = self._own(my_blob), self._map(peer_blob, SENDMEM_BYTES)
        return Connector(peer=peer, is_send=False, buffs=self._buffs(mine), head=theirs.u64(HEAD_OFFSET),
                         tail=mine.u64(TAIL_OFFSET), head_sleep=theirs.u32(SLEEP_OFFSET),
                         tail_sleep=mine.u32(SLEEP_OFFSET), doorbell=mine.u32(DOORBELL_OFFSET), transport=NAME)

    def unlink_all(self) -> None:
        """Called once every peer has mapped our segments (after the connect barrier)."""
        for seg in self.owned:
            seg.unlink()

    def close(self) -> None:
        """``shmSendFree`` / ``shmRecvFree`` (``ncclShmIpcClose``): unmap every segment, ours and the peers'.  The
        communicator has dropped the connectors built on them first: their views would keep a mapping open."""
        self.unlink_all()
        for seg in self.owned + self.mapped:
            seg.close()
        self.owned, self.mapped = [], []


class ShmTransport(Transport):
    """``shmTransport``: the segments are the whole connection; no proxy (``proxyProgress`` is NULL for SHM)."""
    name = NAME

    def can_connect(self, my_info: dict, peer_info: dict) -> bool:
        """``shmCanConnect``: same host hash, and SHM not disabled."""
        return env_int("NCCL_SHM_DISABLE", 0) != 1 and my_info["host_hash"] == peer_info["host_hash"]

    def new_state(self, info: CommInfo) -> ShmSetup:
        state = ShmSetup(info.tag, info.rank, info.buff_sizes)
        state.info = info
        return state

    def setup(self, state: ShmSetup, channel: int, peer: int, is_send: bool, conn_index: int = 0,
              graph: int = -1) -> bytes:
        return (state.send_setup if is_send else state.recv_setup)(channel, peer, conn_index).encode()

    def connect(self, state: ShmSetup, channel: int, peer: int, is_send: bool, my_blob: bytes, peer_blob: bytes,
                deadline: float, conn_index: int = 0) -> Connector:
        me, dev = state.info.rank, state.info.dev
        my_blob, peer_blob = my_blob.decode(), segment_name(peer_blob, state.tag, peer)
        if not is_send:
            return state.recv_connect(my_blob, peer_blob, peer)
        debug.info("INIT|SHM", f"Channel {channel:02d} : {me}[{dev(me)}] -> {peer}[{dev(peer)}] via SHM/direct")
        return state.send_connect(my_blob, peer_blob, peer)

    def connected(self, state: ShmSetup) -> None:
        state.unlink_all()  # every peer has mapped our segments: nothing of ours stays in /dev/shm

    def free(self, state: ShmSetup, drain: bool = True) -> None:
        state.close()
