"""``python -m collectives.ring``: the nccl-tests table, its JSON, mpirun, the nccl-tests parser, and the
benchmarks' side-by-side timer."""
import json
import os
import runpy
import subprocess
import sys
import time

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
    from collectives.perf.table import float_str
    assert float_str(3.14159, 6) == "  3.14" and float_str(12345.678, 7) == "12345.7"
    assert float_str(1234567.0, 6) == " 1e+06"


# --- bad input: one line, non-zero, before any rank starts ---------------------------------------------------

BAD = [
    (["-g", "0"], {}, "the number of ranks must be at least 1"),
    (["-g", "-3"], {}, "the number of ranks must be at least 1"),
    (["-b", "1M", "-e", "1K"], {}, "is larger than -e"),
    (["-n", "0"], {}, "timed iterations must be at least 1"),
    (["-d", "float17"], {}, "unknown datatype 'float17' (choose from"),
    (["--coll", "reduce", "-r", "5", "-g", "2"], {}, "the root must be a rank, 0 to 1"),
    (["-g", "2", "-b", "64G", "-e", "64G"], {}, "GiB are available: lower -e"),
    (["--json", "/nonexistent/x.json"], {}, "cannot write there"),
    (["-g", "2"], {"NCCL_PROTO": "Bogus"}, "NCCL_PROTO"),
    (["-g", "2"], {"NCCL_ALGO": "NVLS"}, "No algorithm/protocol available"),
    (["-g", "2", "--nodes", "3"], {}, "--nodes 3: must be between 1 and"),
    (["-b", "1Q"], {}, "'1Q' is not a size"),
]


@pytest.mark.parametrize("args,env,says", BAD, ids=[" ".join(a) + "".join(f" {k}" for k in e) for a, e, _ in BAD])
def test_bad_input_is_one_line_before_ranks_start(args, env, says):
    proc = subprocess.run([sys.executable, "-m", "collectives.ring", *args], env={**ENV, **env}, capture_output=True,
                          text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and not ln.startswith(("usage:", " "))]
    assert len(lines) == 1 and says in lines[0], proc.stderr
    assert proc.stdout == "", "nothing should start"


def test_mpirun_size_and_nodes_are_checked_or_applied():
    mpirun = os.path.join(os.path.dirname(sys.executable), "mpirun")
    bad = subprocess.run([mpirun, "-n", "3", sys.executable, "-m", "collectives.ring", "-g", "5", "-b", "1K", "-e",
                          "1K"], env=ENV, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert bad.returncode != 0 and bad.stderr.count("-g 5 but this job has 3 ranks") == 1, bad.stderr
    ok = subprocess.run([mpirun, "-n", "4", sys.executable, "-m", "collectives.ring", "--nodes", "2", "-b", "1K",
                         "-e", "1K", "-n", "1"], env=ENV, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert "nnodes 2" in ok.stdout and "Rank  3 Group  0" in ok.stdout and " device  1 [cpu] node 1" in ok.stdout


def test_json_to_stdout_keeps_the_table_apart():
    proc = subprocess.run([sys.executable, "-m", "collectives.ring", "-g", "2", "-b", "1K", "-e", "1K", "-n", "1",
                           "--json", "-"], env=ENV, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)[0]["size"] == 1024
    assert "# Out of bounds values : 0 OK" in proc.stderr


def test_launcher_cli_runs_a_script(tmp_path):
    script = tmp_path / "mine.py"
    script.write_text("import os, numpy as np, collectives\n"
                      "with collectives.Communicator() as c:\n"
                      "    y = c.all_reduce(np.ones(3, np.float32))\n"  # one write per line: ranks share stdout
                      "    os.write(1, f'rank {c.rank} of {c.nranks} nodes {c.nnodes} {float(y[0])}\\n'.encode())\n")
    proc = subprocess.run([sys.executable, "-m", "collectives.tools.launcher", "-g", "3", "--nodes", "2", str(script)],
                          env=ENV, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert sorted(ln for ln in proc.stdout.splitlines() if ln.startswith("rank")) == \
        [f"rank {r} of 3 nodes 2 3.0" for r in range(3)]
    missing = subprocess.run([sys.executable, "-m", "collectives.tools.launcher", "-g", "2", "nope.py"], env=ENV,
                             capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert missing.returncode == 2 and missing.stderr.strip() == "python -m collectives.tools.launcher: nope.py: no such file"


def test_lab_help_deletes_nothing(tmp_path):
    for args in (["--help"], ["main", "--help"]):
        proc = subprocess.run([str(ROOT / "lab"), *args], capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert proc.returncode == 0 and proc.stdout.startswith("usage: ./lab main"), proc.stderr


def test_lab_test_with_a_file_runs_that_file_only():
    """``./lab test tests/x.py`` (docs/tests.md's "Running a part") collects that file's tests and no others (with
    no path, pytest takes pyproject's ``testpaths``: the whole suite, which CI runs)."""
    proc = subprocess.run([str(ROOT / "lab"), "test", "tests/test_layers.py", "--collect-only"],
                          capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    ids = [ln for ln in proc.stdout.splitlines() if "::" in ln]
    assert ids and all(ln.startswith("tests/test_layers.py::") for ln in ids), ids[:5] + ids[-5:]


def test_timed_rounds_alternates_and_reports_each_medians():
    # The side-by-side benchmarks' timer: rounds alternate the order (a burst of noise hits both sides alike)
    # and each side gets its median round, whatever one odd round did.
    from mpi4py import MPI
    timed_rounds = runpy.run_path(str(ROOT / "benchmarks" / "timing.py"))["timed_rounds"]  # benchmarks/' own
    order = []

    def call(name):
        def fn():
            order.append(name)
            if name == "b" and order.count("b") in (3, 4):  # b's second round is slow: 25 ms a call
                time.sleep(0.025)
        return fn
    t = timed_rounds({"a": call("a"), "b": call("b")}, 2, MPI.COMM_SELF, rounds=3)
    assert order == ["a", "a", "b", "b", "b", "b", "a", "a", "a", "a", "b", "b"]
    assert t["a"] < 0.01 and t["b"] < 0.01, t  # the slow round is not b's median


def test_timed_rounds_reports_each_sides_cpu_per_call():
    # With ``cpu``, each side's CPU per call (user, sys: every thread of the process) from the same rounds: a side
    # that spins for 4 ms a call uses about that, a side that sleeps 4 ms a call almost none, whatever its wall.
    from mpi4py import MPI
    timed_rounds = runpy.run_path(str(ROOT / "benchmarks" / "timing.py"))["timed_rounds"]

    def spin():  # 4 ms of this thread's CPU, however long a loaded machine takes to give it
        end = time.thread_time() + 0.004
        while time.thread_time() < end:
            pass
    cpu = {}
    t = timed_rounds({"spin": spin, "sleep": lambda: time.sleep(0.004)}, 5, MPI.COMM_SELF, rounds=3, cpu=cpu)
    assert set(cpu) == {"spin", "sleep"} and all(len(v) == 2 and min(v) >= 0 for v in cpu.values()), cpu
    assert t["spin"] >= 0.004 and t["sleep"] >= 0.004, t
    assert sum(cpu["spin"]) > 0.003, cpu
    assert sum(cpu["sleep"]) < 0.002, cpu
