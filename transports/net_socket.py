"""The socket net plugin (NCCL ``src/transport/net_socket.cc``).

Each request sends a 4-byte size header on the control socket; a payload of at most ``NCCL_SOCKET_INLINE``
(128 B) follows it inline.  A larger payload goes on the control socket when there are no helper threads (NCCL's
default outside AWS and GCP), or is cut into tasks of ``max(NCCL_SOCKET_MIN_TASKSIZE, size / nSocks)`` bytes that
``NCCL_SOCKET_NTHREADS`` helper threads send round-robin over ``NCCL_NSOCKS_PERTHREAD`` data sockets each.
Requests on one comm complete in order.  The receiver rejects a size larger than it posted ("message
truncated") and a header beyond ``NCCL_MAX_NET_SIZE``.  All I/O is non-blocking: ``test`` moves bytes and returns.
Interface and address: ``NCCL_SOCKET_IFNAME`` (see ``misc.sockets``).
"""
from __future__ import annotations

import queue
import socket
import struct
import threading
import time
from collections import deque

from misc import sockets
from misc.param import env_int, timeout_s

from .net_plugin import NetError, NetPlugin, NetProperties

MAX_NET_SIZE = 1 << 30            # NCCL_MAX_NET_SIZE


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
        for t in range(nthreads if data else 0):
            q: queue.Queue = queue.Queue()
            w = threading.Thread(target=_helper, args=(q,), name=f"nccllab-socket-helper{t}", daemon=True)
            w.start()
            self.queues.append(q)
            self.workers.append(w)

    def close(self) -> None:
        for q in self.queues:
            q.put(None)
        for s in [self.ctrl, *self.data]:
            try:
                s.close()
            except OSError:
                pass


def _helper(q: "queue.Queue") -> None:
    """A helper thread: blocking sends/receives of tasks on data sockets (the GIL is released while in I/O)."""
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
        srv = sockets.listen(self.addr)
        host, port = srv.getsockname()
        return struct.pack("<H", port) + host.encode(), srv

    def connect(self, dev: int, handle: bytes, deadline: float) -> _Comm:
        (port,) = struct.unpack_from("<H", handle)
        host = handle[2:].decode()
        ctrl = sockets.connect((host, port), deadline, "net peer")
        ctrl.sendall(struct.pack("<I", self.nsocks))
        data = []
        for _ in range(self.nsocks):
            data.append(sockets.connect((host, port), deadline, "net peer (data socket)"))
        return _Comm(ctrl, data, f"{host}:{port}", self.nthreads)

    def accept(self, listen_comm, deadline: float) -> _Comm:
        ctrl = sockets.accept(listen_comm, deadline, "net peer")
        ctrl.settimeout(max(0.01, deadline - time.monotonic()))
        (nsocks,) = struct.unpack("<I", _read_exact(ctrl, 4))
        if nsocks != self.nsocks:
            raise NetError(f"peer uses {nsocks} data sockets, this rank {self.nsocks}: NCCL_SOCKET_NTHREADS / "
                           f"NCCL_NSOCKS_PERTHREAD must match")
        data = [sockets.accept(listen_comm, deadline, "net peer (data socket)") for _ in range(nsocks)]
        return _Comm(ctrl, data, str(ctrl.getpeername()), self.nthreads)

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
        while comm.requests:  # progress requests of this comm in order, as far as the socket allows
            head = comm.requests[0]
            if not self._progress(head):
                break
            comm.requests.popleft()
        if req.error:
            raise NetError(req.error)
        return req.done, req.size

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

    def close_listen(self, listen_comm) -> None:
        listen_comm.close()


def _read_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise NetError("connection closed during setup")
        buf += chunk
    return buf
