"""One command for a GPU machine: ``python scripts/gpu_check.py OUTDIR [--budget 360] [--steps a,b] [--dry-run]``.

No NCCL counterpart (nccl-tests' ``all_reduce_perf`` is the closest: its busbw, and its bitwise check against a
reference); the real-NCCL step reads NCCL's own logs and follows ``src/graph/tuning.cc`` on when LL128 is on.

It is written for a GPU lent once, for minutes: it must bring back every figure it can on its first try, even if a
step fails or hangs.  So every step runs in a child process of its own session with a deadline; when the deadline
passes every process of that session is killed (SIGKILL: the step, what it started, and theirs) and reaped, and
the step's entry keeps whatever rows it had written.  The steps share a total budget (``--budget``, default 6
minutes): a step gets at most what is left, and one that would start with too little is recorded as skipped.
``OUTDIR/gpu_check.json`` and ``OUTDIR/gpu_check.txt`` are rewritten after every step (and ``OUTDIR/busbw.png``
once there are curves), so a later failure loses only its own step.  Every kernel is ``cache=True`` with
``NUMBA_CACHE_DIR=OUTDIR/numba_cache``: the ``compile`` step compiles all of them in parallel processes, the later
steps load them.

Steps, in this order (the slow ones last; ``--steps`` picks some, keeping the order):

1. ``environment``: GPU, driver, CUDA, cupy, numba, torch and its NCCL, ``CUDA_DEVICE_MAX_CONNECTIONS``;
2. ``compile``: every kernel variant the later steps launch, one process each, in parallel (each variant has its
   own cache index, so the processes never overwrite each other's); per kernel its registers, local memory, blocks
   per SM and whether 4 ranks x 16 channels can be resident at once;
3. ``ipc``: CUDA IPC between two processes (cupy's ``ipcGetMemHandle`` / ``ipcOpenMemHandle``, NCCL's
   ``P2P/IPC``) and a cuMem allocation passed as a POSIX file descriptor (cuda-bindings, NCCL's ``P2P/CUMEM``);
4. ``copy_rate``: device-to-device copy rate, the bound of the busbw sweep;
5. ``bitwise``: ranks as threads (``collectives/device/cuda/threads.py``), N = 2 and 4, the five ring collectives and Tree
   AllReduce, Simple, LL and LL128, against ``collectives.perf.reference``, bit for bit;
6. ``sweep``: Ring AllReduce busbw per size for Simple, LL and LL128 (N = 2 and 4, 16 channels) against the copy
   bound (copy rate / N), and LL against Simple below 64 KiB (kernel times from CUDA events);
7. ``real_nccl``: torch's NCCL on the same GPU (N = 2 and 4 processes), forced NCCL_ALGO / NCCL_PROTO /
   channels, bit for bit against the reference for the rings, trees and version its log prints, and NCCL's own
   busbw per size (its default choices) for the plot;
8. ``processes``: the communicator with 2 rank processes (``python -m collectives.ring --device``: P2P/IPC).

``--dry-run`` runs the whole script under numba's simulator with tiny sizes and the budget divided by
``DRY_RUN_SCALE``, then checks that the report has every step's entry (CI runs it: ``tests/test_gpu_check.py``).
What the simulator cannot do (timings, IPC, real NCCL) is recorded as "skipped: no GPU".
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

NO_GPU = "skipped: no GPU"
RING_FUNCS = ("AllReduce", "ReduceScatter", "AllGather", "Broadcast", "Reduce")
PROTOS = ("Simple", "LL", "LL128")
ORDER = ("environment", "compile", "ipc", "copy_rate", "bitwise", "sweep", "real_nccl", "processes")
GPU_ONLY = {"compile": "skipped: the simulator compiles nothing (its kernels run as Python)", "ipc": NO_GPU,
            "copy_rate": NO_GPU, "real_nccl": NO_GPU}   # on the simulator the driver records these at once
# seconds per step: on a GPU, and in the simulator (--device cudasim, --small)
DEADLINES = {"environment": (30, 20), "compile": (120, 10), "ipc": (45, 10), "copy_rate": (30, 10),
             "bitwise": (120, 30), "sweep": (120, 20), "real_nccl": (180, 10), "processes": (90, 40)}
MIN_STEP = (10.0, 3.0)     # a step that would start with less than this is skipped (GPU, simulator)
RESERVE = (5.0, 1.0)       # kept back for the last report
DRY_RUN_SCALE = 8          # --dry-run: the budget divided by this
HANG_HOOK = "NCCLLAB_GPUCHECK_HANG"   # tests: the step named here hangs (with a child of its own)
LL128_OFF_NOTE = ("NCCL disables LL128 here: tuning.cc (2.28.9 and 2.30.7 alike) turns it on by itself only when "
                  "the inter-node path is at most PXN on sm90 (PXB otherwise) and the intra-node one at most NVB; "
                  "these ranks reach each other over NET/Socket, so the row was not run")


# --- helpers --------------------------------------------------------------------------------------------------
def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


class Result(dict):
    """A step's entry, saved to its file after every row, so that a killed step keeps what it had."""

    def __init__(self, path: Path | None):
        super().__init__()
        self.path = path

    def save(self) -> None:
        if self.path is not None:
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self, indent=1, default=str))
            os.replace(tmp, self.path)

    def row(self, key: str, row: dict) -> None:
        self.setdefault(key, []).append(row)
        self.save()


def _session_members(sid: int) -> list[int]:
    """Every process whose session is ``sid`` (from /proc: the fields after the command name are state, parent,
    group, session)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == sid:
                found.append(int(entry))
    return found


def kill_tree(p: subprocess.Popen) -> None:
    """SIGKILL the child, its process group and, when it leads a session (a step), every process of that session
    (the groups its own children lead included), then reap it."""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for pid in _session_members(p.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    p.wait()


def run_group(cmds: list[list[str]], envs: list[dict], deadline: float, logdir: Path, cwd: Path | None = None,
              new_session: bool = False) -> tuple[list[int | None], list[str], bool]:
    """Start every command at once (each leading a process group of its own, or a session with
    ``new_session``: a step; output to a file) and wait for all of them against one shared deadline; past it,
    kill every child with all it started and wait for each.  Returns the exit codes (never None: every child is
    reaped), the outputs, and whether the deadline passed."""
    logdir.mkdir(parents=True, exist_ok=True)
    procs, files = [], []
    for i, (cmd, env) in enumerate(zip(cmds, envs)):
        f = open(logdir / f"child{i}.log", "w+")
        files.append(f)
        where = {"start_new_session": True} if new_session else {"process_group": 0}
        procs.append(subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, cwd=cwd, **where))
    end, timed_out = time.monotonic() + deadline, False
    try:
        for p in procs:
            try:
                p.wait(timeout=max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
                break
    finally:
        for p in procs:  # a timed-out group, a child left behind by an exception here, and what they started
            if p.poll() is None:
                kill_tree(p)
            else:
                _kill_leftovers(p.pid, new_session)
    outs = []
    for f in files:
        f.seek(0)
        outs.append(f.read())
        f.close()
    return [p.returncode for p in procs], outs, timed_out


def _kill_leftovers(pid: int, session: bool) -> None:
    """A finished child's group (and session, for a step) may still hold processes it started: end them too."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for member in _session_members(pid) if session else ():
        try:
            os.kill(member, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


# --- 1. environment -------------------------------------------------------------------------------------------
def step_environment(dev, args, out: Path, res: Result) -> None:
    res.update({"python": platform.python_version(), "platform": platform.platform(), "numpy": np.__version__,
                "numba": _version("numba"), "numba-cuda": _version("numba-cuda"), "cupy": _version("cupy-cuda12x"),
                "cuda-bindings": _version("cuda-bindings"), "torch": _version("torch"), "device": dev.name,
                "CUDA_DEVICE_MAX_CONNECTIONS": os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS", "unset (8)"),
                "NUMBA_CACHE_DIR": os.environ.get("NUMBA_CACHE_DIR", "")})
    if not dev.is_gpu:
        res["gpu"] = NO_GPU
    else:  # pragma: no cover - needs a GPU
        import cupy as cp
        props = cp.cuda.runtime.getDeviceProperties(0)
        res["gpu"] = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        res["sm_count"] = int(props["multiProcessorCount"])
        res["compute_capability"] = f"{props['major']}.{props['minor']}"
        res["memory_gib"] = round(props["totalGlobalMem"] / 2**30, 1)
        res["driver"] = cp.cuda.runtime.driverGetVersion()
        res["cuda_runtime"] = cp.cuda.runtime.runtimeGetVersion()
        if shutil.which("nvidia-smi"):
            q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                               capture_output=True, text=True, timeout=20)
            res["nvidia_smi"] = q.stdout.strip()
    torch = _torch() if dev.is_gpu else None
    if torch is not None:  # pragma: no cover - needs a GPU
        res["nccl"] = ".".join(str(v) for v in _nccl_version(torch))
        res["torch_cuda"] = torch.version.cuda
    else:
        res["nccl"] = NO_GPU if not dev.is_gpu else "skipped: torch with CUDA not installed"
    res["status"] = "ok"


def _nccl_version(torch) -> tuple:
    v = torch.cuda.nccl.version()
    if isinstance(v, int):  # old torch: 2.x.y as 2xxyy / 2xyy
        return (v // 10000, v // 100 % 100, v % 100) if v >= 10000 else (v // 1000, v // 100 % 10, v % 100)
    return tuple(int(x) for x in v[:3])


# --- 2. compile ---------------------------------------------------------------------------------------------
def kernel_variants(small: bool) -> list[tuple[str, str, str]]:
    """(func, dtype, proto) of every kernel the bitwise matrix and the sweep launch: float32 for the reductions,
    bytes for AllGather/Broadcast, float16 and bfloat16 AllReduce (not in --small)."""
    dtypes = [("AllReduce", "float32"), ("AllGather", "uint8")]
    if not small:
        dtypes += [("AllReduce", "float16"), ("AllReduce", "bfloat16")]
    return [(f, d, p) for f, d in dtypes for p in PROTOS]


def _np_dtype(name: str):
    if name == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def compile_one(spec: str, result: Path) -> int:  # pragma: no cover - needs a GPU
    """``--compile-one func,dtype,proto``: compile that kernel (or load it from the cache) for the argument types
    a launch passes, and check that 4 ranks x 16 channels of it can be resident at once."""
    func, dtype, proto = spec.split(",")
    res, t0 = Result(result), time.monotonic()
    res.update({"kernel": spec})
    try:
        from collectives.device.backend import get_device
        from collectives.device.cuda.threads import ThreadComm
        from collectives.perf.threads_runner import schedule
        dev = get_device("cuda")
        comm = ThreadComm(4, 16, dev)
        xs = [np.zeros(1 << 22, _np_dtype(dtype))] * 4  # numpy: cupy has no bfloat16 (staged as its bits)
        launch = comm.prepare(func, xs, schedule(comm, func, xs, proto))
        comm.rank_args(launch)  # compiles, then occupancy.check_launch (raises the one-line refusal)
        res.update(launch.residency, nthreads=launch.nthreads, status="ok",
                   fits=f"4 ranks x {launch.nch} channels resident at once")
    except Exception as exc:
        res["status"] = f"failed: {_first_line(exc)}"
    res["seconds"] = round(time.monotonic() - t0, 1)
    res.save()
    return 0


def step_compile(dev, args, out: Path, res: Result) -> None:
    if not dev.is_gpu:
        res["status"] = "skipped: the simulator compiles nothing (its kernels run as Python)"
        return
    variants = kernel_variants(args.small)  # pragma: no cover - needs a GPU
    tmp = out / "steps" / "compile"
    tmp.mkdir(parents=True, exist_ok=True)
    cmds = [[sys.executable, __file__, str(out), "--compile-one", ",".join(v), "--result", str(tmp / f"{i}.json")]
            for i, v in enumerate(variants)]
    t0 = time.monotonic()
    rcs, outs, _ = run_group(cmds, [dict(os.environ)] * len(cmds), DEADLINES["compile"][0], tmp)
    for i, v in enumerate(variants):
        f = tmp / f"{i}.json"
        row = json.loads(f.read_text()) if f.exists() else {"kernel": ",".join(v), "status":
                                                             f"failed: rc {rcs[i]}: {outs[i].strip()[-300:]}"}
        res.row("kernels", row)
    bad = [r["kernel"] for r in res["kernels"] if r.get("status") != "ok"]
    res["seconds_parallel"] = round(time.monotonic() - t0, 1)
    res["status"] = "ok" if not bad else f"failed: {len(bad)} of {len(variants)} kernels ({', '.join(bad)})"


# --- 3. IPC and cuMem between two processes ------------------------------------------------------------------
_IPC_CHILD = r"""
import sys, cupy as cp
handle = bytes.fromhex(sys.stdin.readline().strip())
ptr = cp.cuda.runtime.ipcOpenMemHandle(handle)
mem = cp.cuda.MemoryPointer(cp.cuda.UnownedMemory(ptr, 4096, None), 0)
a = cp.ndarray((1024,), cp.float32, mem)
ok = bool(cp.all(a == cp.arange(1024, dtype=cp.float32)))
a *= 2
cp.cuda.runtime.deviceSynchronize()
cp.cuda.runtime.ipcCloseMemHandle(ptr)
print("ok" if ok else "bad")
"""

# cuda-bindings returns a tuple from every driver call: (CUresult,) when the call has no output, (CUresult, value)
# with one, (CUresult, v1, v2, ...) with several; chk checks that and unwraps it.  Both the probe and its peer
# process map a cuMem allocation the same way (cu_mem_map_and_set_access)
_CHK = r"""
def chk(cu, r, what):
    if not isinstance(r, tuple) or not r:
        raise RuntimeError(f"{what}: unexpected return {r!r}")
    if r[0] != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{what}: {r[0]}")
    return None if len(r) == 1 else r[1] if len(r) == 2 else r[1:]


def cu_mem_map_and_set_access(cu, va, size, handle):  # NCCL's ncclCuMemMapAndSetAccess, on device 0
    chk(cu, cu.cuMemMap(va, size, 0, handle, 0), "cuMemMap")
    acc = cu.CUmemAccessDesc()
    acc.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    acc.location.id = 0
    acc.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    chk(cu, cu.cuMemSetAccess(va, size, [acc], 1), "cuMemSetAccess")
"""

_CUMEM_CHILD = _CHK + r"""
import socket, sys
from cuda.bindings import driver as cu
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect("\0" + sys.argv[1])  # the abstract namespace: no path, so no 108-byte limit
msg, fds, _, _ = socket.recv_fds(s, 64, 1)
size = int(msg.decode())
chk(cu, cu.cuInit(0), "cuInit")
dev = chk(cu, cu.cuDeviceGet(0), "cuDeviceGet")
chk(cu, cu.cuCtxSetCurrent(chk(cu, cu.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")), "cuCtxSetCurrent")
h = chk(cu, cu.cuMemImportFromShareableHandle(
    fds[0], cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR), "cuMemImportFromShareableHandle")
va = chk(cu, cu.cuMemAddressReserve(size, 0, 0, 0), "cuMemAddressReserve")
cu_mem_map_and_set_access(cu, va, size, h)
chk(cu, cu.cuMemsetD32(va, 0x1234ABCD, size // 4), "cuMemsetD32")
chk(cu, cu.cuCtxSynchronize(), "cuCtxSynchronize")
s.sendall(b"ok")
"""


def step_ipc(dev, args, out: Path, res: Result) -> None:
    if not dev.is_gpu:
        res.update(ipc=NO_GPU, cumem=NO_GPU, status=NO_GPU)
        return
    try:  # pragma: no cover - needs a GPU
        res["ipc"] = _ipc_probe()
    except Exception as exc:  # pragma: no cover - needs a GPU
        res["ipc"] = f"failed: {_first_line(exc)}"
    res.save()
    res["cumem"] = _cumem_probe()  # never raises: its failure is its own line  # pragma: no cover - needs a GPU
    res["status"] = "ok" if all(str(res[k]).startswith(("ok", "skipped")) for k in ("ipc", "cumem")) else \
        "failed: " + "; ".join(f"{k}: {res[k]}" for k in ("ipc", "cumem") if not str(res[k]).startswith("ok"))


def _ipc_probe() -> str:  # pragma: no cover - needs a GPU
    import cupy as cp
    a = cp.arange(1024, dtype=cp.float32)
    cp.cuda.runtime.deviceSynchronize()
    handle = cp.cuda.runtime.ipcGetMemHandle(a.data.ptr)
    try:
        p = subprocess.run([sys.executable, "-c", _IPC_CHILD], input=bytes(handle).hex() + "\n", capture_output=True,
                           text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return "failed: the peer process did not finish in 30 s"
    doubled = bool(cp.all(a == 2 * cp.arange(1024, dtype=cp.float32)))
    return ("ok: the peer process read our buffer and wrote into it (P2P/IPC)" if p.stdout.strip() == "ok" and doubled
            else f"failed: {(p.stdout + p.stderr).strip()[-300:]}")


def _cumem_probe(timeout: float = 30.0) -> str:
    """A cuMem allocation exported as a POSIX fd, sent over an AF_UNIX socket, imported, mapped and written by a
    peer process, then read back here (NCCL's ``P2P/CUMEM``).  Returns one line; never raises."""
    try:
        from cuda.bindings import driver as cu
    except ImportError:
        return "skipped: cuda-bindings (cuda.bindings) not installed"
    ns: dict = {}
    exec(_CHK, ns)
    chk, cu_mem_map_and_set_access = ns["chk"], ns["cu_mem_map_and_set_access"]
    child, srv = None, None
    try:
        chk(cu, cu.cuInit(0), "cuInit")
        dev = chk(cu, cu.cuDeviceGet(0), "cuDeviceGet")
        chk(cu, cu.cuCtxSetCurrent(chk(cu, cu.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")),
            "cuCtxSetCurrent")
        prop = cu.CUmemAllocationProp()
        prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = 0
        prop.requestedHandleTypes = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        minimum = cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM
        size = int(chk(cu, cu.cuMemGetAllocationGranularity(prop, minimum), "cuMemGetAllocationGranularity"))
        handle = chk(cu, cu.cuMemCreate(size, prop, 0), "cuMemCreate")
        fd = int(chk(cu, cu.cuMemExportToShareableHandle(
            handle, cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
            "cuMemExportToShareableHandle"))
        name = f"nccllab-cumem-{os.getpid()}-{time.monotonic_ns()}"
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        srv.bind("\0" + name)
        srv.listen(1)
        srv.settimeout(timeout)
        child = subprocess.Popen([sys.executable, "-c", _CUMEM_CHILD, name], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, process_group=0)
        conn, _ = srv.accept()
        socket.send_fds(conn, [str(size).encode()], [fd])
        conn.settimeout(timeout)
        reply = conn.recv(16)
        conn.close()
        child.wait(timeout)
        va = chk(cu, cu.cuMemAddressReserve(size, 0, 0, 0), "cuMemAddressReserve")
        cu_mem_map_and_set_access(cu, va, size, handle)
        host = np.zeros(size // 4, np.uint32)
        chk(cu, cu.cuMemcpyDtoH(host.ctypes.data, va, size), "cuMemcpyDtoH")
        if reply == b"ok" and np.all(host == 0x1234ABCD):
            return "ok: a cuMem allocation exported as a POSIX fd, imported and written by the peer (P2P/CUMEM)"
        return f"failed: the peer replied {reply!r}; {(child.stderr.read() if child.stderr else '')[-300:]}"
    except Exception as exc:
        tail = ""
        if child is not None and child.poll() is not None and child.stderr:
            tail = " (peer: " + child.stderr.read().strip()[-200:] + ")"
        return f"failed: {_first_line(exc)}{tail}"
    finally:
        if srv is not None:
            srv.close()
        if child is not None:
            if child.poll() is None:
                kill_tree(child)
            for f in (child.stdout, child.stderr):
                if f:
                    f.close()


# --- 4. copy rate ---------------------------------------------------------------------------------------------
def step_copy_rate(dev, args, out: Path, res: Result) -> None:
    if not dev.is_gpu:
        res["status"] = NO_GPU
        return
    import cupy as cp  # pragma: no cover - needs a GPU
    nbytes = (64 if args.small else 1024) << 20
    src, dst = cp.ones(nbytes, cp.uint8), cp.empty(nbytes, cp.uint8)
    for _ in range(2):
        dst.data.copy_from_device(src.data, nbytes)
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    reps = 10
    start.record()
    for _ in range(reps):
        dst.data.copy_from_device(src.data, nbytes)
    stop.record()
    stop.synchronize()
    secs = cp.cuda.get_elapsed_time(start, stop) / 1e3
    res.update(status="ok", bytes=nbytes, GBps=round(nbytes * reps / secs / 1e9, 1),
               note="bytes copied per second by cudaMemcpy device to device (each byte read once, written once)")


# --- 5. bitwise matrix ----------------------------------------------------------------------------------------
def _inputs(rng, n, count, dtype):
    return [(rng.standard_normal(count) * 8).astype(np.float32).astype(dtype) for _ in range(n)]


def step_bitwise(dev, args, out: Path, res: Result) -> None:
    import ml_dtypes
    from collectives.perf.colls import COLLECTIVES
    from collectives.device.common import CollectiveError
    from collectives.device.cuda.threads import ThreadComm
    from collectives.perf.runner import count_wrong
    from collectives.perf.threads_runner import config_of, schedule
    nch = 1 if args.small else 2
    ns = (2,) if args.small else (2, 4)
    counts = (1001,) if args.small else (0, 1001, 3000, (1 << 20) + 5, (8 << 20) + 3)
    res.update(status="running", channels=nch, counts=list(counts), ranks=list(ns), wrong=0)
    for n in ns:
        comm = ThreadComm(n, nch, dev)
        rng = np.random.default_rng(n)
        for func, algo in [(f, "Ring") for f in RING_FUNCS] + [("AllReduce", "Tree")]:
            for proto in PROTOS:
                halves = [np.float16, ml_dtypes.bfloat16] if func == "AllReduce" and not args.small else []
                for dtype in [np.float32] + halves:
                    wrong, elems, error, t0 = 0, 0, "", time.monotonic()
                    # half types: the reference's ml_dtypes arithmetic is slow, so not the 8 Mi-element count
                    for i, count in enumerate(counts if dtype == np.float32 else counts[:4]):
                        root = i % n
                        xs = _inputs(rng, n, count * n if func == "ReduceScatter" else count, dtype)
                        try:
                            plan = schedule(comm, func, xs, proto, algo)
                            outs = comm.run(func, xs, plan, root=root)
                        except CollectiveError as exc:  # the connections' steps are lost: start afresh
                            error, wrong = str(exc), wrong + 1
                            comm = ThreadComm(n, nch, dev)
                            break
                        for r in range(n):
                            want = COLLECTIVES[func].reference(xs, r, "sum", root,
                                                               **config_of(comm, plan))
                            if want is None:  # Reduce leaves a non-root's output alone
                                wrong += int(np.any(outs[r].view(np.uint8) != 0xA5))
                                continue
                            elems += want.size
                            wrong += count_wrong(outs[r], want)
                    res["wrong"] += wrong
                    res.row("rows", {"n": n, "func": func, "algo": algo, "proto": proto,
                                     "dtype": np.dtype(dtype).name, "elements": elems, "wrong": wrong,
                                     "seconds": round(time.monotonic() - t0, 2), **({"error": error} if error else {})})
    res["status"] = "ok" if res["wrong"] == 0 else "failed"


# --- 6. busbw sweep -------------------------------------------------------------------------------------------
def step_sweep(dev, args, out: Path, res: Result) -> None:
    from collectives.device.cuda.threads import ThreadComm
    from collectives.perf.threads_runner import schedule
    if args.small:
        sizes, ll_sizes, nch, reps, ns = [4096], [1024], 1, 1, (2,)
    else:  # pragma: no cover - needs a GPU
        sizes, ll_sizes, nch, reps, ns = [1 << s for s in range(16, 31, 2)], [1 << s for s in range(10, 17, 2)], \
            16, 5, (2, 4)
    copy = _report_entry(out, "copy_rate")
    res.update(status="running", channels=nch, ranks=list(ns),
               timing=("kernel time from CUDA events: per launch, the shortest of the ranks' kernels (the last "
                       "rank to start finds its peers waiting), averaged over the repetitions" if dev.is_gpu else
                       "simulator: wall times of Python threads, not GPU times"),
               bound_note=("busbw bound = copy rate / N: the N ranks share one GPU's memory, and every byte a ring "
                           "moves is at least one read and one write of it"))
    if copy.get("GBps"):
        res["bound_GBps"] = {str(n): round(copy["GBps"] / n, 1) for n in ns}
    for n in ns:
        comm = ThreadComm(n, nch, dev)

        def timed(nbytes: int, proto: str, reps: int = reps) -> float:
            if dev.is_gpu:  # pragma: no cover - needs a GPU
                xs = [dev.cp.ones(nbytes // 4, dev.cp.float32) for _ in range(n)]  # made on the device
            else:
                xs = [dev.to_device(np.ones(nbytes // 4, np.float32)) for _ in range(n)]
            launch = comm.prepare("AllReduce", xs, schedule(comm, "AllReduce", xs, proto))
            launch()  # warm-up (and the compiled kernel's load from the cache)
            if dev.is_gpu:  # pragma: no cover - needs a GPU
                return launch.kernel_seconds(reps)
            t0 = time.perf_counter()
            for _ in range(reps):
                launch()
            return (time.perf_counter() - t0) / reps

        for nbytes in sizes:
            row = {"n": n, "bytes": nbytes}
            for proto in PROTOS:
                if proto == "LL" and nbytes > (256 << 20):
                    continue  # LL moves twice the bytes: 256 MiB shows its curve
                t = timed(nbytes, proto)
                algbw = nbytes / t / 1e9
                row[proto] = {"us": round(t * 1e6, 1), "busbw": round(algbw * 2 * (n - 1) / n, 2)}
            res.row("ring", row)
        for nbytes in ll_sizes:  # latency: more repetitions on a GPU
            many = reps if args.small else reps * 4
            ll, simple = timed(nbytes, "LL", many), timed(nbytes, "Simple", many)
            res.row("ll_vs_simple", {"n": n, "bytes": nbytes, "LL_us": round(ll * 1e6, 1),
                                     "Simple_us": round(simple * 1e6, 1), "LL_faster": bool(ll < simple)})
    if "bound_GBps" in res:
        big = [r for r in res["ring"] if r["n"] == max(ns) and r["bytes"] == max(sizes)]
        if big:
            res["largest_simple_fraction_of_bound"] = round(big[0]["Simple"]["busbw"] /
                                                            res["bound_GBps"][str(max(ns))], 3)
    res["status"] = "ok"


def _report_entry(out: Path, name: str) -> dict:
    try:
        return json.loads((out / "gpu_check.json").read_text()).get(name, {})
    except (OSError, ValueError):
        return {}


# --- 7. real NCCL ---------------------------------------------------------------------------------------------
_NCCL_WORKER = r"""
import json, os, sys, time, numpy as np, torch, torch.distributed as dist
rank, world, d, mode = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), sys.argv[1], sys.argv[2]
torch.cuda.set_device(0)
dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda:0"))
if mode == "check":
    for name in sorted(f for f in os.listdir(d) if f.startswith(f"in_r{rank}_")):
        x = torch.from_numpy(np.load(os.path.join(d, name))).cuda()
        dist.all_reduce(x)
        torch.cuda.synchronize()
        np.save(os.path.join(d, name.replace("in_", "out_")), x.cpu().numpy())
else:  # time: NCCL's own choices, nccl-tests' way (warm-up, then iterations between two barriers)
    rows = []
    for nbytes in json.loads(sys.argv[3]):
        x = torch.ones(nbytes // 4, dtype=torch.float32, device="cuda")
        iters = 20 if nbytes <= (16 << 20) else 5
        for _ in range(2):
            dist.all_reduce(x)
        torch.cuda.synchronize(); dist.barrier(); torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        rows.append([nbytes, (time.perf_counter() - t0) / iters])
    if rank == 0:
        json.dump(rows, open(os.path.join(d, "times.json"), "w"))
dist.destroy_process_group()
"""


def nccl_env(n: int, port: int, multi: bool, extra: dict) -> list[dict]:
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(n), **extra}
    if multi:
        env["NCCL_MULTI_RANK_GPU_ENABLE"] = "1"
    else:
        env.update(NCCL_SOCKET_IFNAME="lo", NCCL_IB_DISABLE="1")
    envs = []
    for r in range(n):
        e = {**env, "RANK": str(r)}
        if not multi:  # separate "nodes": NCCL's duplicate-GPU check passes, NET/Socket on loopback
            e["NCCL_HOSTID"] = f"gpucheck-node{r}"
        envs.append(e)
    return envs


def nccl_config_rows(n: int, algo: str, proto: str, counts, nch: int, version: tuple, multi: bool, port: int,
                     logdir: Path, deadline: float, worker: str = _NCCL_WORKER) -> list[dict]:
    """One forced configuration of real NCCL on this GPU: n rank processes all-reduce the same inputs; the rows
    compare every rank's output bit for bit with ``collectives.perf.reference`` for the rings and trees in its log.
    The n processes share one deadline (a hung group costs ``deadline``, not n times it); a group that fails or
    times out gives one row saying so, and no output of it is read."""
    from collectives.perf import reference
    from collectives.perf.runner import count_wrong
    from tracing import nccl_log
    tag = f"n{n}_{algo}_{proto}"
    with tempfile.TemporaryDirectory() as d:
        rng = np.random.default_rng(port)
        inputs = {c: _inputs(rng, n, c, np.float32) for c in counts}
        for c, xs in inputs.items():
            for r, x in enumerate(xs):
                np.save(os.path.join(d, f"in_r{r}_{c:012d}.npy"), x)
        extra = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,GRAPH,TUNING,ENV", "NCCL_ALGO": algo,
                 "NCCL_PROTO": proto, "NCCL_MIN_NCHANNELS": str(nch), "NCCL_MAX_NCHANNELS": str(nch),
                 "NCCL_DEBUG_FILE": str(logdir / f"{tag}.%h.%p.log")}
        envs = nccl_env(n, port, multi, extra)
        t0 = time.monotonic()
        rcs, outs, timed_out = run_group([[sys.executable, "-c", worker, d, "check"]] * n, envs, deadline,
                                         Path(d) / "logs")
        seconds = round(time.monotonic() - t0, 1)
        if timed_out or any(rcs):
            status = f"timed out after {deadline:g} s (every rank killed)" if timed_out else "failed"
            return [{"config": tag, "status": status, "rc": rcs, "seconds": seconds,
                     "output": "\n".join(o.strip()[-400:] for o in outs)[-1200:]}]
        text = "".join(f.read_text(errors="replace") for f in sorted(logdir.glob(f"{tag}.*.log")))
        log = nccl_log.parse(text)
        rings = [log.rings[c] for c in sorted(log.rings)] or None
        trees = [log.trees[c] for c in sorted(log.trees)] or None
        types = sorted(set(re.findall(r"Pattern \d+, crossNic \d+.*?type (\d+)/(\d+)", text)))
        rows = []
        for c, xs in inputs.items():
            want = reference.all_reduce(xs, rings=rings, nchannels=nch, proto=proto, algo=algo, trees=trees,
                                        nccl_version=version)
            got = [np.load(os.path.join(d, f"out_r{r}_{c:012d}.npy")) for r in range(n)]
            wrong = [count_wrong(g, want) for g in got]
            rows.append({"config": tag, "count": c, "status": "equal" if not any(wrong) else "differ",
                         "wrong_per_rank": wrong, "rings": rings, "log_channels": len(log.rings),
                         "graph_type_inter_intra": types, "seconds": seconds})
        return rows


def nccl_busbw(n: int, sizes: list[int], multi: bool, port: int, deadline: float,
               worker: str = _NCCL_WORKER) -> dict:
    """NCCL's own AllReduce busbw on this GPU, its default algorithm, protocol and channels."""
    with tempfile.TemporaryDirectory() as d:
        rcs, outs, timed_out = run_group([[sys.executable, "-c", worker, d, "time", json.dumps(sizes)]] * n,
                                         nccl_env(n, port, multi, {}), deadline, Path(d) / "logs")
        f = Path(d) / "times.json"
        if timed_out or any(rcs) or not f.exists():
            return {"n": n, "status": "timed out" if timed_out else f"failed: rc {rcs}",
                    "output": "\n".join(o.strip()[-300:] for o in outs)[-900:]}
        rows = [{"bytes": b, "us": round(t * 1e6, 1), "busbw": round(b / t / 1e9 * 2 * (n - 1) / n, 2)}
                for b, t in json.loads(f.read_text())]
        return {"n": n, "status": "ok", "rows": rows}


def step_real_nccl(dev, args, out: Path, res: Result) -> None:
    torch = _torch() if dev.is_gpu else None
    if torch is None:
        res["status"] = NO_GPU if not dev.is_gpu else "skipped: torch with CUDA not installed"
        return
    version = _nccl_version(torch)  # pragma: no cover - needs a GPU
    multi = version >= (2, 30)
    configs = [("Ring", "Simple"), ("Ring", "LL"), ("Tree", "Simple"), ("Tree", "LL"), ("Ring", "LL128"),
               ("Tree", "LL128")]
    if args.small:
        configs = configs[:2]
    counts, nch = (1001, (1 << 20) + 5), 2
    port = 29500 + os.getpid() % 1000
    logdir = out / "nccl_logs"
    logdir.mkdir(exist_ok=True)
    res.update(status="running", nccl=".".join(map(str, version)),
               mode="NCCL_MULTI_RANK_GPU_ENABLE=1" if multi else "per-rank NCCL_HOSTID over NET/Socket (loopback)",
               reference_follows="2.28 channel split" if version < (2, 29) else "2.30")
    sizes = [1 << s for s in range(20, 31, 2)] if multi else [1 << s for s in range(20, 27, 2)]
    # NCCL's own N=4 curve (the plot's other half), the forced configurations, then its N=2 curve: each saved as
    # it comes, so a step cut short keeps the most of what it was for
    port += 1
    res.row("busbw", nccl_busbw(4, sizes, multi, port, 60))
    for n in (2, 4):
        for algo, proto in configs:
            port += 1
            if proto == "LL128" and not multi:
                res.row("rows", {"config": f"n{n}_{algo}_{proto}", "status": "skipped", "note": LL128_OFF_NOTE})
                continue
            for row in nccl_config_rows(n, algo, proto, counts, nch, version, multi, port, logdir, 45):
                res.row("rows", row)
    port += 1
    res.row("busbw", nccl_busbw(2, sizes, multi, port, 60))
    res["status"] = "ok" if all(r["status"] in ("equal", "skipped") for r in res.get("rows", [])) else "failed"


# --- 8. ranks as processes ------------------------------------------------------------------------------------
def step_processes(dev, args, out: Path, res: Result) -> None:
    """The communicator with 2 rank processes on the device (``python -m collectives.ring --device``): P2P/IPC
    between them, its own bitwise check.  On one GPU their persistent kernels time-slice, so this only shows that
    the handle exchange and the kernels work across processes (tiny sizes)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,P2P",
           "NCCL_BUFFSIZE": "65536", "NCCL_LL_BUFFSIZE": "16384"}
    res.update(status="running")
    ok = True
    for coll in ("allreduce",) if args.small else ("allreduce", "allgather"):
        cmd = [sys.executable, "-m", "collectives.ring", "--device", dev.name, "-g", "2", "--coll", coll, "-b", "4K",
               "-e", "4K", "-n", "1", "-w", "0"]
        rcs, outs, timed_out = run_group([cmd], [env], 60, out / "steps" / f"processes_{coll}", cwd=ROOT)
        text = outs[0]
        good = not timed_out and rcs[0] == 0 and "Out of bounds values : 0 OK" in text
        via = sorted({line.split(" via ")[1].strip() for line in text.splitlines() if " via P2P/" in line})
        res.row("rows", {"coll": coll, "rc": rcs[0], "ok": good, "via": via,
                         **({} if good else {"tail": "timed out after 60 s" if timed_out else text.strip()[-400:]})})
        ok &= good
    res["status"] = "ok" if ok else "failed"


STEP_FUNCS = {"environment": step_environment, "compile": step_compile, "ipc": step_ipc,
              "copy_rate": step_copy_rate, "bitwise": step_bitwise, "sweep": step_sweep,
              "real_nccl": step_real_nccl, "processes": step_processes}


# --- a step in its own process ------------------------------------------------------------------------------------
def run_step(args) -> int:
    from collectives.device.backend import get_device
    res = Result(Path(args.result))
    if os.environ.get(HANG_HOOK) == args.step:  # the tests' stuck step: it and a child never end (the child leads
        # a process group of its own, as the steps' own children do: only the session's kill reaches it)
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"], process_group=0)
        res.update(status="running: hangs on purpose", hang_child=child.pid)
        res.save()
        time.sleep(3600)
    try:
        STEP_FUNCS[args.step](get_device(args.device), args, Path(args.outdir), res)
    except Exception as exc:  # one line in the report; the traceback goes to the step's log
        import traceback
        traceback.print_exc()
        res["status"] = f"failed: {_first_line(exc)}"
    res.save()
    return 0


# --- the driver ---------------------------------------------------------------------------------------------------
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir")
    ap.add_argument("--device", choices=("cuda", "cudasim"), default="cuda")
    ap.add_argument("--small", action="store_true", help="tiny sizes (the simulator)")
    ap.add_argument("--budget", type=float, default=360.0, help="seconds for the whole check (default 360)")
    ap.add_argument("--steps", default=",".join(ORDER), help=f"comma-separated, of {', '.join(ORDER)}")
    ap.add_argument("--dry-run", action="store_true",
                    help=f"everything under the simulator, tiny, budget / {DRY_RUN_SCALE}; checks every step reports")
    ap.add_argument("--step", help=argparse.SUPPRESS)          # internal: run this one step here
    ap.add_argument("--compile-one", help=argparse.SUPPRESS)   # internal: compile one kernel variant
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.compile_one:  # pragma: no cover - needs a GPU
        return compile_one(args.compile_one, Path(args.result))
    if args.step:
        return run_step(args)
    steps = [s.strip() for s in args.steps.split(",") if s.strip()]
    unknown = [s for s in steps if s not in ORDER]
    if unknown:
        print(f"gpu_check: unknown step {unknown[0]!r} (--steps: choose from {', '.join(ORDER)})", file=sys.stderr)
        return 2
    if args.dry_run:
        args.device, args.small, args.budget = "cudasim", True, args.budget / DRY_RUN_SCALE
    outdir = Path(args.outdir).resolve()
    outdir.mkdir(parents=True, exist_ok=True)
    # before CUDA starts in any child: the kernel cache here, a hardware queue per rank-thread, short waits (a
    # kernel bug must cost seconds of the GPU's time, not NCCLLAB_TIMEOUT's default two minutes per wait)
    os.environ.setdefault("NUMBA_CACHE_DIR", str(outdir / "numba_cache"))
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")
    os.environ.setdefault("NCCLLAB_TIMEOUT", "10")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))
    from collectives.device.backend import DeviceError, get_device
    try:
        dev = get_device(args.device)  # cudasim: sets NUMBA_ENABLE_CUDASIM for the children too
    except DeviceError as exc:
        print(f"gpu_check: {exc}", file=sys.stderr)
        return 2
    gpu = 0 if dev.is_gpu else 1
    report: dict = {"device": dev.name, "small": args.small, "dry_run": args.dry_run, "budget_s": args.budget,
                    "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "steps": steps}
    (outdir / "steps").mkdir(exist_ok=True)
    t_start = time.monotonic()
    for name in [s for s in ORDER if s in steps]:
        left = args.budget - (time.monotonic() - t_start) - RESERVE[gpu]
        if not dev.is_gpu and name in GPU_ONLY:
            report[name] = {"status": GPU_ONLY[name], "step_seconds": 0.0}
        elif left < MIN_STEP[gpu]:
            report[name] = {"status": f"skipped: budget spent ({time.monotonic() - t_start:.0f} s of "
                                      f"{args.budget:g} s)", "step_seconds": 0.0}
        else:
            report[name] = _run_child(name, args, outdir, min(float(DEADLINES[name][gpu]), left))
        report["elapsed_s"] = round(time.monotonic() - t_start, 1)
        _write_reports(report, outdir)
        print(f"gpu_check: {name}: {_status(report[name])} ({report[name]['step_seconds']} s)", flush=True)
    print((outdir / "gpu_check.txt").read_text())
    if args.dry_run:
        missing = [s for s in steps if "status" not in report.get(s, {})]
        print(f"gpu_check: dry run: {len(steps) - len(missing)} of {len(steps)} steps reported in "
              f"{report['elapsed_s']} s" + (f"; missing: {', '.join(missing)}" if missing else ""))
        return 1 if missing else 0
    failed = [s for s in steps if str(report[s].get("status", "")).startswith(("failed", "timed out"))]
    return 1 if failed else 0


def _run_child(name: str, args, outdir: Path, deadline: float) -> dict:
    """One step in a child process of its own session: its entry, or what it had saved when the deadline came."""
    result = outdir / "steps" / f"{name}.json"
    result.unlink(missing_ok=True)
    cmd = [sys.executable, __file__, str(outdir), "--device", args.device, "--step", name, "--result", str(result)]
    if args.small:
        cmd.append("--small")
    t0 = time.monotonic()
    rcs, outs, timed_out = run_group([cmd], [dict(os.environ)], deadline, outdir / "steps" / name, new_session=True)
    entry = {}
    if result.exists():
        try:
            entry = json.loads(result.read_text())
        except ValueError:
            entry = {}
    if timed_out:
        rows = sum(len(v) for v in entry.values() if isinstance(v, list))
        entry["status"] = (f"timed out after {deadline:.0f} s (its processes killed); "
                           + (f"{rows} row(s) kept" if entry else "nothing saved"))
    elif "status" not in entry or str(entry["status"]).startswith("running"):
        tail = outs[0].strip().splitlines()[-1:] if outs[0].strip() else [f"exit code {rcs[0]}"]
        entry["status"] = f"failed: the step ended without its result ({tail[0][:200]})"
    if not str(entry["status"]).startswith(("ok", "skipped", "equal")) and outs[0].strip():
        entry.setdefault("log_tail", outs[0].strip()[-600:])
    entry["step_seconds"] = round(time.monotonic() - t0, 1)
    return entry


def _status(step: dict) -> str:
    return str(step.get("status", "?"))[:200]


def _write_reports(report: dict, outdir: Path) -> None:
    """The JSON first; the words and the plot can only fail on their own (a step's odd entry must not cost the
    run its report)."""
    (outdir / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str))
    try:
        text = _text(report)
    except Exception as exc:
        text = f"gpu_check: the text report failed ({_first_line(exc)}); gpu_check.json has every entry\n"
    (outdir / "gpu_check.txt").write_text(text)
    if report.get("sweep", {}).get("ring") or report.get("real_nccl", {}).get("busbw"):
        try:
            _plot(report, outdir / "busbw.png")
        except Exception as exc:
            report["plot_error"] = _first_line(exc)
            (outdir / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str))


def _plot(report: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    sweep, nccl = report.get("sweep", {}), report.get("real_nccl", {})
    ns = sorted({r["n"] for r in sweep.get("ring", [])} | {b["n"] for b in nccl.get("busbw", [])
                                                            if b.get("status") == "ok"}) or [2]
    fig, axes = plt.subplots(1, len(ns), figsize=(6 * len(ns), 4), squeeze=False)
    for ax, n in zip(axes[0], ns):
        rows = [r for r in sweep.get("ring", []) if r["n"] == n]
        for proto, style in zip(PROTOS, ("o-", "s-", "^-")):
            pts = [(r["bytes"], r[proto]["busbw"]) for r in rows if proto in r]
            if pts:
                ax.plot(*zip(*pts), style, label=f"lab ring, {proto}")
        bound = sweep.get("bound_GBps", {}).get(str(n))
        if bound:
            ax.axhline(bound, color="gray", ls="--", label=f"copy bound (copy rate / {n})")
        for b in nccl.get("busbw", []):
            if b["n"] == n and b.get("status") == "ok":
                ax.plot([r["bytes"] for r in b["rows"]], [r["busbw"] for r in b["rows"]], "k*-",
                        label=f"NCCL {nccl.get('nccl', '')} (its own choice)")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("bytes per rank")
        ax.set_ylabel("busbw (GB/s)")
        ax.set_title(f"AllReduce, N={n} ranks on one GPU" + ("" if report["device"] == "cuda" else " (simulator)"))
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _text(rep: dict) -> str:
    """The report in words: what was measured, and against what."""
    env = rep.get("environment", {})
    lines = [f"gpu_check ({rep['device']}{', small' if rep['small'] else ''}{', dry run' if rep['dry_run'] else ''}) "
             f"{rep['started']}: {rep.get('elapsed_s', 0)} s of a {rep['budget_s']:g} s budget",
             f"GPU: {env.get('gpu', '-')}  CC {env.get('compute_capability', '-')}  SMs {env.get('sm_count', '-')}  "
             f"driver {env.get('driver', '-')}  CUDA {env.get('cuda_runtime', '-')}  cupy {env.get('cupy', '-')}  "
             f"numba {env.get('numba', '-')}  numba-cuda {env.get('numba-cuda', '-')}  torch {env.get('torch', '-')}"
             f"  NCCL {env.get('nccl', '-')}  "
             f"CUDA_DEVICE_MAX_CONNECTIONS {env.get('CUDA_DEVICE_MAX_CONNECTIONS', '-')}"]
    for name in [s for s in ORDER if s in rep]:
        step = rep[name]
        lines.append(f"[{name}] {step.get('status')} ({step.get('step_seconds', 0)} s)")
        if str(step.get("status", "")).startswith("skipped"):
            continue
        if name == "compile":
            for k in step.get("kernels", []):
                lines.append(f"  {k['kernel']}: {k.get('status')}  {k.get('regs_per_thread', '-')} registers/thread, "
                             f"{k.get('local_bytes_per_thread', '-')} B local, "
                             f"{k.get('blocks_per_sm', '-')} block(s)/SM "
                             f"of {k.get('nthreads', '-')} threads, {k.get('seconds', '-')} s")
        elif name == "ipc":
            lines.append(f"  CUDA IPC: {step.get('ipc', '-')}")
            lines.append(f"  cuMem fd: {step.get('cumem', '-')}")
        elif name == "copy_rate" and "GBps" in step:
            lines.append(f"  {step['GBps']} GB/s: {step.get('note')}")
        elif name == "bitwise":
            lines.append(f"  ranks as threads against collectives.perf.reference, bit for bit: {step.get('wrong', '?')} "
                         f"wrong "
                         f"elements in {len(step.get('rows', []))} configurations (N {step.get('ranks')}, "
                         f"{step.get('channels')} channel(s), counts {step.get('counts')})")
            for r in step.get("rows", []):
                if r["wrong"]:
                    lines.append(f"  WRONG: n={r['n']} {r['func']}/{r['algo']}/{r['proto']} {r['dtype']}: "
                                 f"{r['wrong']} {r.get('error', '')}")
        elif name == "sweep":
            lines.append(f"  Ring AllReduce busbw (GB/s) per size, {step.get('channels')} channel(s); "
                         f"{step.get('timing', '')}")
            lines.append(f"  against the copy bound {step.get('bound_GBps', '(no copy rate)')}: "
                         f"{step.get('bound_note', '')}")
            for r in step.get("ring", []):
                cells = "  ".join(f"{p} {r[p]['busbw']:>7} ({r[p]['us']} us)" for p in PROTOS if p in r)
                lines.append(f"  N={r['n']} {r['bytes']:>11} B  {cells}")
            if "largest_simple_fraction_of_bound" in step:
                lines.append(f"  largest size, Simple: {step['largest_simple_fraction_of_bound']} of the bound")
            for r in step.get("ll_vs_simple", []):
                lines.append(f"  LL against Simple, N={r['n']} {r['bytes']:>7} B: LL {r['LL_us']} us, Simple "
                             f"{r['Simple_us']} us ({'LL faster' if r['LL_faster'] else 'Simple faster'})")
        elif name == "real_nccl":
            lines.append(f"  NCCL {step.get('nccl', '-')} {step.get('mode', '')}: each forced configuration against "
                         f"collectives.perf.reference (rings and trees from its log, {step.get('reference_follows', '-')} "
                         f"split), bit for bit")
            for r in step.get("rows", []):
                lines.append(f"  {r['config']} count {r.get('count', '-')}: {r['status']} "
                             f"{r.get('wrong_per_rank', '')} {r.get('note', '')}".rstrip())
            for b in step.get("busbw", []):
                pts = ", ".join(f"{r['bytes']} B {r['busbw']}" for r in b.get("rows", []))
                lines.append(f"  NCCL's own busbw N={b['n']}: {b.get('status')} {pts}")
        elif name == "processes":
            lines.append("  the communicator, 2 rank processes: " + "; ".join(
                f"{r['coll']} {'ok' if r['ok'] else 'FAILED'} via {', '.join(r.get('via', [])) or '-'}"
                for r in step.get("rows", [])))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
