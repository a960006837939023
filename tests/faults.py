"""The fault suite's scenarios and runner, shared by ``tests/test_faults.py`` and ``scripts/faults.py`` (which
prints the table of figures): each fault is injected into a real job, under ``mpirun`` or our own launcher, and
we measure how long the other ranks took to notice, what they said, how every rank exited, and what was left
behind in ``/dev/shm`` and in the process table."""
from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from conftest import spawn_code

ROOT = Path(__file__).resolve().parent.parent
WORKERS = ROOT / "tests" / "job_workers.py"
MPIRUN = shutil.which("mpirun", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
DEADLINE_S = 6.0  # NCCLLAB_TIMEOUT for the fault jobs: a frozen peer is named when it passes

# kind -> (emulated nodes, what a survivor's one-line error must say about the culprit: rank {v}).
# Under mpirun a SIGKILLed rank is reported by mpirun itself, which SIGKILLs the others within milliseconds, before
# any of them can notice; its banner names the first process it reaped, not necessarily the culprit.
HYDRA_KILLED = r"|YOUR APPLICATION TERMINATED WITH THE EXIT STRING: Killed \(signal 9\)"
FAULTS = {
    "sigkill_shm": (1, r"rank {v} \(pid \d+\) is gone" + HYDRA_KILLED),
    "sigkill_net": (2, r"rank {v} \(pid \d+\) is gone|NET connection with rank {v}" + HYDRA_KILLED),
    "sigstop": (1, r"rank {v} \(pid \d+\) is stopped"),
    "close_socket": (2, r"NET connection with rank {v}|rank {v}: NET connection"),
    "corrupt_header": (2, r"NET connection with rank {v} .*corrupt size header"),
    "mismatch": (1, r"collective mismatch with rank {v}|rank {v}: collective mismatch"),
    "skip_destroy": (1, r"rank {v} destroyed its communicator"),
    "shm_full": (1, r"ShmError: rank \d+: failed to extend /dev/shm/nccllab-\S+ .*No space left on device"),
    "port_taken": (1, r"BootstrapError: .*(in use|cannot listen)"),
}


@dataclass
class FaultResult:
    kind: str
    launcher: str
    returncode: int
    elapsed_s: float           # from start to the end of the whole job
    detect_s: float | None     # from the injection to the first rank that noticed it
    ended_s: float             # from the injection (or the start, for faults at init) to the end of the whole job
    message: str               # the culprit-naming line
    exit_codes: list = field(default_factory=list)
    left_shm: list = field(default_factory=list)
    left_procs: list = field(default_factory=list)
    output: str = ""


def _left_in_shm(prefixes: set[str]) -> list[str]:
    """What is still in /dev/shm of this job (the workers print their MPI files and communicator prefix)."""
    return sorted(n for n in os.listdir("/dev/shm") if prefixes and n.startswith(tuple(prefixes)))


def _procs_with(token: str) -> list[str]:
    out = subprocess.run(["pgrep", "-af", token], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "pgrep" not in line]


def _taken_port() -> tuple[socket.socket, int]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    return s, s.getsockname()[1]


def _env_ranks(nranks: int, args: list, env: dict, t0: float, timeout: float) -> tuple[str, list[int]]:
    """torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR/PORT) with no launcher watching: every rank must
    end by itself.  Returns the output and each rank's exit code."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen(args, env={**env, "RANK": str(r), "WORLD_SIZE": str(nranks), "MASTER_ADDR": "127.0.0.1",
                                         "MASTER_PORT": str(port)}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, cwd=ROOT) for r in range(nranks)]
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=max(1.0, timeout - (time.monotonic() - t0)))[0])
        except subprocess.TimeoutExpired:
            p.kill()
            outs.append(p.communicate()[0] + "\n(still running at the test's timeout: killed)")
    return "\n".join(outs), [p.returncode for p in procs]


def _command(kind: str, launcher: str, nranks: int, args: list) -> list[str]:
    nodes = FAULTS[kind][0]
    if launcher == "mpirun":
        cmd = [MPIRUN, "-n", str(nranks), *args]
    else:
        code = spawn_code(nranks, "sys.argv[1:]", nodes)
        cmd = [sys.executable, "-c", code, *args[1:]]
    if kind == "shm_full":  # a private, nearly full /dev/shm: room for MPI and the status pages, not the FIFOs
        cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
               'mount -t tmpfs -o size=5M tmpfs /dev/shm && exec "$@"', "sh", *cmd]
    return cmd


def run_fault(kind: str, launcher: str = "mpirun", nranks: int = 4, timeout: float = 90) -> FaultResult:
    """``launcher``: ``mpirun``, ``spawn`` (ours) or ``torchrun-env`` (the ranks alone, with torchrun's
    variables).  The last rank is the culprit."""
    token = f"nccllab-fault-{uuid.uuid4().hex[:12]}"
    env = {**os.environ, "NCCL_SOCKET_IFNAME": "lo", "NCCLLAB_TIMEOUT": str(DEADLINE_S),
           "NCCLLAB_HANG_DIR": f"/tmp/{token}"}
    held = None
    if kind == "port_taken":
        held, port = _taken_port()
        env["NCCL_COMM_ID"] = f"127.0.0.1:{port}"
    args = [sys.executable, str(WORKERS), "fault", kind.split("_")[0] if kind.startswith("sigkill") else kind,
            str(FAULTS[kind][0]), token]
    t0 = time.monotonic()
    try:
        if launcher == "torchrun-env":
            out, codes = _env_ranks(nranks, args, env, t0, timeout)
            rc = next((c for c in codes if c), 0)
        else:
            proc = subprocess.run(_command(kind, launcher, nranks, args), env=env, capture_output=True, text=True,
                                  timeout=timeout, cwd=ROOT)
            rc, out, codes = proc.returncode, proc.stdout + proc.stderr, [proc.returncode]
    finally:
        if held is not None:
            held.close()
    t_end = time.monotonic()
    for _ in range(40):  # mpirun may return a moment before the last rank is reaped
        procs = _procs_with(token)
        if not procs:
            break
        time.sleep(0.05)
    shutil.rmtree(f"/tmp/{token}", ignore_errors=True)
    inject = [float(t) for t in re.findall(r"INJECT \S+ ([\d.]+)", out)]
    detected = [float(t) for t in re.findall(r"DETECTED ([\d.]+)", out)]
    pattern = FAULTS[kind][1].format(v=nranks - 1)
    lines = [ln.strip() for ln in out.splitlines() if re.search(pattern, ln)]
    return FaultResult(kind, launcher, rc, t_end - t0, (min(detected) - inject[0]) if inject and detected else None,
                       t_end - (inject[0] if inject else t0), lines[0] if lines else "", codes,
                       _left_in_shm(set(re.findall(r"JOBSHM (\S+)", out))), procs, out)
