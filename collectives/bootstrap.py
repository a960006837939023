"""Bootstrap: unique id, TCP rendezvous at a root, then a ring of sockets (``src/bootstrap.cc``).

* ``get_unique_id`` (``bootstrapGetUniqueId`` / ``bootstrapCreateRoot``): starts the root thread on this process
  and packs its address and a random magic into a 128-byte id, like ``ncclUniqueId``.  With ``NCCL_COMM_ID=host:port``
  the root address is fixed and rank 0 runs the root.
* ``Bootstrap.init`` (``bootstrapInit``): every rank listens, tells the root its address, and the root answers each
  rank with the address of its ring successor (``bootstrapRoot``).  Ranks then connect to ``next`` and accept ``prev``.
* ``allgather`` (``bootstrapAllGather``): n-1 ring steps, each forwarding the slice received in the previous step.
* ``barrier`` (``bootstrapBarrier``): an allgather of nothing.
"""
from __future__ import annotations

import pickle
import secrets
import struct
import threading
import time
from dataclasses import dataclass
from typing import Any

from misc import sockets
from misc.param import env_str, timeout_s
from misc.sockets import BootstrapError

UNIQUE_ID_BYTES = 128
_MAGIC_HDR = b"NCCLLAB1"


@dataclass(frozen=True)
class UniqueId:
    """``ncclUniqueId``: where the root listens, plus a magic that both sides check."""
    host: str
    port: int
    magic: int

    def to_bytes(self) -> bytes:
        body = _MAGIC_HDR + struct.pack("<QH", self.magic, self.port) + self.host.encode()
        return body.ljust(UNIQUE_ID_BYTES, b"\0")

    @classmethod
    def from_bytes(cls, raw: bytes) -> "UniqueId":
        if len(raw) != UNIQUE_ID_BYTES or not raw.startswith(_MAGIC_HDR):
            raise BootstrapError("invalid unique id (not produced by collectives.get_unique_id)")
        magic, port = struct.unpack_from("<QH", raw, len(_MAGIC_HDR))
        host = raw[len(_MAGIC_HDR) + 10:].rstrip(b"\0").decode()
        return cls(host, port, magic)


def _root_thread(srv, nranks: int, magic: int, deadline: float, errors: list) -> None:
    """``bootstrapRoot``: collect every rank's listen address, then send each its successor's address."""
    try:
        peers: dict[int, tuple[str, int]] = {}
        conns = {}
        while len(peers) < nranks:
            c = sockets.accept(srv, deadline, f"rank (root has {len(peers)} of {nranks})")
            m, rank, n, host, port = pickle.loads(sockets.recv_msg(c, deadline, "a joining rank"))
            if m != magic or n != nranks:
                sockets.send_msg(c, pickle.dumps(("error", f"root expected nranks={nranks} magic={magic:x}, rank "
                                                  f"{rank} sent nranks={n} magic={m:x}")), deadline, f"rank {rank}")
                raise BootstrapError(f"rank {rank} joined with nranks={n} (root has {nranks}) or a stale unique id")
            if rank in peers:
                raise BootstrapError(f"two processes joined as rank {rank}")
            peers[rank] = (host, port)
            conns[rank] = c
        for rank, c in conns.items():
            sockets.send_msg(c, pickle.dumps(("next", peers[(rank + 1) % nranks])), deadline, f"rank {rank}")
            c.close()
    except Exception as exc:  # reported by rank 0's init
        errors.append(exc)
    finally:
        srv.close()


_listeners: dict[int, Any] = {}  # magic -> root socket waiting to learn nranks (opened by get_unique_id)
_roots: dict[int, tuple[threading.Thread, list]] = {}  # magic -> running root thread and its errors


def _open_root(host: str, port: int, magic: int) -> tuple[str, int]:
    srv = sockets.listen(host, port, "the bootstrap root (NCCL_COMM_ID)" if port else "the bootstrap root")
    _listeners[magic] = srv
    return srv.getsockname()[0], srv.getsockname()[1]


def _run_root(magic: int, nranks: int) -> None:
    srv = _listeners.pop(magic)
    errors: list = []
    deadline = time.monotonic() + timeout_s()
    t = threading.Thread(target=_root_thread, args=(srv, nranks, magic, deadline, errors),
                         name="nccllab-bootstrap-root", daemon=True)
    _roots[magic] = (t, errors)
    t.start()


def get_unique_id() -> UniqueId:
    """``ncclGetUniqueId``: open the root listener here (or at ``NCCL_COMM_ID``) and return its id."""
    magic = secrets.randbits(64)
    comm_id = env_str("NCCL_COMM_ID")
    if comm_id:
        host, port = sockets.parse_addr(comm_id)
        magic = int(env_str("NCCLLAB_COMM_MAGIC", "0") or 0, 0)
        # With NCCL_COMM_ID, rank 0 hosts the root inside Bootstrap.init; the id only names the address.
        return UniqueId(host, port, magic)
    _, addr = sockets.find_interface()
    host, port = _open_root(addr, 0, magic)
    return UniqueId(host, port, magic)


class Bootstrap:
    """The bootstrap ring of one communicator: ``allgather`` and ``barrier`` for small control messages."""

    def __init__(self, uid: UniqueId, rank: int, nranks: int):
        if not 0 <= rank < nranks:
            raise ValueError(f"rank {rank} out of range for nranks {nranks}")
        self.uid, self.rank, self.nranks = uid, rank, nranks
        self.next_sock = self.prev_sock = None
        self._init()

    def _deadline(self) -> float:
        return time.monotonic() + timeout_s()

    def _init(self) -> None:
        deadline = self._deadline()
        uid = self.uid
        if self.rank == 0:
            if uid.magic not in _listeners and uid.magic not in _roots:
                _open_root(uid.host, uid.port, uid.magic)  # NCCL_COMM_ID: rank 0 hosts the root
            if uid.magic in _listeners:
                _run_root(uid.magic, self.nranks)
        if self.nranks == 1:
            self._join_root(deadline)
            return
        _, my_addr = sockets.find_interface()
        srv = sockets.listen(my_addr)
        try:
            next_addr = self._join_root(deadline, srv.getsockname())
            self.next_sock = sockets.connect(tuple(next_addr), deadline, f"bootstrap next of rank {self.rank}")
            sockets.send_msg(self.next_sock, struct.pack("<QI", uid.magic, self.rank), deadline, "next rank")
            self.prev_sock = sockets.accept(srv, deadline, f"bootstrap prev of rank {self.rank}")
            magic, prev = struct.unpack("<QI", sockets.recv_msg(self.prev_sock, deadline, "prev rank"))
            if magic != uid.magic or prev != (self.rank - 1) % self.nranks:
                raise BootstrapError(f"rank {self.rank}: unexpected bootstrap peer {prev} (magic {magic:x})")
        finally:
            srv.close()

    def _join_root(self, deadline: float, my_addr=("", 0)):
        s = sockets.connect((self.uid.host, self.uid.port), deadline, "bootstrap root")
        try:
            info = (self.uid.magic, self.rank, self.nranks, my_addr[0], my_addr[1])
            sockets.send_msg(s, pickle.dumps(info), deadline, "bootstrap root")
            kind, value = pickle.loads(sockets.recv_msg(s, deadline, "bootstrap root"))
        except BootstrapError:
            self._raise_root_error()
            raise
        finally:
            s.close()
        if kind == "error":
            raise BootstrapError(value)
        return value

    def _raise_root_error(self) -> None:
        entry = _roots.get(self.uid.magic)
        if entry and entry[1]:
            raise entry[1][0]

    def allgather(self, mine: bytes) -> list[bytes]:
        """Ring allgather: at step s send slice (rank - s), receive slice (rank - s - 1)."""
        n, r = self.nranks, self.rank
        out: list[bytes] = [b""] * n
        out[r] = mine
        deadline = self._deadline()
        for s in range(n - 1):
            send_ix, recv_ix = (r - s) % n, (r - s - 1) % n
            sender = threading.Thread(target=sockets.send_msg,
                                      args=(self.next_sock, out[send_ix], deadline, f"rank {(r + 1) % n}"))
            sender.start()
            try:
                out[recv_ix] = sockets.recv_msg(self.prev_sock, deadline, f"rank {(r - 1) % n} (bootstrap prev)")
            finally:
                sender.join()
        return out

    def allgather_obj(self, obj: Any) -> list[Any]:
        return [pickle.loads(b) for b in self.allgather(pickle.dumps(obj))]

    def barrier(self) -> None:
        self.allgather(b"")

    def close(self) -> None:
        for s in (self.next_sock, self.prev_sock):
            if s is not None:
                s.close()
        self.next_sock = self.prev_sock = None
        entry = _roots.pop(self.uid.magic, None)
        if entry and entry[0] is not None:
            entry[0].join(timeout=1.0)
