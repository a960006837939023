"""The floor under any ring AllReduce whose every hop crosses loopback TCP: the ring's bytes alone, measured in
the same processes as ``allreduce_vs_gloo.py``'s two sides.

A ring AllReduce of ``S`` bytes over ``n`` ranks sends ``2(n-1)/n * S`` bytes to the next rank and receives as many
from the previous one (``runRing``: 2(n-1) steps of one chunk; Gloo's ring moves the same).  ``TcpRing.move`` does
exactly that and nothing else: non-blocking ``send`` to the next rank and ``recv_into`` from the previous one,
each call moving as much as the kernel takes (up to 4 MiB), in one thread; no reduction, no protocol, no copy of
ours.  Whatever moves those bytes through the kernel's TCP stack pays at least this, so when Gloo's time
is already close to it, busbw much above Gloo's is out of reach for the lab too.

``TcpRing.allreduce`` adds the arithmetic: the same bytes, chunk by chunk over the same sockets, and numpy's
addition of every received chunk (reduce-scatter, then all-gather), one step after another.  It is no strict
floor (a pipelined ring could overlap a step's addition with the next step's bytes), but where the ranks share
the cores, the additions' CPU adds to the bytes' however they are ordered.

The sockets are this benchmark's own, on 127.0.0.1: each connection starts with a token that rank 0 drew and MPI
broadcast, and the listener drops any connection that does not present it.
"""
from __future__ import annotations

import os
import select
import socket
import time

import numpy as np

PIECE = 4 << 20


class TcpRing:
    """Rank r connected to r + 1 (send) and r - 1 (receive) over loopback TCP; ``world`` is an mpi4py
    communicator."""

    def __init__(self, world):
        self.world = world
        n, r = world.size, world.rank
        token = world.bcast(os.urandom(8) if r == 0 else None)
        srv = socket.socket()
        srv.bind(("127.0.0.1", 0))
        srv.listen(4)
        srv.settimeout(30)
        ports = world.allgather(srv.getsockname()[1])
        self.next = socket.create_connection(("127.0.0.1", ports[(r + 1) % n]), timeout=30)
        self.next.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as every peer's sockets: no Nagle wait
        self.next.sendall(token)
        while True:  # the previous rank's connection: the one that presents the token
            conn, _ = srv.accept()
            conn.settimeout(30)
            got = b""
            try:
                while len(got) < len(token):
                    part = conn.recv(len(token) - len(got))
                    if not part:
                        break
                    got += part
            except OSError:
                got = b""
            if got == token:
                self.prev = conn
                self.prev.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                break
            conn.close()
        srv.close()
        self.next.setblocking(False)
        self.prev.setblocking(False)
        self.buf = self.rbuf = np.zeros(0, np.uint8)

    def move(self, nbytes: int) -> None:
        """Send ``nbytes`` to the next rank while receiving as many from the previous one (``exchange``), from and
        into buffers of this object's own."""
        if self.buf.size < nbytes:
            self.buf = np.ones(nbytes, np.uint8)
            self.rbuf = np.empty(nbytes, np.uint8)
        self.exchange(memoryview(self.buf)[:nbytes], memoryview(self.rbuf)[:nbytes])

    def exchange(self, send_view: memoryview, recv_view: memoryview) -> None:
        """Send ``send_view`` to the next rank while receiving ``recv_view`` from the previous one: one thread,
        both sockets non-blocking, each ``send``/``recv_into`` moving as much as the kernel takes (up to
        ``PIECE``), ``select`` when neither can move."""
        nsend, nbytes = len(send_view), len(recv_view)
        sent = got = 0
        deadline = time.monotonic() + 60
        while sent < nsend or got < nbytes:
            moved = False
            if sent < nsend:
                try:
                    sent += self.next.send(send_view[sent:sent + PIECE])
                    moved = True
                except BlockingIOError:
                    pass
            if got < nbytes:
                try:
                    n = self.prev.recv_into(recv_view[got:got + PIECE])
                except BlockingIOError:
                    n = -1
                if n == 0:
                    raise ConnectionError("tcp_floor: the previous rank closed its connection")
                if n > 0:
                    got += n
                    moved = True
            if not moved:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"tcp_floor: {sent} of {nsend} B sent, {got} of {nbytes} received after 60 s")
                select.select([self.prev] if got < nbytes else [], [self.next] if sent < nsend else [], [], 1.0)

    def allreduce(self, x: np.ndarray, out: np.ndarray) -> None:
        """A ring AllReduce (sum) of ``x`` into ``out`` at its barest, the floor with the arithmetic in: the
        ring's bytes as ``move`` sends them, one chunk a step, and the one addition per received element that any
        AllReduce makes (``np.add`` of the previous rank's chunk into ``out``, n - 1 steps), then n - 1 steps
        passing the summed chunks on, received straight into ``out``.  No FIFO, no flags, no pipelining within a
        step; the sum is in ring order (not NCCL's), so it is checked for closeness only."""
        n, r = self.world.size, self.world.rank
        bounds = [x.size * c // n for c in range(n + 1)]  # n chunks, as even as the count allows
        chunk = lambda c: slice(bounds[c % n], bounds[c % n + 1])  # noqa: E731
        largest = max(b - a for a, b in zip(bounds, bounds[1:])) * x.itemsize
        if self.rbuf.size < largest:
            self.rbuf = np.empty(largest, np.uint8)
        raw = lambda a: memoryview(a.view(np.uint8))  # noqa: E731
        for s in range(n - 1):  # reduce-scatter: chunk r - s goes on (at first this rank's own), r - s - 1 comes in
            send, got = (x if s == 0 else out)[chunk(r - s)], chunk(r - s - 1)
            tmp = self.rbuf[:x[got].nbytes].view(x.dtype)
            self.exchange(raw(send), raw(tmp))
            np.add(x[got], tmp, out=out[got])
        for s in range(n - 1):  # all-gather: the summed chunk r + 1 - s goes on, chunk r - s comes in in place
            self.exchange(raw(out[chunk(r + 1 - s)]), raw(out[chunk(r - s)]))

    def ring_allreduce_bytes(self, size: int) -> int:
        """What a ring AllReduce of ``size`` bytes sends each way per rank: 2(n-1) chunks of size/n."""
        n = self.world.size
        return 2 * (n - 1) * -(-size // n)

    def close(self) -> None:
        self.next.close()
        self.prev.close()
