"""Peer-to-peer transport between ranks on one node's GPUs (NCCL ``src/transport/p2p.cc``: ``p2pCanConnect``,
``p2pSendSetup``/``p2pRecvSetup``, ``p2pSendConnect``/``p2pRecvConnect``, ``p2pMap``; ``src/graph/paths.cc``:
``ncclTopoCheckP2p`` decides read or write).

* **Can connect:** both ranks run on a GPU device (``cuda``, or numba's simulator ``cudasim``) on the same host, and
  ``NCCL_P2P_DISABLE`` is not 1.  P2P is first in the registry, as in NCCL, so on a GPU every intra-node edge is P2P.
* **Write or read:** write by default.  NCCL turns read on only for NVLink between two sm80 GPUs; ranks sharing one
  GPU have no NVLink path, so it is off unless ``NCCL_P2P_READ_ENABLE=1``.  With read, NCCL places the Simple FIFO
  in the sender's memory (``ncclSendMem``) and LL stays with the receiver; the log line then ends in ``/read``.
* **How a rank reaches its peer's memory:** ranks in one process use the pointer itself (``via P2P/direct
  pointer``, ``collectives/device/cuda/threads.py``); ranks in separate processes on ``cuda`` exchange a legacy CUDA IPC
  handle (cupy's ``ipcGetMemHandle``/``ipcOpenMemHandle``: ``via P2P/IPC``).  Under ``cudasim`` the simulator's
  device memory is host memory, so the pool is a POSIX shared-memory segment standing in for the IPC handle (said
  at INFO); the log line stays ``via P2P/IPC``.
Deliberate differences: the connection memory of a node is one pool (``collectives/device/cuda/layout.py``), made
by the node's first rank and opened by the others, instead of one allocation and handle per connection; and no
``P2P/CUMEM`` (cuMem handles passed as file descriptors), which ``scripts/gpu_check.py`` only probes.
"""
from __future__ import annotations

import os
import struct

import numpy as np

from collectives.misc.param import env_int
from collectives.misc.shm_segment import ShmSegment
from tracing import debug

from .base import CommInfo, Transport

NAME = "P2P"
GPU_DEVICES = ("cuda", "cudasim")
HANDLE_BYTES = 64  # cudaIpcMemHandle_t
_IN_PROCESS: dict = {}  # cuda: pools this process owns, by name (a rank of the same process uses the pointer)
_RETIRED: list = []     # cuda: pools of destroyed communicators, kept until the process ends (see close)


class P2PError(RuntimeError):
    """Two ranks P2P cannot join (e.g. GPUs without peer access); the message is one line."""


def use_read() -> bool:
    """``p2pGetInfo``: the topology's answer (no NVLink between ranks of one GPU: write), unless
    ``NCCL_P2P_READ_ENABLE`` says otherwise."""
    return env_int("NCCL_P2P_READ_ENABLE", -2) == 1


def log_connection(channel: int, me: int, my_dev: int, peer: int, peer_dev: int, path: str,
                   conn_index: int = 0) -> None:
    """``p2pSendSetup``'s INFO line, printed by the sending side (``conn_index`` 1: a point-to-point connector)."""
    debug.info("INIT|P2P", f"Channel {channel:02d}/{conn_index} : {me}[{my_dev}] -> {peer}[{peer_dev}] via P2P/{path}"
                           f"{'/read' if use_read() else ''}")


class P2PState:
    """The node's pool as this rank sees it: the owner (the node's first rank) allocates it, the others open it."""

    def __init__(self, info: CommInfo, device):
        self.info, self.device = info, device
        self.owner = info.dev(info.rank) == 0
        self.name = f"nccllab-{info.tag}-p2p"
        self.segment: ShmSegment | None = None
        self.base = None       # uint8 device array of the whole pool
        self.ipc_ptr = None    # cuda, not the owner: the opened IPC mapping
        if self.owner:
            self._create()

    def _create(self) -> None:
        nbytes = self.info.pool_bytes
        if self.device.name == "cudasim":
            self.segment = ShmSegment(self.name, nbytes, create=True)
            debug.info("P2P", f"numba's CUDA simulator: the P2P pool ({nbytes} bytes) is POSIX shared memory "
                              f"/dev/shm/{self.name}, standing in for a cudaIpcMemHandle")
            self.base = self.device.wrap(self.segment.array)
            return
        cp = self.device.cp  # pragma: no cover - needs a GPU
        # A cudaMalloc of its own: an IPC handle names a whole allocation, and cupy's pool may hand out a piece of
        # a larger one, whose offset the importer would not know.
        mem = cp.cuda.Memory(nbytes)
        cp.cuda.runtime.memset(mem.ptr, 0, nbytes)
        cp.cuda.runtime.deviceSynchronize()  # zeroed before any peer maps it
        self.base = cp.ndarray((nbytes,), np.uint8, cp.cuda.MemoryPointer(mem, 0))
        _IN_PROCESS[self.name] = self.base  # ranks of this process use the pointer itself (P2P/direct pointer)
        handle = cp.cuda.runtime.ipcGetMemHandle(mem.ptr)
        self.segment = ShmSegment(self.name, HANDLE_BYTES + 8, create=True)  # the handle, then the owner's GPU
        self.segment.array[:len(handle)] = np.frombuffer(handle, np.uint8)
        self.segment.array[HANDLE_BYTES:].view(np.int64)[0] = cp.cuda.runtime.getDevice()
        debug.info("P2P|ALLOC", f"Allocated shareable buffer {hex(self.base.data.ptr)} size {nbytes}")

    def open(self) -> None:
        """A non-owner maps the pool; called after the connect blobs' allgather, so the owner has made it."""
        if self.base is not None:
            return
        nbytes = self.info.pool_bytes
        if self.device.name == "cudasim":
            self.segment = ShmSegment(self.name, nbytes, create=False)
            self.base = self.device.wrap(self.segment.array)
            return
        cp = self.device.cp  # pragma: no cover - needs a GPU
        if self.name in _IN_PROCESS:  # the owner is a rank of this process: no handle (CUDA refuses one there)
            self.base = _IN_PROCESS[self.name]
            return
        self.segment = ShmSegment(self.name, HANDLE_BYTES + 8, create=False)
        me, owner = cp.cuda.runtime.getDevice(), int(self.segment.array[HANDLE_BYTES:].view(np.int64)[0])
        if me != owner and not cp.cuda.runtime.deviceCanAccessPeer(me, owner):
            raise P2PError(f"rank {self.info.rank}: GPU {me} cannot reach GPU {owner}'s memory (no peer "
                           f"access): P2P cannot connect them")
        self.ipc_ptr = cp.cuda.runtime.ipcOpenMemHandle(bytes(self.segment.array[:HANDLE_BYTES]))
        mem = cp.cuda.UnownedMemory(self.ipc_ptr, nbytes, self, device_id=me)
        self.base = cp.ndarray((nbytes,), np.uint8, cp.cuda.MemoryPointer(mem, 0))
        debug.info("P2P", f"Imported shareable buffer device {self.info.dev(self.info.rank)} size {nbytes} ptr "
                          f"{hex(self.ipc_ptr)}")

    def close(self) -> None:
        if self.segment is not None:
            self.segment.unlink()
        if self.ipc_ptr is not None:  # pragma: no cover - needs a GPU
            self.device.cp.cuda.runtime.ipcCloseMemHandle(self.ipc_ptr)
            self.ipc_ptr = None
        elif self.owner and self.device.name == "cuda":  # pragma: no cover - needs a GPU
            # CUDA leaves it undefined to free exported memory while an importer still maps it, and the peers
            # close theirs in their own time: the owner keeps the pool until its process ends.
            _RETIRED.append(_IN_PROCESS.pop(self.name, self.base))
        self.base = None  # first: under cudasim the pool is a view of the segment, which cannot unmap under it
        if self.segment is not None:
            self.segment.close()
            self.segment = None


_BLOB = struct.Struct("<i")  # the connect blob: the peer process's pid


class P2PConnector:
    """What the communicator keeps per (channel, peer, direction): the pool row is found by
    ``layout.connection_tables``; the kernel reads it from the pool, not from here."""

    def __init__(self, peer: int, is_send: bool, path: str):
        self.peer, self.is_send, self.transport = peer, is_send, f"P2P/{path}"
        self.proxy_conn = None  # no proxy: the GPUs reach each other's memory


class P2PTransport(Transport):
    name = NAME

    def can_connect(self, my_info: dict, peer_info: dict) -> bool:
        """``p2pCanConnect``: same host, both on a GPU device, P2P not disabled."""
        return (my_info.get("device") in GPU_DEVICES and peer_info.get("device") == my_info.get("device")
                and my_info["host_hash"] == peer_info["host_hash"] and env_int("NCCL_P2P_DISABLE", 0) != 1)

    def new_state(self, info: CommInfo) -> P2PState:
        return P2PState(info, info.device)

    def setup(self, state: P2PState, channel: int, peer: int, is_send: bool, conn_index: int = 0,
              graph: int = -1) -> bytes:
        if conn_index:  # the pool's layout has one connection per (channel, peer): the collectives'
            raise NotImplementedError("the P2P transport has no point-to-point connections (connIndex 1)")
        return _BLOB.pack(os.getpid())  # the peer in this same process takes the pointer itself

    def connect(self, state: P2PState, channel: int, peer: int, is_send: bool, my_blob, peer_blob,
                deadline: float, conn_index: int = 0) -> P2PConnector:
        state.open()
        if len(peer_blob) != _BLOB.size:
            raise P2PError(f"rank {peer}: a P2P connect blob of {len(peer_blob)} bytes, expected {_BLOB.size}")
        (peer_pid,) = _BLOB.unpack(peer_blob)
        path = "direct pointer" if peer_pid == os.getpid() else "IPC"
        if is_send:
            me, dev = state.info.rank, state.info.dev
            log_connection(channel, me, dev(me), peer, dev(peer), path)
        return P2PConnector(peer, is_send, path)

    def connected(self, state: P2PState) -> None:
        if state.owner and state.segment is not None:
            state.segment.unlink()  # every peer has opened the pool: nothing of ours stays in /dev/shm

    def free(self, state: P2PState, drain: bool = True) -> None:
        state.close()


def pool_of(states: dict):
    """The P2P pool (uint8 device array) among a communicator's transport states, or None."""
    return next((s.base for t, s in states.items() if t.name == NAME), None)
