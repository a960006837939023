"""A bad value of one of the lab's numeric variables is one line at the command line, before any rank starts,
naming the variable; never a traceback from every rank (issue 24: ``NCCL_BUFFSIZE=1`` and ``NCCLLAB_TIMEOUT=0``
gave one traceback per rank)."""
import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT

BIN = os.path.dirname(sys.executable)
MPIRUN = shutil.which("mpirun", path=BIN + os.pathsep + os.environ.get("PATH", ""))
RING = [sys.executable, "-m", "collectives.ring", "-b", "8", "-e", "8", "-n", "1", "-w", "0"]

BAD = [("NCCL_BUFFSIZE", "1", "is too small"), ("NCCL_LL_BUFFSIZE", "0", "is too small"),
       ("NCCL_LL128_BUFFSIZE", "-4096", "is too small"),
       ("NCCLLAB_TIMEOUT", "0", "must be a positive number of seconds"),
       ("NCCLLAB_TIMEOUT", "soon", "must be a positive number of seconds"),
       ("NCCLLAB_TIMEOUT", "inf", "must be a positive number of seconds"),
       ("NCCLLAB_WARN_AFTER", "-1", "must be a positive number of seconds"),
       ("NCCLLAB_HANDSHAKE_TIMEOUT", "nan", "must be a positive number of seconds")]


def run(cmd: list[str], name: str, value: str) -> subprocess.CompletedProcess:
    env = {**os.environ, name: value, "NCCL_SOCKET_IFNAME": "lo", "PATH": BIN + os.pathsep + os.environ["PATH"]}
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def one_line(proc, name: str, value: str, says: str) -> None:
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if name in ln]
    assert len(lines) == 1 and says in lines[0] and value in lines[0], proc.stderr[-3000:]
    assert "# nccl-lab" not in proc.stdout, "no rank should have started"


@pytest.mark.parametrize("name,value,says", [BAD[0], BAD[3], BAD[4]])
def test_bad_numeric_variable_is_one_line_before_ranks_start(name, value, says):
    proc = run([*RING, "-g", "2"], name, value)
    one_line(proc, name, value, says)
    printed = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(printed) == 1 and printed[0].startswith(f"python -m collectives.ring: {name}="), printed


@pytest.mark.parametrize("name,value,says", [BAD[0], BAD[3]])
def test_bad_numeric_variable_under_mpirun_is_one_line(name, value, says):
    if MPIRUN is None:
        pytest.skip("mpirun not found (pip install mpich)")
    one_line(run([MPIRUN, "-n", "2", *RING], name, value), name, value, says)


@pytest.mark.parametrize("name,value,says", BAD)
def test_every_bad_value_is_caught_by_the_argument_check(name, value, says, monkeypatch):
    """The same check in-process, for every variable and value (the command line costs seconds a case)."""
    from collectives.perf.args import build_parser, check_args
    monkeypatch.setenv(name, value)
    args = build_parser("collectives.ring").parse_args(["-b", "8", "-e", "8"])
    problem = check_args(args, 2)
    assert problem and problem.startswith(f"{name}=") and says in problem and value in problem, problem
