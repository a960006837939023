"""TCP helpers and interface choice (``src/misc/socket.cc``: ``ncclFindInterfaces``, ``ncclSocketConnect``).

Framing is an 8-byte little-endian length then the payload.  Every blocking call has a deadline.
Interface choice is NCCL's: ``NCCL_SOCKET_IFNAME`` if longer than one character; else an ``ib*`` interface,
then, with ``NCCL_COMM_ID``, the one on the root's subnet, then any but ``docker``/``lo``/``virbr``, then those.
The lab's own single-machine runs (launcher, tests, main job) pass ``NCCL_SOCKET_IFNAME=lo`` (on a machine with an
``ib*`` interface, ``NCCL_COMM_ID`` alone no longer picks loopback, as in NCCL).
"""
from __future__ import annotations

import fcntl
import ipaddress
import os
import socket
import struct
import time

from tracing import debug

from .param import env_int, env_str

_SIOCGIFADDR = 0x8915
_SIOCGIFNETMASK = 0x891B


class BootstrapError(RuntimeError):
    """A bootstrap or socket failure: which peer, what operation, and why."""


def _ifreq(sock: socket.socket, request: int, name: str) -> str:
    packed = fcntl.ioctl(sock.fileno(), request, struct.pack("256s", name[:15].encode()))
    return socket.inet_ntoa(packed[20:24])


def interfaces() -> list[tuple[str, str, str]]:
    """(name, IPv4 address, netmask) of every interface that has an IPv4 address."""
    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                found.append((name, _ifreq(s, _SIOCGIFADDR, name), _ifreq(s, _SIOCGIFNETMASK, name)))
            except OSError:
                continue
    return found


def _match_prefix(name: str, spec: str) -> bool:
    """NCCL_SOCKET_IFNAME grammar: comma list of prefixes, ``^`` excludes, ``=`` asks for exact names."""
    exclude = spec.startswith("^")
    spec = spec.lstrip("^")
    exact = spec.startswith("=")
    spec = spec.lstrip("=")
    hit = any((name == p) if exact else name.startswith(p) for p in spec.split(",") if p)
    return hit != exclude


def find_interface(ifs: list[tuple[str, str, str]] | None = None) -> tuple[str, str]:
    """Pick (ifname, address) for bootstrap and sockets, in ``ncclFindInterfaces``' order: ``NCCL_SOCKET_IFNAME``
    when it is longer than one character (a one-character value is ignored, as NCCL ignores it); else ``ib*``,
    then the interface on ``NCCL_COMM_ID``'s subnet, then anything but ``docker``/``lo``/``virbr``, then
    ``docker``, then ``lo``, then ``virbr``.  ``ifs``: (name, address, netmask) rows, default this machine's."""
    ifs = interfaces() if ifs is None else ifs
    spec = os.environ.get("NCCL_SOCKET_IFNAME", "")
    if len(spec) > 1:
        for name, addr, _ in ifs:
            if _match_prefix(name, spec):
                return name, addr
        raise BootstrapError(f"NCCL_SOCKET_IFNAME={spec}: no interface matches (have {[i[0] for i in ifs]})")
    for name, addr, _ in ifs:
        if _match_prefix(name, "ib"):
            return name, addr
    comm_id = os.environ.get("NCCL_COMM_ID", "")
    if len(comm_id) > 1:
        host = comm_id.rsplit(":", 1)[0]
        remote = ipaddress.ip_address(socket.gethostbyname(host))
        for name, addr, mask in ifs:  # ncclFindInterfaceMatchSubnet
            if remote in ipaddress.ip_network(f"{addr}/{mask}", strict=False):
                return name, addr
    for wanted in ("^docker,lo,virbr", "docker", "lo", "virbr"):
        for name, addr, _ in ifs:
            if _match_prefix(name, wanted):
                return name, addr
    raise BootstrapError(f"no usable network interface (have {[i[0] for i in ifs]})")


# net_socket.cc: MAX_THREADS helper threads, MAX_SOCKETS data sockets per connection
SOCKET_MAX_THREADS, SOCKET_MAX_SOCKETS = 16, 64


def socket_threads() -> tuple[int, int]:
    """``ncclNetSocketGetNsockNthread``: (NCCL_SOCKET_NTHREADS, NCCL_NSOCKS_PERTHREAD), 0 threads and 1 socket per
    thread unless set (NCCL's automatic values outside AWS and GCP).  Too many threads are cut to 16, and a product
    above 64 sockets lowers the sockets per thread to 64 / threads, each with NCCL's WARN."""
    nthreads = env_int("NCCL_SOCKET_NTHREADS", -2)
    per_thread = env_int("NCCL_NSOCKS_PERTHREAD", -2)
    if nthreads > SOCKET_MAX_THREADS:
        debug.warn(f"NET/Socket : NCCL_SOCKET_NTHREADS is greater than the maximum allowed, setting to "
                   f"{SOCKET_MAX_THREADS}")
        nthreads = SOCKET_MAX_THREADS
    nthreads = 0 if nthreads == -2 else nthreads
    per_thread = 1 if per_thread == -2 else per_thread
    nthreads, per_thread = max(0, nthreads), max(0, per_thread)
    if nthreads * per_thread > SOCKET_MAX_SOCKETS:
        per_thread = SOCKET_MAX_SOCKETS // nthreads
        debug.warn(f"NET/Socket : the total number of sockets is greater than the maximum allowed, setting "
                   f"NCCL_NSOCKS_PERTHREAD to {per_thread}")
    if nthreads * per_thread > 0:
        debug.info("INIT", f"NET/Socket: Using {nthreads} threads and {per_thread} sockets per thread")
    return nthreads, per_thread


def parse_addr(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise BootstrapError(f"bad address {text!r}, expected host:port")
    return host, int(port)


def listen(addr: str, port: int = 0, what: str = "socket") -> socket.socket:
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        srv.bind((addr, port))
        srv.listen(1024)
    except OSError as exc:
        srv.close()
        raise BootstrapError(f"{what} cannot listen on {addr}:{port}: {exc.strerror}") from None
    return srv


def set_flags(s: socket.socket) -> None:
    """``ncclOsSocketSetFlags`` (``src/os/linux.cc``): TCP_NODELAY, and the kernel's buffer sizes only when the user
    sets ``NCCL_SOCKET_SNDBUF`` / ``NCCL_SOCKET_RCVBUF`` (default -1: the kernel autotunes, which measured best here
    against fixed 2 and 4 MiB on loopback; the socket plugin's send comms to a loopback peer take 256 KiB instead,
    ``transports.net_socket.LOOPBACK_SNDBUF``)."""
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for name, opt in (("NCCL_SOCKET_SNDBUF", socket.SO_SNDBUF), ("NCCL_SOCKET_RCVBUF", socket.SO_RCVBUF)):
        size = env_int(name, -1)
        if size > 0:
            s.setsockopt(socket.SOL_SOCKET, opt, size)


def connect(addr: tuple[str, int], deadline: float, what: str, hello: bytes = b"") -> socket.socket:
    """Connect with retries until ``deadline`` (the peer may not be listening yet), then send ``hello`` first:
    the listener's magic and socket type (``misc.listener.hello``, NCCL's ``socketFinalizeConnect``)."""
    delay = 0.001
    while True:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        set_flags(s)
        s.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            s.connect(addr)
            if hello:
                s.sendall(hello)
            return s
        except OSError as exc:
            s.close()
            if time.monotonic() + delay >= deadline:
                raise BootstrapError(f"could not connect to {what} at {addr[0]}:{addr[1]}: {exc}") from exc
            time.sleep(delay)
            delay = min(delay * 2, 0.1)


def send_msg(s: socket.socket, payload: bytes, deadline: float, what: str) -> None:
    s.settimeout(max(0.01, deadline - time.monotonic()))
    try:
        s.sendall(struct.pack("<Q", len(payload)) + payload)
    except OSError as exc:
        raise BootstrapError(f"send to {what} failed: {exc}") from exc


def _recv_exact(s: socket.socket, n: int, deadline: float, what: str) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        s.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            chunk = s.recv(n - len(buf))
        except OSError as exc:
            raise BootstrapError(f"receive from {what} failed: {exc}") from exc
        if not chunk:
            raise BootstrapError(f"connection to {what} closed (peer process gone?)")
        buf += chunk
    return bytes(buf)


def recv_exact(s: socket.socket, n: int, deadline: float, what: str) -> bytes:
    """Exactly ``n`` bytes (a fixed-size message), or ``BootstrapError`` naming ``what``."""
    return _recv_exact(s, n, deadline, what)


def recv_msg(s: socket.socket, deadline: float, what: str, max_size: int) -> bytes:
    """One framed message of at most ``max_size`` bytes: the announced size is checked before anything is
    allocated (a stranger's 8 bytes of garbage must not make us reserve gigabytes)."""
    (size,) = struct.unpack("<Q", _recv_exact(s, 8, deadline, what))
    if size > max_size:
        raise BootstrapError(f"message from {what} announces {size} bytes, this message carries at most "
                             f"{max_size}: not a peer of this communicator")
    return _recv_exact(s, size, deadline, what)


def host_hash() -> int:
    """``getHostHash``: a hash of the host's identity, or of ``NCCL_HOSTID`` when set."""
    ident = env_str("NCCL_HOSTID") or (socket.gethostname() + _boot_id())
    h = 5381
    for ch in ident.encode():
        h = ((h << 5) + h + ch) & 0xFFFFFFFFFFFFFFFF  # djb2, as NCCL's getHash
    return h


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def pid_state(pid: int) -> str:
    """The process state letter from ``/proc`` (``R``, ``S``, ``T`` stopped, ``t`` traced, ``Z`` ...), or ``""``."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def pid_alive(pid: int) -> bool:
    """True unless the process is gone or a zombie (a SIGKILLed child not yet reaped still has a pid)."""
    state = pid_state(pid)
    if state:
        return state not in ("Z", "X")
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
