"""Bootstrap: unique id, TCP rendezvous at a root, then a ring of sockets (``src/bootstrap.cc``).

* ``get_unique_id`` (``ncclGetUniqueId`` → ``bootstrapGetUniqueId`` / ``bootstrapCreateRoot``): starts the root's
  listener in this process and packs its address and a random magic into a 128-byte id, like ``ncclUniqueId``.
  With ``NCCL_COMM_ID=host:port`` the root address is fixed, rank 0 runs the root there, and the magic is NCCL's
  fixed ``NCCL_MAGIC`` (or ``NCCLLAB_COMM_MAGIC``, which our launcher sets to a random value for its children).
* ``Bootstrap.init`` (``bootstrapInit``): every rank listens, tells the root its address, and the root answers each
  rank with the address of its ring successor (``bootstrapRoot``).  Ranks then connect to ``next`` and accept
  ``prev``.
* ``allgather`` (``bootstrapAllGather``): n-1 ring steps, each forwarding the slice received in the previous step.
* ``barrier`` (``bootstrapBarrier``): an allgather of nothing.
* ``send`` / ``recv`` (``bootstrapSend`` / ``bootstrapRecv``): a tagged message between two ranks, each on its own
  connection to the receiver's listener, which stays open after init (the point-to-point connections' setup).

Every socket here is open to the network, so nothing received is trusted before its handshake, and nothing
received can run code.  Each connection starts with NCCL's handshake (the magic, then ``ncclSocketTypeBootstrap``,
``collectives.misc.listener``); a wrong, malformed or silent connection is dropped and accepting goes on.  Every message is a
fixed ``struct`` layout (``JOIN``, ``REPLY``, ``RING_HELLO``) or a framed payload whose size is checked against
the bound its caller gives before anything is allocated; the typed allgathers (``allgather_struct``,
``allgather_array``) are what the library exchanges.  No reply carries the magic.

Deliberate differences: the root answers each rank on the connection that rank opened (NCCL's root connects back
to each rank's ``listenRootAddress``), and when a rank never joins, the root tells the others which ranks are
missing instead of letting each of them time out alone.
"""
from __future__ import annotations

import collections
import ipaddress
import secrets
import struct
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from collectives.misc import sockets
from collectives.misc.listener import SOCKET_TYPE_BOOTSTRAP, Listener, hello
from collectives.misc.param import env_str, timeout_s
from collectives.misc.sockets import BootstrapError
from tracing import debug
from tracing.debug import ranges

UNIQUE_ID_BYTES = 128
NCCL_MAGIC = 0x0280028002800280  # NCCL's fixed magic with NCCL_COMM_ID (src/include/comm.h)
_MAGIC_HDR = b"NCCLLAB1"

JOIN = struct.Struct("<iiH64s")        # a joining rank: rank, nranks, its ring listener's port and IPv4 address
REPLY = struct.Struct("<BH64s1024s")   # the root's answer: kind, the successor's port and address, an error text
REPLY_NEXT, REPLY_ERROR = 0, 1
RING_HELLO = struct.Struct("<i")       # the rank connecting to its ring successor
P2P_HELLO = struct.Struct("<ii")       # a point-to-point message's sender and tag (bootstrapSend)
P2P_MAX_MESSAGE = 1 << 20              # the most a point-to-point message may announce (connect blobs fit)
P2P_MAX_UNEXPECTED = 8                 # per rank: messages kept before their recv (a peer has at most 4 in flight)
P2P_CHECK_S = 0.05                     # how often a waiting recv asks whether its message can still come
REPLY_GRACE_S = 5.0                    # a rank waits this much longer than the root, so the root's reason arrives


@dataclass(frozen=True)
class UniqueId:
    """``ncclUniqueId``: where the root listens, plus a magic that every connection must present first."""
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
        try:
            host = raw[len(_MAGIC_HDR) + 10:].rstrip(b"\0").decode("ascii")
        except UnicodeDecodeError:
            raise BootstrapError("invalid unique id (its host is not an address)") from None
        return cls(host, port, magic)


def _text(raw: bytes) -> str:
    return raw.rstrip(b"\0").decode("utf-8", "replace")


def _ipv4(raw: bytes) -> str | None:
    """The IPv4 address in a fixed field, or None if the field holds anything else."""
    try:
        return str(ipaddress.IPv4Address(raw.rstrip(b"\0").decode("ascii")))
    except (UnicodeDecodeError, ValueError):
        return None


@dataclass
class _Joined:
    host: str
    port: int
    conn: Any
    addr: str


def _reply(conn, kind: int, host: str = "", port: int = 0, error: str = "") -> None:
    try:
        conn.settimeout(1.0)
        conn.sendall(REPLY.pack(kind, port, host.encode(), error.encode()[:REPLY.size - 67]))
    except OSError:
        pass  # that rank is gone; the others still get their answer


def _fail_all(joined: dict, error: str, *extra) -> BootstrapError:
    # Rank 0 last: it shares this process, and once it has its answer it raises and the process may exit before
    # this thread has answered the others, who would then see only a closed connection.
    conns = [j.conn for r, j in joined.items() if r != 0] + list(extra)
    conns += [joined[0].conn] if 0 in joined else []
    for conn in conns:
        _reply(conn, REPLY_ERROR, error=error)
    return BootstrapError(error)


def _admit(listener: Listener, joined: dict, nranks: int, conn, body: bytes, addr: str) -> None:
    """One join message: a real rank's slot, a stranger's message dropped, or a contradiction that ends the job."""
    rank, n, port, host_raw = JOIN.unpack(body)
    host = _ipv4(host_raw)
    if host is None or port == 0 or n < 1 or rank < 0:
        conn.close()  # the magic was right but the message is not ours: dropped as a wrong magic would be
        listener.dropped += 1
        debug.info("NET|INIT", f"bootstrap root: connection from {addr} sent a malformed join, discarding peer "
                               f"connection")
        return
    if n != nranks or rank >= nranks:
        raise _fail_all(joined, f"bootstrap root: the process at {addr} joined as rank {rank} of {n}, this "
                                f"communicator has {nranks} ranks (a stale unique id, or a launcher that "
                                f"disagrees on the job size)", conn)
    if rank in joined:
        raise _fail_all(joined, f"bootstrap root: two processes joined as rank {rank}: {joined[rank].addr} and "
                                f"{addr}", conn)
    joined[rank] = _Joined(host, port, conn, addr)


def _root_thread(listener: Listener, nranks: int, deadline: float, errors: list) -> None:
    """``bootstrapRoot``: collect every rank's ring address, then send each its successor's.  A stranger is
    dropped by the listener; a real rank that contradicts the others ends the job with a line naming it."""
    joined: dict[int, _Joined] = {}
    try:
        while len(joined) < nranks:
            try:
                conn, body, addr = listener.accept(deadline, f"the ranks of the bootstrap root "
                                                             f"({len(joined)} of {nranks} joined)", first=JOIN.size)
            except BootstrapError:
                break
            _admit(listener, joined, nranks, conn, body, addr)
        if len(joined) < nranks:
            while True:  # joins complete as the deadline passed still count, and get the reason below
                try:
                    _admit(listener, joined, nranks, *listener.accept(time.monotonic(), "late ranks", first=JOIN.size))
                except BootstrapError:
                    break
            missing = [r for r in range(nranks) if r not in joined]
            strangers = f"; {listener.dropped} stranger connection(s) discarded" if listener.dropped else ""
            raise _fail_all(joined, f"bootstrap root: rank(s) {ranges(missing)} never joined within "
                                    f"{timeout_s():g} s (NCCLLAB_TIMEOUT); {len(joined)} of {nranks} did"
                                    f"{strangers}")
        for rank, j in joined.items():
            nxt = joined[(rank + 1) % nranks]
            _reply(j.conn, REPLY_NEXT, nxt.host, nxt.port)
    except Exception as exc:  # reported by rank 0's init
        errors.append(exc)
    finally:
        for j in joined.values():
            j.conn.close()
        listener.close()


_listeners: dict[int, Listener] = {}  # magic -> root listener waiting to learn nranks (opened by get_unique_id)
_roots: dict[int, tuple[threading.Thread, list]] = {}  # magic -> running root thread and its errors


def _open_root(host: str, port: int, magic: int) -> tuple[str, int]:
    named = "NCCL_COMM_ID" if env_str("NCCL_COMM_ID") else "NCCLLAB_COMM_ID, the launcher's" \
        if env_str("NCCLLAB_COMM_ID") else "the unique id's"
    srv = sockets.listen(host, port, f"the bootstrap root ({named} address)" if port else "the bootstrap root")
    listener = _listeners[magic] = Listener(srv, magic, SOCKET_TYPE_BOOTSTRAP, "bootstrap root")
    return listener.address()


def _run_root(magic: int, nranks: int) -> None:
    listener = _listeners.pop(magic)
    errors: list = []
    deadline = time.monotonic() + timeout_s()
    t = threading.Thread(target=_root_thread, args=(listener, nranks, deadline, errors),
                         name="nccllab-bootstrap-root", daemon=True)
    _roots[magic] = (t, errors)
    t.start()


def get_unique_id() -> UniqueId:
    """``ncclGetUniqueId``: open the root listener here (or name ``NCCL_COMM_ID``'s) and return its id."""
    comm_id = env_str("NCCL_COMM_ID")
    if comm_id:
        host, port = sockets.parse_addr(comm_id)
        magic = int(env_str("NCCLLAB_COMM_MAGIC", "0") or 0, 0) or NCCL_MAGIC
        # With NCCL_COMM_ID, rank 0 hosts the root inside Bootstrap.init; the id only names the address.
        return UniqueId(host, port, magic)
    return new_unique_id()


def new_unique_id() -> UniqueId:
    """A root listener of its own, on a free port, with a random magic (``ncclGetUniqueId`` without
    ``NCCL_COMM_ID``)."""
    magic = secrets.randbits(64)  # getRandomData: a stranger cannot guess it
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
        self.listener: Listener | None = None   # open after init for point-to-point messages
        self.peer_addrs: list[tuple[str, int]] = []
        self._unexpected: dict = {}  # (peer, tag) -> the messages that came before their recv, oldest first
        self._init()

    def _deadline(self) -> float:
        return time.monotonic() + timeout_s()

    def _hello(self) -> bytes:
        return hello(self.uid.magic, SOCKET_TYPE_BOOTSTRAP)

    def _init(self) -> None:
        deadline = self._deadline()
        uid = self.uid
        _, my_addr = sockets.find_interface()
        srv = Listener(sockets.listen(my_addr), uid.magic, SOCKET_TYPE_BOOTSTRAP, f"bootstrap ring of rank "
                                                                                   f"{self.rank}")
        ok = False
        try:
            next_host, next_port = self._ring_successor(deadline, srv.address())
            if self.nranks == 1:
                return
            self.next_sock = sockets.connect((next_host, next_port), deadline,
                                             f"bootstrap next of rank {self.rank}", self._hello())
            self.next_sock.sendall(RING_HELLO.pack(self.rank))
            prev = (self.rank - 1) % self.nranks
            self.prev_sock, body, addr = srv.accept(deadline, f"rank {prev} (bootstrap prev of rank {self.rank})",
                                                    first=RING_HELLO.size)
            (claimed,) = RING_HELLO.unpack(body)
            if claimed != prev:
                raise BootstrapError(f"rank {self.rank}: the bootstrap connection from {addr} says it is rank "
                                     f"{claimed}, the ring's predecessor is rank {prev}")
            # the listener stays open for point-to-point messages (bootstrapSend / bootstrapRecv); every rank
            # learns where every other one listens (NCCL's allgather of peerP2pAddresses)
            host, port = srv.address()
            self.peer_addrs = [(_text(h), p) for h, p in self.allgather_struct("<64sH", host.encode(), port)]
            self.listener, ok = srv, True
        finally:
            if not ok:
                srv.close()

    def _ring_successor(self, deadline: float, my_addr: tuple[str, int]) -> tuple[str, int]:
        """Where the ring's next rank listens: from the root (``bootstrapInit``), which rank 0 runs; a split's
        child asks its parent's ring instead (``split.SplitBootstrap``)."""
        uid = self.uid
        if self.rank == 0:
            if uid.magic not in _listeners and uid.magic not in _roots:
                _open_root(uid.host, uid.port, uid.magic)  # NCCL_COMM_ID: rank 0 hosts the root
            if uid.magic in _listeners:
                _run_root(uid.magic, self.nranks)
        return self._join_root(deadline, my_addr)

    def _join_root(self, deadline: float, my_addr: tuple[str, int]) -> tuple[str, int]:
        """Tell the root where this rank listens; its answer is the successor's address, or why not."""
        s = sockets.connect((self.uid.host, self.uid.port), deadline, "bootstrap root", self._hello())
        try:
            s.sendall(JOIN.pack(self.rank, self.nranks, my_addr[1], my_addr[0].encode()))
            raw = sockets.recv_exact(s, REPLY.size, deadline + REPLY_GRACE_S, "bootstrap root")
        except BootstrapError as exc:
            self._raise_root_error()
            raise BootstrapError(f"rank {self.rank}: no answer from the bootstrap root at {self.uid.host}:"
                                 f"{self.uid.port} ({exc}); is rank 0 running?") from None
        except OSError as exc:
            raise BootstrapError(f"rank {self.rank}: bootstrap root at {self.uid.host}:{self.uid.port}: "
                                 f"{exc}") from None
        finally:
            s.close()
        kind, port, host_raw, error = REPLY.unpack(raw)
        if kind == REPLY_ERROR:
            raise BootstrapError(f"rank {self.rank}: {_text(error)}")
        host = _ipv4(host_raw)
        if kind != REPLY_NEXT or host is None:
            raise BootstrapError(f"rank {self.rank}: malformed answer from the bootstrap root")
        return host, port

    def _raise_root_error(self) -> None:
        entry = _roots.get(self.uid.magic)
        if entry and entry[1]:
            raise entry[1][0]

    # ------------------------------------------------------------------ collectives of the bootstrap ring
    def allgather(self, mine: bytes, max_size: int) -> list[bytes]:
        """``bootstrapAllGather``: every rank's ``mine`` (at most ``max_size`` bytes each, checked on receipt
        before anything is allocated).  Ring step s sends slice (rank - s) and receives slice (rank - s - 1)."""
        if len(mine) > max_size:
            raise ValueError(f"allgather: {len(mine)} bytes exceed this message's bound of {max_size}")
        n, r = self.nranks, self.rank
        out: list[bytes] = [b""] * n
        out[r] = bytes(mine)
        if n == 1:
            return out
        deadline = self._deadline()
        for s in range(n - 1):
            send_ix, recv_ix = (r - s) % n, (r - s - 1) % n
            sender = threading.Thread(target=sockets.send_msg,
                                      args=(self.next_sock, out[send_ix], deadline, f"rank {(r + 1) % n}"))
            sender.start()
            try:
                out[recv_ix] = sockets.recv_msg(self.prev_sock, deadline, f"rank {(r - 1) % n} (bootstrap prev)",
                                                max_size)
            finally:
                sender.join()
        return out

    def allgather_struct(self, fmt: str, *values) -> list[tuple]:
        """Every rank's ``struct.pack(fmt, *values)``, unpacked: one fixed layout, the same on every rank."""
        layout = struct.Struct(fmt)
        got = self.allgather(layout.pack(*values), layout.size)
        for rank, raw in enumerate(got):
            if len(raw) != layout.size:
                raise BootstrapError(f"rank {self.rank}: rank {rank} sent {len(raw)} bytes where {fmt!r} has "
                                     f"{layout.size}")
        return [layout.unpack(raw) for raw in got]

    def allgather_array(self, arr: np.ndarray) -> list[np.ndarray]:
        """Every rank's array; all ranks pass the same dtype and shape (plain data types only)."""
        arr = np.ascontiguousarray(arr)
        if arr.dtype.hasobject:
            raise TypeError("allgather_array: an object array cannot cross the bootstrap")
        got = self.allgather(arr.tobytes(), arr.nbytes)
        for rank, raw in enumerate(got):
            if len(raw) != arr.nbytes:
                raise BootstrapError(f"rank {self.rank}: rank {rank} sent {len(raw)} bytes for an array of "
                                     f"{arr.nbytes} ({arr.dtype}{list(arr.shape)})")
        return [np.frombuffer(raw, arr.dtype).reshape(arr.shape).copy() for raw in got]

    def barrier(self) -> None:
        self.allgather(b"", 0)

    # ------------------------------------------------------------------ point to point
    def send(self, peer: int, tag: int, payload: bytes) -> None:
        """``bootstrapSend``: one framed message to ``peer`` under ``tag``, on a connection of its own to the peer's
        listener (the connect completes in the peer's backlog: it need not be receiving yet)."""
        deadline = self._deadline()
        what = f"rank {peer} (bootstrap send from rank {self.rank})"
        s = sockets.connect(self.peer_addrs[peer], deadline, what, self._hello())
        try:
            s.sendall(P2P_HELLO.pack(self.rank, tag))
            sockets.send_msg(s, payload, deadline, what)
        except OSError as exc:
            raise BootstrapError(f"rank {self.rank}: bootstrap send to rank {peer} failed: {exc}") from None
        finally:
            s.close()

    def recv(self, peer: int, tag: int, max_size: int, why: str = "", check=None) -> bytes:
        """``bootstrapRecv``: ``peer``'s message under ``tag``; one from another (peer, tag) that arrives first is
        kept for its own ``recv`` (NCCL's unexpected-connection queue).  ``why``: what the wait is for, in the
        timeout's message; ``check()``, called every ``P2P_CHECK_S`` while nothing comes, raises if the message
        can no longer come (the peer aborted, exited or destroyed its communicator)."""
        key = (peer, tag)
        deadline = self._deadline()
        while True:
            got = self._take(key, max_size)
            if got is not None:
                return got
            now = time.monotonic()
            if now >= deadline:
                raise BootstrapError(f"rank {self.rank}: no message from rank {peer} within {timeout_s():g} s "
                                     f"(NCCLLAB_TIMEOUT)" + (f": {why}" if why else ""))
            if self._accept_one(min(deadline, now + P2P_CHECK_S) if check else deadline, peer, why):
                continue
            if check is not None:
                try:
                    check()
                except Exception:
                    self._accept_one(time.monotonic() + P2P_CHECK_S, peer, why)  # it may have come just before
                    got = self._take(key, max_size)
                    if got is not None:
                        return got
                    raise

    def _take(self, key: tuple, max_size: int) -> bytes | None:
        if not self._unexpected.get(key):
            return None
        payload = self._unexpected[key].popleft()
        if len(payload) > max_size:
            raise BootstrapError(f"rank {self.rank}: rank {key[0]} sent {len(payload)} bytes, at most {max_size} "
                                 f"expected")
        return payload

    def _accept_one(self, until: float, peer: int, why: str) -> bool:
        """Take the next point-to-point message that arrives before ``until`` into the queue; False if none."""
        try:
            s, body, addr = self.listener.accept(until, f"rank {peer}" + (f" ({why})" if why else ""),
                                                 first=P2P_HELLO.size)
        except BootstrapError:
            return False
        try:
            sender, got_tag = P2P_HELLO.unpack(body)
            if not 0 <= sender < self.nranks:
                raise BootstrapError(f"rank {self.rank}: a bootstrap message from {addr} claims rank {sender}")
            payload = sockets.recv_msg(s, self._deadline(), f"rank {sender} (bootstrap send)", P2P_MAX_MESSAGE)
        finally:
            s.close()
        if sum(map(len, self._unexpected.values())) >= P2P_MAX_UNEXPECTED * self.nranks:
            raise BootstrapError(f"rank {self.rank}: more than {P2P_MAX_UNEXPECTED * self.nranks} bootstrap "
                                 f"messages arrived before their recv (the last from {addr}, as rank {sender})")
        self._unexpected.setdefault((sender, got_tag), collections.deque()).append(payload)
        return True

    def close(self) -> None:
        if self.listener is not None:
            self.listener.close()
            self.listener = None
        for s in (self.next_sock, self.prev_sock):
            if s is not None:
                s.close()
        self.next_sock = self.prev_sock = None
        entry = _roots.pop(self.uid.magic, None)
        if entry and entry[0] is not None:
            entry[0].join(timeout=1.0)
