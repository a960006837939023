"""``python -m collectives.sendrecv`` / ``alltoall`` / ``gather`` / ``scatter`` (nccl-tests' point-to-point tests
over ``collectives/perf/``): the table at n = 2 and 3, by our launcher and under mpirun, every row checked bitwise
(``-c 1``) against ``collectives.perf.reference``."""
import os
import subprocess
import sys

import pytest

from conftest import ROOT
from visualize import nccl_tests

ENV = {**os.environ, "NCCLLAB_TIMEOUT": "60", "NCCL_SOCKET_IFNAME": "lo"}  # one machine: stay on loopback
SIZES = ["-b", "8", "-e", "1M", "-f", "37", "-n", "2", "-w", "1", "-c", "1"]  # 0 B, odd counts, LL and Simple
CHECKED_IN_PLACE = {"sendrecv": False, "alltoall": False, "gather": True, "scatter": True}  # as nccl-tests


@pytest.mark.parametrize("launcher", ["own", "mpirun"])
@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("coll", ["sendrecv", "alltoall", "gather", "scatter"])
def test_p2p_runner_table_is_right(coll, n, launcher):
    args = [sys.executable, "-m", f"collectives.{coll}", *SIZES, "-r", str(n - 1), "-d", "int32" if n == 3 else "half"]
    if launcher == "own":
        args += ["-g", str(n)]
    else:
        args = [os.path.join(os.path.dirname(sys.executable), "mpirun"), "-n", str(n), *args]
    proc = subprocess.run(args, env=ENV, capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "# Out of bounds values : 0 OK" in proc.stdout and f"nranks {n}," in proc.stdout, proc.stdout
    t = nccl_tests.parse(proc.stdout)[0]
    assert [r.size for r in t.rows][:2] == ([8, 296] if coll == "sendrecv" else [0, 288]), t.rows
    assert len(t.rows) == 4
    for r in t.rows:
        assert r.out_of_place["wrong"] == 0, (r, proc.stdout)
        assert r.root == (n - 1 if coll in ("gather", "scatter") else -1)
        if CHECKED_IN_PLACE[coll]:
            assert r.in_place["wrong"] == 0, (r, proc.stdout)
        else:
            assert r.in_place["wrong"] is None, (r, proc.stdout)   # N/A, as nccl-tests reports it
    if coll == "alltoall":  # no in-place form: not run
        assert all(r.in_place["time_us"] is None for r in t.rows), proc.stdout


def test_p2p_runner_refusals():
    for args, why in ((["-m", "collectives.gather", "-g", "2", "-r", "2"], "-r 2: the root must be a rank"),
                      (["-m", "collectives.sendrecv", "-g", "2", "--device", "cudasim"], "only on the CPU device")):
        proc = subprocess.run([sys.executable, *args, "-b", "8", "-e", "8"], env=ENV, capture_output=True, text=True,
                              timeout=60, cwd=ROOT)
        assert proc.returncode == 2 and why in proc.stderr, proc.stderr
