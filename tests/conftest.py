import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT.parent / "shared" / "fixtures"


def leftover_segments() -> list[str]:
    return [n for n in os.listdir("/dev/shm") if n.startswith("nccllab-")]


def mappers(names) -> dict[str, set[int]]:
    """Each name's processes (other than this one) that map a segment of the communicator it belongs to, from one
    pass over /proc: a segment is ``nccllab-<tag>-...``, and a rank maps every segment of its communicator's tag,
    deleted or not.  Another name in /dev/shm (MPICH's) counts only its own mappings."""
    marks = {n: f"/dev/shm/nccllab-{n.split('-')[1]}-" if n.startswith("nccllab-") and n.count("-") >= 2
             else f"/dev/shm/{n}" for n in names}
    found: dict[str, set[int]] = {n: set() for n in marks}
    if not marks:
        return found
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry.name}/maps") as f:
                maps = f.read()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        for name, mark in marks.items():
            if mark in maps:
                found[name].add(int(entry.name))
    return found


def holders(names) -> set[int]:
    """The processes (other than this one) that map a segment of the communicators these names belong to
    (``mappers``)."""
    return set().union(*mappers(names).values())


def ours(pid: int) -> bool:
    """Whether ``pid`` belongs to this test process: started by it, directly or not (its parent chain in /proc), or
    carrying its pytest-xdist worker name in its environment (a rank whose launcher was killed has lost its parent)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if f"PYTEST_XDIST_WORKER={worker}".encode() in f.read().split(b"\0"):
                    return True
        except OSError:
            pass
    return descends_from_here(pid)


def descends_from_here(pid: int) -> bool:
    """Whether ``pid`` is a process this one started, directly or not (its parent chain in /proc)."""
    me = os.getpid()
    while pid > 1:
        if pid == me:
            return True
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])  # the field after the command's ")": ppid
        except (OSError, ValueError, IndexError):
            return False
    return False


def others(names: set) -> set:
    """Under pytest-xdist (tests in several processes at once): the names in /dev/shm that only another worker's
    processes map, which are not this test's to wait for or to blame."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return set()
    return {name for name, pids in mappers(names).items() if pids and not any(ours(p) for p in pids)}


def wait_for_release(leaked: set, deadline_s: float = 60.0, unmapped_grace_s: float = 3.0) -> set:
    """What is left of ``leaked`` once the ranks that map those segments have exited.  A rank unlinks its
    segments on its way out, and on a loaded machine that can take many seconds after its launcher returned
    (a fixed grace of 3 s once failed ``./lab test`` with /dev/shm empty a moment later): so wait, up to
    ``deadline_s``, while any process still maps one.  A segment nobody maps gets ``unmapped_grace_s`` (it may be
    between its creation and its mapping, in another job); after that it is a leak."""
    deadline = time.monotonic() + deadline_s
    unmapped_since = None
    while leaked:
        leaked = leaked & set(leftover_segments())
        leaked -= others(leaked)
        now = time.monotonic()
        if not leaked or now > deadline:
            break
        if holders(leaked):
            unmapped_since = None
        elif unmapped_since is None:
            unmapped_since = now
        elif now - unmapped_since > unmapped_grace_s:
            break
        time.sleep(0.1)
    return leaked


@pytest.fixture(autouse=True)
def no_shm_leak():
    before = set(leftover_segments())
    yield
    leaked = wait_for_release(set(leftover_segments()) - before)
    held = holders(leaked)
    assert not leaked, f"segments left in /dev/shm: {sorted(leaked)}" + (f" (still mapped by pids {sorted(held)})"
                                                                          if held else "")


def spawn_code(nranks: int, argv: str, nodes: int = 1) -> str:
    """A test launcher's ``python -c`` program: ``collectives.job.spawn`` of ``argv`` (a Python expression) as
    ``nranks`` ranks, forked from the launcher once it has preloaded the lab and the runner modules the workers use
    (``collectives.preload``; ``NCCLLAB_FORK_RANKS=0`` executes each rank instead)."""
    return ("import sys; from collectives.job import spawn; from collectives.preload import preload; "
            f"sys.exit(spawn({nranks}, {argv}, nodes={nodes}, "
            "preload=lambda: preload('collectives.perf.runner', 'collectives.perf.reference')))")


def run_ranks(nranks: int, worker: str, *args: str, env: dict | None = None, timeout: float = 240,
              check: bool = True, nodes: int = 1, script: str = "workers.py") -> subprocess.CompletedProcess:
    """Run tests/SCRIPT WORKER (default tests/workers.py) as ``nranks`` real ranks through
    collectives.job.spawn (``nodes`` > 1: per-rank NCCL_HOSTID, so the nodes talk over the NET transport)."""
    full_env = {**os.environ, "NCCLLAB_TIMEOUT": "30", "NCCL_SOCKET_IFNAME": "lo", **(env or {})}
    code = spawn_code(nranks, f"[{str(ROOT / 'tests' / script)!r}, *sys.argv[1:]]", nodes)
    proc = subprocess.run([sys.executable, "-c", code, worker, *args], env=full_env, capture_output=True,
                          text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{worker} failed (rc {proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}")
    return proc


def wait_requests(net, reqs: list, limit: float = 10.0) -> list[int]:
    """Test net plugin requests in turn, as the proxies do, until all complete (their sizes), or fail after
    ``limit`` seconds: a send larger than the sockets' buffers completes only as its receive is read."""
    end, done = time.monotonic() + limit, {}
    while len(done) < len(reqs) and time.monotonic() < end:
        for i, q in enumerate(reqs):
            if i not in done:
                ok, size = net.test(q)
                if ok:
                    done[i] = size
    assert len(done) == len(reqs), f"requests never completed: {sorted(set(range(len(reqs))) - set(done))}"
    return [done[i] for i in range(len(reqs))]


def wait_pair(net, s, r, limit: float = 10.0) -> tuple[int, int]:
    """A send and its receive (``wait_requests``): their sizes."""
    sent, received = wait_requests(net, [s, r], limit)
    return sent, received


def wait_request(net, req, limit: float = 10.0) -> int:
    """One net plugin request (``wait_requests``): its size."""
    return wait_requests(net, [req], limit)[0]
