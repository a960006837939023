"""``python -m collectives.ring``: the nccl-tests table, its JSON, mpirun, and the nccl-tests parser."""
import json
import os
import subprocess
import sys

import pytest

from conftest import FIXTURES, ROOT
from visualize import nccl_tests

ENV = {**os.environ, "NCCLLAB_TIMEOUT": "60", "NCCL_SOCKET_IFNAME": "lo"}  # one machine: stay on loopback


def test_runner_spawns_ranks_and_prints_a_clean_table(tmp_path):
    out = tmp_path / "rows.json"
    proc = subprocess.run([sys.executable, "-m", "collectives.ring", "-g", "3", "-b", "8", "-e", "4M", "-f", "8",
                           "-n", "2", "-w", "1", "--json", str(out)], env=ENV, capture_output=True, text=True,
                          timeout=240, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    tables = nccl_tests.parse(proc.stdout)
    assert len(tables) == 1
    t = tables[0]
    assert [r.size for r in t.rows] == [8, 64, 512, 4096, 32768, 262144, 2097152]
    assert all(r.out_of_place["wrong"] == 0 and r.in_place["wrong"] == 0 for r in t.rows)
    assert t.out_of_bounds == 0 and t.oob_ok and t.avg_busbw is not None
    recs = json.loads(out.read_text())
    assert len(recs) == 2 * len(t.rows)
    assert set(recs[0]) >= {"size", "count", "dtype", "op", "algo", "proto", "nranks", "nchannels", "time_us",
                            "algbw", "busbw", "wrong"}
    assert {r["placement"] for r in recs} == {"in-place", "out-of-place"}


@pytest.mark.parametrize("coll,dtype,op", [("reducescatter", "half", "avg"), ("allgather", "bfloat16", "sum"),
                                           ("broadcast", "int32", "sum"), ("reduce", "double", "prod")])
def test_runner_other_collectives(coll, dtype, op):
    proc = subprocess.run([sys.executable, "-m", "collectives.ring", "-g", "3", "--coll", coll, "-d", dtype, "-o",
                           op, "-r", "1", "-b", "1K", "-e", "1M", "-f", "32", "-n", "2", "-w", "0"], env=ENV,
                          capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    t = nccl_tests.parse(proc.stdout)[0]
    assert t.oob_ok and all(r.out_of_place["wrong"] == 0 for r in t.rows)


def test_mpirun_eight_ranks():
    mpirun = os.path.join(os.path.dirname(sys.executable), "mpirun")
    proc = subprocess.run([mpirun, "-n", "8", sys.executable, "-m", "collectives.ring", "-b", "8", "-e", "128K",
                           "-f", "16", "-n", "2", "-w", "1"], env=ENV, capture_output=True, text=True, timeout=240,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "nranks 8" in proc.stdout
    t = nccl_tests.parse(proc.stdout)[0]
    assert t.oob_ok and len(t.rows) == 4


def test_mpi_integer_types_and_ops_match_mpi4py():
    mpirun = os.path.join(os.path.dirname(sys.executable), "mpirun")
    proc = subprocess.run([mpirun, "-n", "3", sys.executable, str(ROOT / "tests" / "workers.py"), "mpi_compare"],
                          env=ENV, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert proc.stdout.count(" ok") == 3


def test_parser_reads_real_nccl_tests_output():
    path = FIXTURES / "nccl_tests" / "a3mega_2x8_h100_allreduce.txt"
    if not path.exists():
        pytest.skip("shared fixtures not present")
    tables = nccl_tests.parse(path.read_text())
    assert tables and tables[0].rows[0].size == 8
    assert tables[0].avg_busbw is not None
    assert max(r.out_of_place["busbw"] for r in tables[0].rows) > 10


def test_float_str_matches_nccl_tests():
    from collectives.perf import float_str
    assert float_str(3.14159, 6) == "  3.14" and float_str(12345.678, 7) == "12345.7"
    assert float_str(1234567.0, 6) == " 1e+06"
