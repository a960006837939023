"""Strangers on the lab's sockets, for the hostile-input suite (``tests/test_strangers.py``, ``scripts/faults.py``):
real TCP connections that a careless or hostile neighbour would open to a listening port before the real peer.

Kinds: ``garbage`` (4 KiB of random bytes), ``silent`` (connects and sends nothing), ``wrong_magic`` (a well-formed
handshake under another magic, then a join message), ``pickle`` (a framed pickle whose unpickling would create
``marker``: if that file ever exists, some code ran), ``half`` (the first 5 bytes of a handshake, then silence).
"""
from __future__ import annotations

import os
import pickle
import re
import socket
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from collectives.misc.listener import HANDSHAKE

KINDS = ("garbage", "silent", "wrong_magic", "pickle", "half")
ROOT = Path(__file__).resolve().parent.parent
WORKER = str(ROOT / "tests" / "stranger_workers.py")
DROPS: list = []  # (listener, kind, seconds from connect until the listener closed it), filled by watchers


def _watch(s: socket.socket, what: str, kind: str, t0: float) -> None:
    """Block until the listener closes this stranger's connection; record how long that took."""
    try:
        s.settimeout(60)
        while s.recv(4096):
            DROPS.append((what, kind, None))  # a reply reached a stranger: the suite fails on it
            return
    except socket.timeout:
        return
    except OSError:
        pass
    DROPS.append((what, kind, time.monotonic() - t0))


class _Payload:
    """Unpickling this calls ``open(marker, "w")``: a file that appears means a stranger ran code."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def payload(kind: str, marker: str, kind_id: int = 1) -> bytes:
    if kind == "garbage":
        return os.urandom(4096)
    if kind == "wrong_magic":
        return HANDSHAKE.pack(int.from_bytes(os.urandom(8), "little"), kind_id) + os.urandom(78)
    if kind == "pickle":
        body = pickle.dumps(_Payload(marker))
        return struct.pack("<Q", len(body)) + body
    if kind == "half":
        return os.urandom(5)
    return b""


def connect(addr: tuple[str, int], kinds=KINDS, marker: str = "/nonexistent", kind_id: int = 1,
            limit: float = 20.0, what: str = "") -> list[socket.socket]:
    """Open one connection of each kind to ``addr`` (retrying until it listens) and send its bytes; the sockets
    stay open until the caller closes them, as a stranger would keep them.  With ``what``, a thread per stranger
    records in ``DROPS`` when the listener dropped it."""
    socks, end = [], time.monotonic() + limit
    for kind in kinds:
        while True:
            s = socket.socket()
            try:
                s.connect(addr)
                break
            except OSError:
                s.close()
                if time.monotonic() > end:
                    raise
                time.sleep(0.01)
        t0 = time.monotonic()
        data = payload(kind, marker, kind_id)
        if data:
            try:
                s.sendall(data)
            except OSError:
                pass  # already dropped: that is the point
        if what:
            threading.Thread(target=_watch, args=(s.dup(), what, kind, t0), daemon=True).start()
        socks.append(s)
    return socks


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def job_env(**extra) -> dict:
    return {**os.environ, "NCCL_SOCKET_IFNAME": "lo", "NCCLLAB_TIMEOUT": "30", "NCCL_DEBUG": "INFO",
            "NCCL_DEBUG_SUBSYS": "INIT,NET", "PYTHONPATH": str(ROOT / "tests"), **extra}


def start_rank(name: str, port: int, magic: int, n: int, r: int, marker: str, env: dict) -> subprocess.Popen:
    """One rank of ``tests/stranger_workers.py``, given the job's id on its command line."""
    return subprocess.Popen([sys.executable, WORKER, name, "127.0.0.1", str(port), f"{magic:x}", str(n), str(r),
                             marker], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)


def finish(procs: list, timeout: float = 90) -> list[str]:
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=timeout)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
                q.wait()
            raise
    return outs


@dataclass
class Scenario:
    """One job with strangers connected first: its outcome, its time, and each stranger's drop."""
    where: str
    ok: bool
    seconds: float
    outs: list
    drops: list = field(default_factory=list)   # (listener, kind, seconds or None)
    code_ran: bool = False


def _drops_in(out: str) -> list:
    return [(w, k, None if t == "None" else float(t)) for w, k, t in re.findall(r"^STRANGER (.+?) (\w+) (\S+)$", out,
                                                                                  re.M)]


def root_scenario(tmp: Path, nranks: int = 3) -> Scenario:
    """Rank 0 hosts the root at a known port; every kind of stranger connects to it before the other ranks
    start (from this process, as a neighbour on the network would)."""
    port, magic, marker = free_port(), int.from_bytes(os.urandom(8), "little"), tmp / "ran-root"
    env, t0 = job_env(), time.monotonic()
    DROPS.clear()
    procs = [start_rank("allreduce", port, magic, nranks, 0, str(marker), env)]
    held = connect(("127.0.0.1", port), marker=str(marker), what="bootstrap root")
    procs += [start_rank("allreduce", port, magic, nranks, r, str(marker), env) for r in range(1, nranks)]
    outs = finish(procs)
    seconds = time.monotonic() - t0
    time.sleep(0.2)  # let the watchers of strangers dropped at the end record it
    for s in held:
        s.close()
    ok = all(p.returncode == 0 for p in procs) and all(f"OK rank {r}" in outs[r] for r in range(nranks))
    return Scenario("bootstrap root", ok, seconds, outs, list(DROPS), marker.exists())


def net_scenario(tmp: Path, net: str) -> Scenario:
    """2 emulated nodes x 1 rank over NET/``net``: every listener of each rank (root, ring, NET) gets every kind
    of stranger before its real peer."""
    port, magic, marker = free_port(), int.from_bytes(os.urandom(8), "little"), tmp / f"ran-{net}"
    t0 = time.monotonic()
    procs = [start_rank("allreduce_net_strangers", port, magic, 2, r, str(marker),
                        job_env(NCCL_HOSTID=f"stranger-node{r}", NCCL_NET=net)) for r in range(2)]
    outs = finish(procs)
    seconds = time.monotonic() - t0
    ok = all(p.returncode == 0 for p in procs) and all("net=True" in out for out in outs)
    return Scenario(f"NET/{net} job", ok, seconds, outs, [d for out in outs for d in _drops_in(out)],
                    marker.exists())


def listening_ports(pid: int) -> set[int]:
    """The TCP ports that process ``pid`` listens on (from ``/proc``: its socket inodes in LISTEN state)."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        return set()
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    parts = line.split()
                    if parts[3] == "0A" and parts[9] in inodes:
                        ports.add(int(parts[1].rsplit(":", 1)[1], 16))
        except OSError:
            continue
    return ports
