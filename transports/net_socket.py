"""The socket net plugin (NCCL ``src/transport/net_socket.cc``).

Each request sends a 4-byte size header on the control socket; a payload of at most ``NCCL_SOCKET_INLINE``
(128 B) follows it inline.  A larger payload goes on the control socket when there are no helper threads (NCCL's
default outside AWS and GCP), or is cut into tasks of ``max(NCCL_SOCKET_MIN_TASKSIZE, size / nSocks)`` bytes that
``NCCL_SOCKET_NTHREADS`` helper threads send round-robin over ``NCCL_NSOCKS_PERTHREAD`` data sockets each.
Requests on one comm complete in order.  The receiver rejects a size larger than it posted ("message
truncated") and a header beyond ``NCCL_MAX_NET_SIZE``.  All I/O is non-blocking: ``test`` moves bytes and returns.
Interface and address: ``NCCL_SOCKET_IFNAME`` (see ``collectives.misc.sockets``).

Setup is ``ncclNetSocketListen`` / ``Connect`` / ``Accept``: the listen handle carries the address, a magic, and
the listener's socket and thread counts, which the connecting side adopts.  The sender opens the data sockets,
then the control socket, each starting with the handshake (magic, ``ncclSocketTypeNetSocket``) and its index as one
byte; the listener (``collectives.misc.listener``) drops any connection whose handshake or index is wrong, or that stays
silent, and goes on accepting.  Deliberate difference: the magic is random per listener (NCCL's is the fixed
``NCCL_SOCKET_MAGIC`` unless that variable is set, which we honour), since the handle only travels over the
bootstrap: a stranger on the network cannot present it.  A send comm to a loopback address (emulated nodes) gets
a ``LOOPBACK_SNDBUF`` send buffer unless ``NCCL_SOCKET_SNDBUF`` is set, where NCCL leaves it to the kernel.  And
each helper thread signals a finished task on an eventfd that ``wait_fds`` offers, so that a rank waiting on its
helpers sleeps in ``select``, where NCCL's proxy spins on ``test``.
"""
from __future__ import annotations

import ipaddress
import os
import queue
import secrets
import socket
import struct
import threading
from collections import deque

from collectives.misc import sockets
from collectives.misc.listener import SOCKET_TYPE_NET_SOCKET, Listener, hello
from collectives.misc.param import env_int, env_str, timeout_s

from tracing import debug

from .net_plugin import NetError, NetPlugin, NetProperties

MAX_NET_SIZE = 1 << 30            # NCCL_MAX_NET_SIZE
# ncclNetSocketHandle: port, IPv4 address, magic, data sockets, helper threads
HANDLE = struct.Struct("<H16sQii")
SOCK_INDEX = struct.Struct("<B")  # each connection's first byte after the handshake: its index (nSocks = control)
# Ours: a send comm's send buffer when its peer is a loopback address (emulated nodes) and NCCL_SOCKET_SNDBUF is
# unset; NCCL leaves it to the kernel's autotuning.  On loopback the bytes in flight need little room, and a sender
# that runs megabytes ahead of its reader made the reader's copy cost twice as much (docs/measured.md).
LOOPBACK_SNDBUF = 256 << 10


def socket_magic() -> int:
    """The listener's magic: ``NCCL_SOCKET_MAGIC`` when set (``ncclSocketDefaultMagic``), else random."""
    raw = env_str("NCCL_SOCKET_MAGIC")
    if raw:
        try:
            return int(raw, 0) & 0xFFFFFFFFFFFFFFFF
        except ValueError:
            pass
    return secrets.randbits(64)


class _Request:
    __slots__ = ("comm", "is_send", "buf", "size", "got", "header", "hdr_done", "tasks_left", "done", "error")

    def __init__(self, comm, is_send: bool, buf: memoryview, size: int):
        self.comm, self.is_send, self.buf, self.size = comm, is_send, buf, size
        self.got = 0                 # payload bytes moved on the control socket
        self.header = bytearray()
        self.hdr_done = False
        self.tasks_left = 0
        self.done = False
        self.error: str | None = None


class _Comm:
    def __init__(self, ctrl: socket.socket, data: list, peer: str, nthreads: int):
        self.ctrl, self.data, self.peer = ctrl, data, peer
        ctrl.setblocking(False)
        self.requests: deque = deque()
        self.lock = threading.Lock()  # helper threads count finished tasks
        self.next_sock = 0
        self.workers: list = []
        self.queues: list = []
        # Ours: each helper counts a finished task here too, so that a rank whose oldest request waits on the
        # helpers sleeps in select on this descriptor (``wait_fds``) rather than polling ``test``
        self.done_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC) if nthreads and data else -1
        for t in range(nthreads if data else 0):
            q: queue.SimpleQueue = queue.SimpleQueue()
            w = threading.Thread(target=_helper, args=(q, self.done_fd), name=f"nccllab-socket-helper{t}",
                                 daemon=True)
            w.start()
            self.queues.append(q)
            self.workers.append(w)

    def close(self) -> None:
        """``ncclNetSocketClose``: stop and join the helper threads, then close every socket.  After a clean
        collective the helpers are idle and return at once; one still blocked in a send or receive (a failed
        peer) is woken by shutting its sockets down, so that no thread outlives its comm."""
        for q in self.queues:
            q.put(None)
        for w in self.workers:
            w.join(timeout=0.5)
        if any(w.is_alive() for w in self.workers):
            for s in self.data:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            for w in self.workers:
                w.join(timeout=2.0)
        if self.done_fd >= 0 and not any(w.is_alive() for w in self.workers):  # a live helper may still signal it
            os.close(self.done_fd)
            self.done_fd = -1
        self.workers, self.queues = [], []
        for s in [self.ctrl, *self.data]:
            try:
                s.close()
            except OSError:
                pass
        self.requests.clear()  # their buffers are views of the connection's FIFOs


def _helper(q: "queue.SimpleQueue", done_fd: int) -> None:
    """A helper thread: blocking sends/receives of tasks on data sockets (the GIL is released while in I/O); each
    task's end is counted in ``tasks_left`` and signalled on ``done_fd``."""
    while True:
        task = q.get()
        if task is None:
            return
        sock, view, is_send, req = task
        try:
            sock.settimeout(timeout_s())
            if is_send:
                sock.sendall(view)
            else:
                pos = 0
                while pos < len(view):
                    n = sock.recv_into(view[pos:])
                    if n == 0:
                        raise ConnectionError("data socket closed")
                    pos += n
        except OSError as exc:
            req.error = f"data socket to {req.comm.peer}: {exc}"
        finally:
            with req.comm.lock:
                req.tasks_left -= 1
            os.eventfd_write(done_fd, 1)


def _cap_loopback_sndbuf(socks: list, host: str) -> None:
    """``LOOPBACK_SNDBUF`` on a send comm's sockets when ``host`` is a loopback address, unless the user set
    ``NCCL_SOCKET_SNDBUF`` (``sockets.set_flags`` has applied it)."""
    if env_int("NCCL_SOCKET_SNDBUF", -1) > 0:
        return
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        return
    if loopback:
        for s in socks:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, LOOPBACK_SNDBUF)


class SocketNet(NetPlugin):
    name = "Socket"

    def init(self) -> None:
        self.ifname, self.addr = sockets.find_interface()
        self.nthreads, self.nsocks_per_thread = sockets.socket_threads()  # NCCL's clamps and WARNs
        self.nsocks = self.nthreads * self.nsocks_per_thread
        self.inline = env_int("NCCL_SOCKET_INLINE", 128)
        self.min_task = env_int("NCCL_SOCKET_MIN_TASKSIZE", 64 << 10)

    def devices(self) -> int:
        return 1

    def get_properties(self, dev: int) -> NetProperties:
        return NetProperties(name=self.ifname, speed=10000)

    def listen(self, dev: int):
        """``ncclNetSocketListen``: a listener and the handle that names it (address, magic, counts)."""
        magic = socket_magic()
        srv = Listener(sockets.listen(self.addr), magic, SOCKET_TYPE_NET_SOCKET, "NET/Socket listener")
        host, port = srv.address()
        return HANDLE.pack(port, host.encode(), magic, self.nsocks, self.nthreads), srv

    def connect(self, dev: int, handle: bytes, deadline: float) -> _Comm:
        """``ncclNetSocketConnect``: the data sockets, then the control socket, each with the handshake and its
        index; the listener's counts are the comm's."""
        if len(handle) != HANDLE.size:
            raise NetError(f"NET/Socket: a connect handle of {len(handle)} bytes, expected {HANDLE.size}")
        port, host_raw, magic, nsocks, nthreads = HANDLE.unpack(handle)
        host = host_raw.rstrip(b"\0").decode("ascii", "replace")
        if not 0 <= nsocks <= sockets.SOCKET_MAX_SOCKETS or not 0 <= nthreads <= sockets.SOCKET_MAX_THREADS:
            raise NetError(f"NET/Socket: a connect handle with {nsocks} sockets and {nthreads} threads")
        greeting = hello(magic, SOCKET_TYPE_NET_SOCKET)
        socks = []
        try:
            for i in range(nsocks + 1):
                what = "net peer" + (" (data socket)" if i < nsocks else "")
                s = sockets.connect((host, port), deadline, what, greeting)
                socks.append(s)
                s.sendall(SOCK_INDEX.pack(i))
        except BaseException:
            for s in socks:
                s.close()
            raise
        _cap_loopback_sndbuf(socks, host)
        return _Comm(socks[-1], socks[:-1], f"{host}:{port}", nthreads)

    def accept(self, listen_comm: Listener, deadline: float) -> _Comm:
        """``ncclNetSocketAccept``: take connections until the control socket and every data socket are in; a
        connection with a wrong handshake, an index out of range or one already taken is dropped."""
        nsocks = self.nsocks
        got: dict[int, socket.socket] = {}
        try:
            while len(got) < nsocks + 1:
                s, body, addr = listen_comm.accept(deadline, f"the NET peer's socket {len(got)} of {nsocks + 1}",
                                                   first=SOCK_INDEX.size)
                (i,) = SOCK_INDEX.unpack(body)
                if i > nsocks or i in got:
                    debug.info("NET", f"NET/Socket listener: connection from {addr} claims socket index {i}, "
                                      f"discarding peer connection")
                    listen_comm.dropped += 1
                    s.close()
                    continue
                got[i] = s
        except BaseException:
            for s in got.values():
                s.close()
            raise
        ctrl = got[nsocks]
        return _Comm(ctrl, [got[i] for i in range(nsocks)], str(ctrl.getpeername()), self.nthreads)

    def isend(self, comm: _Comm, buf: memoryview, size: int, tag: int, mhandle):
        if len(comm.requests) >= 32:  # NCCL_NET_MAX_REQUESTS
            return None
        req = _Request(comm, True, buf[:size], size)
        req.header = bytearray(struct.pack("<I", size) + (bytes(buf[:size]) if size <= self.inline else b""))
        comm.requests.append(req)
        return req

    def irecv(self, comm: _Comm, bufs: list, sizes: list, tags: list, mhandles: list):
        if len(comm.requests) >= 32:
            return None
        req = _Request(comm, False, bufs[0], sizes[0])
        comm.requests.append(req)
        return req

    def test(self, req: _Request) -> tuple[bool, int]:
        comm = req.comm
        if comm.done_fd >= 0:  # re-arm the helpers' signal before looking at their counts: no end goes unseen
            try:
                os.eventfd_read(comm.done_fd)
            except BlockingIOError:
                pass
        while comm.requests:  # progress requests of this comm in order, as far as the socket allows
            head = comm.requests[0]
            if not self._progress(head):
                break
            comm.requests.popleft()
        if req.error:
            raise NetError(req.error)
        return req.done, req.size

    def wait_fds(self, req: _Request) -> tuple[list, list]:
        """The control socket, when it is what the comm's oldest request (the one ``test`` moves first) waits on:
        readable for a receive, writable for a send; while helper threads move its payload on the data sockets,
        their signal (``done_fd``), readable when a task ends.  NCCL's proxy spins on ``test`` there; sleeping
        instead leaves the core to the helpers and to the other ranks (docs/measured.md has the measurement)."""
        comm = req.comm
        head = comm.requests[0] if comm.requests else None
        if head is None or head.error:
            return [], []
        if head.tasks_left:
            return [comm.done_fd], []
        return ([], [comm.ctrl]) if head.is_send else ([comm.ctrl], [])

    def _progress(self, req: _Request) -> bool:
        comm = req.comm
        try:
            if req.is_send:
                if not req.hdr_done:
                    n = comm.ctrl.send(req.header)
                    del req.header[:n]
                    if req.header:
                        return False
                    req.hdr_done = True
                    self._start_payload(req, inline=req.size <= self.inline)
            else:
                if not req.hdr_done:
                    want = 4 - len(req.header)
                    chunk = comm.ctrl.recv(want)
                    if not chunk:
                        raise ConnectionError("connection closed by peer")
                    req.header += chunk
                    if len(req.header) < 4:
                        return False
                    (size,) = struct.unpack("<I", req.header)
                    if size > MAX_NET_SIZE:
                        raise NetError(f"corrupt size header from {comm.peer}: {size} B > NCCL_MAX_NET_SIZE")
                    if size > req.size:
                        raise NetError(f"message truncated: {comm.peer} sent {size} B, receive posted {req.size} B")
                    req.size, req.buf = size, req.buf[:size]
                    req.hdr_done = True
                    self._start_payload(req, inline=size <= self.inline)
            if req.got < (req.size if not comm.data or req.size <= self.inline else 0):
                view = req.buf[req.got:]
                n = comm.ctrl.send(view) if req.is_send else comm.ctrl.recv_into(view)
                if n == 0 and not req.is_send:
                    raise ConnectionError("connection closed by peer")
                req.got += n
                if req.got < req.size:
                    return False
            if req.tasks_left:
                return False
        except (BlockingIOError, InterruptedError):
            return False
        except NetError as exc:
            req.error = str(exc)
            return True
        except OSError as exc:
            req.error = f"socket to {comm.peer}: {exc}"
            return True
        req.done = True
        return True

    def _start_payload(self, req: _Request, inline: bool) -> None:
        comm = req.comm
        if inline and req.is_send:
            req.got = req.size  # already in the header bytes
            return
        if not comm.data or req.size <= self.inline:
            return
        task = max(self.min_task, -(-req.size // len(comm.data)))
        offsets = list(range(0, req.size, task))
        req.tasks_left = len(offsets)
        for off in offsets:
            s = comm.next_sock % len(comm.data)
            comm.next_sock += 1
            comm.queues[s % len(comm.queues)].put((comm.data[s], req.buf[off:off + task], req.is_send, req))

    def close_send(self, comm: _Comm) -> None:
        comm.close()

    def close_recv(self, comm: _Comm) -> None:
        comm.close()

    def close_listen(self, listen_comm: Listener) -> None:
        listen_comm.close()
