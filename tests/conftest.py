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


@pytest.fixture(autouse=True)
def no_shm_leak():
    before = set(leftover_segments())
    yield
    leaked = set(leftover_segments()) - before
    deadline = time.monotonic() + 3.0  # another job's segments live for milliseconds; a leak stays
    while leaked and time.monotonic() < deadline:
        time.sleep(0.1)
        leaked &= set(leftover_segments())
    assert not leaked, f"segments left in /dev/shm: {sorted(leaked)}"


def run_ranks(nranks: int, worker: str, *args: str, env: dict | None = None, timeout: float = 240,
              check: bool = True, nodes: int = 1) -> subprocess.CompletedProcess:
    """Run tests/workers.py WORKER as ``nranks`` real ranks through collectives.launch.spawn (``nodes`` > 1:
    per-rank NCCL_HOSTID, so the nodes talk over the NET transport)."""
    full_env = {**os.environ, "NCCLLAB_TIMEOUT": "30", "NCCL_SOCKET_IFNAME": "lo", **(env or {})}
    code = ("import sys; from collectives.launch import spawn; "
            f"sys.exit(spawn({nranks}, [{str(ROOT / 'tests' / 'workers.py')!r}, *sys.argv[1:]], nodes={nodes}))")
    proc = subprocess.run([sys.executable, "-c", code, worker, *args], env=full_env, capture_output=True,
                          text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{worker} failed (rc {proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}")
    return proc


def wait_request(net, req, limit: float = 10.0) -> int:
    """Test a net plugin request until it completes (its size), or fail after ``limit`` seconds."""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        done, size = net.test(req)
        if done:
            return size
    raise AssertionError("request never completed")
