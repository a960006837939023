"""scripts/gpu_check.py, the one command a GPU gets: it must not waste the device's minutes.

* ``--dry-run`` (CI): the whole script under numba's simulator with the budget scaled down; every step reports,
  in its order, within the budget, and the report files are written.
* A step past its deadline is killed with every process it started, keeps what it had saved, and the budget
  then skips what no longer fits.
* The cuMem probe against cuda-bindings' return shapes (a stub package with the real shapes: every driver call
  returns a tuple, ``(CUresult,)`` when it has no output), and its failure is its own line.
* A hung real-NCCL group costs one deadline for all its ranks, every rank and grandchild killed and reaped, and
  a failed group is a row, not an exception.
The end-to-end run with the full matrix in the simulator stays behind NCCLLAB_SLOW_TESTS=1."""
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gpu_check.py"
ORDER = ("environment", "compile", "ipc", "copy_rate", "bitwise", "sweep", "real_nccl", "processes")


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_ENABLE_CUDASIM", "NCCLLAB_DEVICE")}
    return {**env, "PYTHONPATH": str(ROOT), **extra}


def _gone(pid: int) -> bool:
    """The process has ended (a zombie waiting for its reaper counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def _wait_gone(pid: int, limit: float = 5.0) -> bool:
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if _gone(pid):
            return True
        time.sleep(0.05)
    return False


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_dry_run_reports_every_step_within_its_budget(tmp_path):
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path), "--dry-run"], env=_env(), capture_output=True,
                       text=True, timeout=240)
    wall = time.monotonic() - t0
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rep = json.loads((tmp_path / "gpu_check.json").read_text())
    assert rep["dry_run"] and rep["device"] == "cudasim" and rep["budget_s"] == 360 / 8
    assert [s for s in rep if s in ORDER] == list(ORDER)      # every step, in order
    assert all("status" in rep[s] for s in ORDER)
    assert rep["elapsed_s"] <= rep["budget_s"] + 5, rep["elapsed_s"]
    assert rep["environment"]["gpu"] == "skipped: no GPU"
    assert all(rep[s]["status"].startswith("skipped") for s in ("compile", "ipc", "copy_rate", "real_nccl"))
    b = rep["bitwise"]
    assert b["status"] == "ok" and b["wrong"] == 0
    assert {(r["func"], r["algo"], r["proto"]) for r in b["rows"]} == {
        (f, a, p) for f, a in [(f, "Ring") for f in ("AllReduce", "ReduceScatter", "AllGather", "Broadcast",
                                                     "Reduce")] + [("AllReduce", "Tree")]
        for p in ("Simple", "LL", "LL128")}
    assert rep["sweep"]["status"] == "ok" and all(set(r) >= {"Simple", "LL", "LL128"} for r in rep["sweep"]["ring"])
    assert rep["sweep"]["ll_vs_simple"]
    assert rep["processes"]["status"] == "ok" and rep["processes"]["rows"][0]["via"] == ["P2P/IPC"]
    text = (tmp_path / "gpu_check.txt").read_text()
    assert all(f"[{s}]" in text for s in ORDER)
    assert "against the copy bound" in text and "LL against Simple" in text
    assert (tmp_path / "busbw.png").stat().st_size > 0
    assert "dry run: 8 of 8 steps reported" in p.stdout
    print(f"dry run: {wall:.1f} s wall, {rep['elapsed_s']} s by its own clock")


def test_a_step_past_its_deadline_is_killed_and_the_budget_skips_the_rest(tmp_path):
    """The bitwise step hangs (and starts a child of its own): it is killed at the budget's edge with its child,
    its entry keeps what it saved, the sweep no longer fits and says so, and the reports are written."""
    p = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path), "--dry-run", "--budget", "48", "--steps",
                        "bitwise,sweep"], env=_env(NCCLLAB_GPUCHECK_HANG="bitwise"), capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]   # every step has its entry
    rep = json.loads((tmp_path / "gpu_check.json").read_text())
    assert rep["bitwise"]["status"].startswith("timed out after 5 s (its processes killed)")
    assert rep["bitwise"]["hang_child"] > 0                            # saved before the hang: kept
    assert _wait_gone(rep["bitwise"]["hang_child"]), "the hung step's own child survived"
    assert rep["sweep"]["status"].startswith("skipped: budget spent")
    assert "[bitwise] timed out" in (tmp_path / "gpu_check.txt").read_text()


def test_the_report_of_a_gpu_run_says_what_was_measured_against_what(gpu_check, tmp_path):
    """A report shaped as a GPU run's (every entry a GPU step writes): the words and the plot."""
    ring = [{"n": n, "bytes": b, **{p: {"us": 10.0 * b / 65536, "busbw": 1.5 * b / 65536} for p in
                                     ("Simple", "LL", "LL128")}} for n in (2, 4) for b in (65536, 1 << 20)]
    rep = {"device": "cuda", "small": False, "dry_run": False, "budget_s": 360, "started": "now", "elapsed_s": 300,
           "environment": {"status": "ok", "gpu": "NVIDIA H200", "sm_count": 132, "step_seconds": 3},
           "compile": {"status": "ok", "kernels": [{"kernel": "AllReduce,float32,LL128", "status": "ok",
                                                    "regs_per_thread": 96, "local_bytes_per_thread": 480,
                                                    "blocks_per_sm": 1, "nthreads": 640, "seconds": 9.5}]},
           "ipc": {"status": "ok", "ipc": "ok: ...", "cumem": "ok: ..."},
           "copy_rate": {"status": "ok", "GBps": 3900.0, "note": "bytes copied per second"},
           "bitwise": {"status": "ok", "wrong": 0, "ranks": [2, 4], "channels": 2, "counts": [0, 1001],
                       "rows": [{"n": 2, "func": "AllReduce", "algo": "Ring", "proto": "LL128", "dtype": "float32",
                                 "wrong": 0}]},
           "sweep": {"status": "ok", "channels": 16, "ring": ring, "bound_GBps": {"2": 1950.0, "4": 975.0},
                     "bound_note": "copy rate / N", "timing": "CUDA events", "largest_simple_fraction_of_bound": 0.4,
                     "ll_vs_simple": [{"n": 4, "bytes": 1024, "LL_us": 9.0, "Simple_us": 14.0, "LL_faster": True}]},
           "real_nccl": {"status": "ok", "nccl": "2.30.7", "mode": "NCCL_MULTI_RANK_GPU_ENABLE=1",
                         "reference_follows": "2.30",
                         "rows": [{"config": "n2_Ring_Simple", "count": 1001, "status": "equal",
                                   "wrong_per_rank": [0, 0]},
                                  {"config": "n2_Ring_LL128", "status": "skipped", "note": "NCCL disables LL128 here"}],
                         "busbw": [{"n": 4, "status": "ok", "rows": [{"bytes": 1 << 20, "us": 30.0, "busbw": 50.0}]}]},
           "processes": {"status": "skipped: budget spent (355 s of 360 s)"}}
    gpu_check._write_reports(rep, tmp_path)
    text = (tmp_path / "gpu_check.txt").read_text()
    assert "against the copy bound {'2': 1950.0, '4': 975.0}" in text
    assert "LL against Simple, N=4    1024 B: LL 9.0 us, Simple 14.0 us (LL faster)" in text
    assert "n2_Ring_Simple count 1001: equal [0, 0]" in text and "NCCL disables LL128 here" in text
    assert "NCCL's own busbw N=4: ok 1048576 B 50.0" in text and "96 registers/thread" in text
    assert (tmp_path / "busbw.png").stat().st_size > 0 and "plot_error" not in rep


def test_unknown_step_is_one_line(tmp_path):
    p = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path), "--steps", "bitwise,warp"], env=_env(),
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [
        f"gpu_check: unknown step 'warp' (--steps: choose from {', '.join(ORDER)})"]


# --- the cuMem probe against cuda-bindings' return shapes ------------------------------------------------------
_STUB = r'''
"""A stand-in for cuda.bindings.driver with its return shapes: a tuple from every call, (CUresult,) when the call
has no output, (CUresult, value) with one.  Memory is a memfd, so the fd really crosses the socket."""
import ctypes, enum, mmap, os


class CUresult(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_OUT_OF_MEMORY = 2


class _Ns:
    def __init__(self, **kw):
        self.__dict__.update(kw)


CUmemAllocationType = _Ns(CU_MEM_ALLOCATION_TYPE_PINNED=1)
CUmemLocationType = _Ns(CU_MEM_LOCATION_TYPE_DEVICE=1)
CUmemAllocationHandleType = _Ns(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR=1)
CUmemAllocationGranularity_flags = _Ns(CU_MEM_ALLOC_GRANULARITY_MINIMUM=0)
CUmemAccess_flags = _Ns(CU_MEM_ACCESS_FLAGS_PROT_READWRITE=3)
_OK = CUresult.CUDA_SUCCESS
_maps, _next = {}, [0x7000_0000_0000]


class CUmemAllocationProp:
    def __init__(self):
        self.type, self.requestedHandleTypes, self.location = 0, 0, _Ns(type=0, id=0)


class CUmemAccessDesc:
    def __init__(self):
        self.flags, self.location = 0, _Ns(type=0, id=0)


def cuInit(flags):
    return (_OK,)


def cuDeviceGet(ordinal):
    return (_OK, ordinal)


def cuDevicePrimaryCtxRetain(dev):
    return (_OK, object())


def cuCtxSetCurrent(ctx):
    return (_OK,)


def cuCtxSynchronize():
    return (_OK,)


def cuMemGetAllocationGranularity(prop, option):
    return (_OK, 65536)


def cuMemCreate(size, prop, flags):
    if os.environ.get("STUB_CUMEM_FAIL"):
        return (CUresult.CUDA_ERROR_OUT_OF_MEMORY, None)
    fd = os.memfd_create("stub-cumem")
    os.ftruncate(fd, size)
    return (_OK, fd)


def cuMemExportToShareableHandle(handle, handle_type, flags):
    return (_OK, os.dup(handle))


def cuMemImportFromShareableHandle(os_handle, handle_type):
    return (_OK, os_handle)


def cuMemAddressReserve(size, alignment, addr, flags):
    _next[0] += 1 << 30
    return (_OK, _next[0])


def cuMemMap(va, size, offset, handle, flags):
    _maps[va] = mmap.mmap(handle, size)
    return (_OK,)


def cuMemSetAccess(va, size, desc, count):
    return (_OK,)


def cuMemsetD32(va, value, count):
    _maps[va][:count * 4] = value.to_bytes(4, "little") * count
    return (_OK,)


def cuMemcpyDtoH(dst, va, size):
    ctypes.memmove(dst, bytes(_maps[va][:size]), size)
    return (_OK,)
'''


@pytest.fixture
def stub_bindings(tmp_path):
    pkg = tmp_path / "stub" / "cuda" / "bindings"
    pkg.mkdir(parents=True)
    (tmp_path / "stub" / "cuda" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "driver.py").write_text(_STUB)
    return tmp_path / "stub"


@pytest.mark.parametrize("fail,expect", [("", "ok: a cuMem allocation exported as a POSIX fd"),
                                          ("1", "failed: RuntimeError: cuMemCreate: ")])
def test_cumem_probe_against_cuda_bindings_return_shapes(stub_bindings, tmp_path, fail, expect):
    """The probe passes with the real shapes (it used to raise at once on ``cuInit``'s 1-tuple), under an output
    folder whose path alone is longer than an AF_UNIX address; a driver error is its own line, not a crash."""
    deep = tmp_path / ("d" * 100) / ("e" * 60)
    deep.mkdir(parents=True)
    code = ("import importlib.util, sys; s = importlib.util.spec_from_file_location('g', sys.argv[1]); "
            "g = importlib.util.module_from_spec(s); s.loader.exec_module(g); print(g._cumem_probe(10))")
    p = subprocess.run([sys.executable, "-c", code, str(SCRIPT)], cwd=deep, capture_output=True, text=True,
                       timeout=60, env=_env(PYTHONPATH=f"{stub_bindings}{os.pathsep}{ROOT}", STUB_CUMEM_FAIL=fail))
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip().startswith(expect), p.stdout + p.stderr


# --- a hung real-NCCL group ---------------------------------------------------------------------------------------
_HANGING_WORKER = r"""
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
open(os.path.join(os.environ["FAKE_PIDS"], f"{os.environ['RANK']}.pids"), "w").write(f"{os.getpid()} {child.pid}")
time.sleep(3600)
"""


def test_a_hung_nccl_group_costs_one_deadline_and_every_rank_is_reaped(gpu_check, tmp_path, monkeypatch):
    pids = tmp_path / "pids"
    pids.mkdir()
    monkeypatch.setenv("FAKE_PIDS", str(pids))
    t0 = time.monotonic()
    rows = gpu_check.nccl_config_rows(4, "Ring", "Simple", (11,), 1, (2, 28, 9), False, 29999, tmp_path, 3.0,
                                      worker=_HANGING_WORKER)
    took = time.monotonic() - t0
    assert took < 3.0 + 4.0, took                      # one deadline for all 4 ranks, not 4 of them
    assert len(rows) == 1 and rows[0]["status"] == "timed out after 3 s (every rank killed)"
    assert rows[0]["rc"] and all(rc is not None and rc != 0 for rc in rows[0]["rc"])   # all reaped, none "ok"
    started = [int(x) for f in pids.iterdir() for x in f.read_text().split()]
    assert len(started) == 8 and all(_wait_gone(pid) for pid in started)


def test_a_failed_nccl_group_is_a_row_not_an_exception(gpu_check, tmp_path):
    rows = gpu_check.nccl_config_rows(2, "Tree", "LL", (11,), 1, (2, 30, 7), True, 29998, tmp_path, 30.0,
                                      worker="import sys; sys.exit(3)")
    assert len(rows) == 1 and rows[0]["status"] == "failed" and rows[0]["rc"] == [3, 3]


_REFERENCE_WORKER = r"""
import os, sys, numpy as np
from collectives.perf import reference
d, rank, n = sys.argv[1], int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
for name in sorted(f for f in os.listdir(d) if f.startswith(f"in_r{rank}_")):
    tail = name.split("_", 2)[2]
    xs = [np.load(os.path.join(d, f"in_r{r}_{tail}")) for r in range(n)]
    y = reference.all_reduce(xs, nchannels=int(os.environ["NCCL_MAX_NCHANNELS"]), proto=os.environ["NCCL_PROTO"],
                             algo=os.environ["NCCL_ALGO"], nccl_version=(2, 30))
    if rank == int(os.environ.get("FLIP_RANK", "-1")):
        y.view(np.uint32)[:5] ^= 1
    np.save(os.path.join(d, name.replace("in_", "out_")), y)
"""


def test_nccl_rows_compare_every_rank_bit_for_bit(gpu_check, tmp_path, monkeypatch):
    """The happy path of the real-NCCL step with a stand-in that all-reduces in NCCL's order: equal; then one
    rank's output off by a bit in 5 elements: that rank's count."""
    args = (2, "Ring", "Simple", (1001,), 2, (2, 30, 7), True)
    rows = gpu_check.nccl_config_rows(*args, 29997, tmp_path, 60.0, worker=_REFERENCE_WORKER)
    assert [(r["config"], r["count"], r["status"], r["wrong_per_rank"]) for r in rows] == [
        ("n2_Ring_Simple", 1001, "equal", [0, 0])]
    monkeypatch.setenv("FLIP_RANK", "1")
    rows = gpu_check.nccl_config_rows(*args, 29996, tmp_path, 60.0, worker=_REFERENCE_WORKER)
    assert rows[0]["status"] == "differ" and rows[0]["wrong_per_rank"] == [0, 5]


def test_ll128_against_nccl_over_net_is_marked_not_run(gpu_check):
    assert gpu_check.LL128_OFF_NOTE.startswith("NCCL disables LL128 here")


# --- the slow end-to-end and the missing-cupy line -------------------------------------------------------------
@pytest.mark.skipif(os.environ.get("NCCLLAB_SLOW_TESTS") != "1",
                    reason="the full matrix in numba's simulator takes minutes on 2 cores: "
                           "run with NCCLLAB_SLOW_TESTS=1")
def test_gpu_check_runs_in_the_simulator(tmp_path):
    p = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path), "--device", "cudasim", "--small", "--budget",
                        "1200"], env=_env(), capture_output=True, text=True, timeout=1500)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rep = json.loads((tmp_path / "gpu_check.json").read_text())
    assert rep["bitwise"]["status"] == "ok" and rep["bitwise"]["wrong"] == 0
    assert rep["processes"]["status"] == "ok"
    assert all(r["via"] == ["P2P/IPC"] for r in rep["processes"]["rows"])


def test_gpu_check_without_cupy_is_one_line(tmp_path):
    if importlib.util.find_spec("cupy") is not None:
        pytest.skip("cupy is installed: --device cuda may well work here")
    p = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path), "--device", "cuda"], env=_env(),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.strip().splitlines() == [
        "gpu_check: device cuda needs cupy and numba-cuda (pip install -e .[gpu]): No module named 'cupy'"]
