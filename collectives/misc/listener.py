"""Accepting connections from a network that may hold strangers (NCCL ``src/misc/socket.cc``: ``ncclSocketAccept``
with its states, ``socketFinalizeAccept``, ``socketFinalizeConnect``).

Every connection of the lab starts as NCCL's does: the connecting side sends the 8-byte magic of the listener it
means, then the 4-byte socket type (``enum ncclSocketType``), and only then anything else.  A ``Listener`` keeps
every connection that has not finished that handshake in a state of its own (bytes received so far, when it
arrived), all non-blocking, so one slow or silent stranger never holds up the peers behind it.  A connection is
dropped with an INFO line, and accepting goes on (NCCL's ``ncclSocketResetAccept``), when

* its first 8 bytes are not the magic (garbage, a pickle, another job's id),
* its type is not the listener's (a peer that reached the wrong socket),
* it closes, or sends nothing complete, within ``NCCLLAB_HANDSHAKE_TIMEOUT`` seconds (default 1),
* more than ``MAX_PENDING`` are waiting (the oldest goes first).

A listener can also read each connection's first message, of a fixed size, before handing it out (the bootstrap
root's join message): so a stranger who knows the magic still cannot stall the listener by sending half of it.
Nothing a connection sends is ever echoed back, least of all the magic.
"""
from __future__ import annotations

import selectors
import socket
import struct
import time

from tracing import debug

from .param import handshake_timeout_s
from .sockets import BootstrapError, set_flags

# enum ncclSocketType (src/include/socket.h)
SOCKET_TYPE_BOOTSTRAP, SOCKET_TYPE_PROXY, SOCKET_TYPE_NET_SOCKET, SOCKET_TYPE_NET_IB = 1, 2, 3, 4
SOCKET_TYPE_VERBS_WIRE = 101  # ours: the software verbs provider's wire between HCAs (no NCCL counterpart)
HANDSHAKE = struct.Struct("<QI")  # the magic (uint64), then the socket type (NCCL sends the enum as an int)
MAX_PENDING = 64                  # connections mid-handshake at once; beyond that the oldest is dropped


def hello(magic: int, kind: int) -> bytes:
    """``socketFinalizeConnect``: the bytes a connecting side sends first."""
    return HANDSHAKE.pack(magic & 0xFFFFFFFFFFFFFFFF, kind)


class _Pending:
    __slots__ = ("sock", "addr", "buf", "since")

    def __init__(self, sock: socket.socket, addr: str):
        self.sock, self.addr, self.buf, self.since = sock, addr, bytearray(), time.monotonic()


def addr_text(addr) -> str:
    return f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) and len(addr) >= 2 else str(addr)


class Listener:
    """A listening socket and the connections still in their handshake (``struct ncclSocket`` in its
    ``Accepting`` / ``Accepted`` states).  ``accept`` returns the next connection that completed it."""

    def __init__(self, srv: socket.socket, magic: int, kind: int, what: str):
        self.srv, self.magic, self.kind, self.what = srv, magic & 0xFFFFFFFFFFFFFFFF, kind, what
        srv.setblocking(False)
        self.pending: list[_Pending] = []
        self.dropped = 0  # strangers discarded so far (tests and the fault table read it)

    def address(self) -> tuple[str, int]:
        host, port = self.srv.getsockname()[:2]
        return host, port

    def _drop(self, p: _Pending, why: str) -> None:
        debug.info("NET|INIT", f"{self.what}: connection from {p.addr} {why}, discarding peer connection")
        self.dropped += 1
        self.pending.remove(p)
        try:
            p.sock.close()
        except OSError:
            pass

    def _take_new(self) -> None:
        while True:
            try:
                sock, addr = self.srv.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                raise BootstrapError(f"{self.what}: accept failed: {exc}") from None
            sock.setblocking(False)
            if len(self.pending) >= MAX_PENDING:
                self._drop(self.pending[0], f"was still mid-handshake with {MAX_PENDING} others waiting")
            self.pending.append(_Pending(sock, addr_text(addr)))

    def _progress(self, p: _Pending, want: int) -> bool:
        """Read what ``p`` has sent; True once its handshake and first message are complete and valid."""
        while len(p.buf) < want:
            try:
                chunk = p.sock.recv(want - len(p.buf))
            except (BlockingIOError, InterruptedError):
                return False
            except OSError as exc:
                self._drop(p, f"failed before its handshake ({exc.strerror or exc})")
                return False
            if not chunk:
                self._drop(p, "closed before its handshake completed")
                return False
            p.buf += chunk
            if len(p.buf) >= HANDSHAKE.size:
                magic, kind = HANDSHAKE.unpack_from(p.buf)
                if magic != self.magic:
                    self._drop(p, "sent a wrong magic")  # never say which magic was expected
                    return False
                if kind != self.kind:
                    self._drop(p, f"has socket type {kind}, this socket is type {self.kind} (wrong NCCL socket)")
                    return False
        return True

    def accept(self, deadline: float, what: str, first: int = 0) -> tuple[socket.socket, bytes, str]:
        """The next connection that sent the right magic and type, then ``first`` more bytes: (socket in
        blocking mode, those bytes, its address).  Raises ``BootstrapError`` naming ``what`` at ``deadline``."""
        want = HANDSHAKE.size + first
        limit = handshake_timeout_s()
        with selectors.DefaultSelector() as sel:
            while True:
                self._take_new()
                now = time.monotonic()
                for p in list(self.pending):
                    if now - p.since > limit:
                        self._drop(p, f"sent {len(p.buf)} of {want} handshake bytes in {limit:g} s")
                    elif self._progress(p, want):
                        self.pending.remove(p)
                        p.sock.setblocking(True)
                        set_flags(p.sock)
                        return p.sock, bytes(p.buf[HANDSHAKE.size:]), p.addr
                if now >= deadline:
                    raise BootstrapError(f"timed out waiting for {what} to connect"
                                         + (f" ({self.dropped} stranger connection(s) discarded)"
                                            if self.dropped else ""))
                wake = min([deadline] + [p.since + limit for p in self.pending])
                keys = [self.srv] + [p.sock for p in self.pending]
                for s in keys:
                    sel.register(s, selectors.EVENT_READ)
                try:
                    sel.select(max(0.0, min(wake - now, 0.5)))
                finally:
                    for s in keys:
                        sel.unregister(s)

    def close(self) -> None:
        for p in list(self.pending):
            self._drop(p, "was still mid-handshake when the listener closed")
        self.srv.close()
