"""One command for a GPU machine: ``python scripts/gpu_check.py OUTDIR [--device cuda|cudasim] [--small]``.

In order, each step's result going into ``OUTDIR/gpu_check.json`` as soon as it is known (so a later crash keeps
the earlier ones), then ``OUTDIR/gpu_check.txt`` (a short report) and ``OUTDIR/busbw.png``:

1. environment: GPU, driver, CUDA, cupy, numba / numba-cuda, torch and its NCCL (``torch.cuda.nccl.version()``);
2. CUDA IPC between two processes (cupy's ``ipcGetMemHandle`` / ``ipcOpenMemHandle``, NCCL's ``P2P/IPC``) and
   cuMem handles passed as POSIX file descriptors (cuda-python, NCCL's ``P2P/CUMEM``);
3. the device-to-device copy rate;
4. the bitwise matrix: ranks as threads (``collectives/gpu_threads.py``), N = 2 and 4, the five ring
   collectives and Tree AllReduce, Simple and LL, against ``collectives.reference``; then the communicator with
   2 rank processes (``python -m collectives.ring --device``: P2P/IPC, the runner's own bitwise check);
5. the busbw sweep of Ring AllReduce (1 MiB .. 1 GiB, N = 2 and 4) with the copy-rate bound, and LL against Simple
   below 64 KiB;
6. real NCCL (torch.distributed, N = 2 and 4 rank processes on the one GPU) on the same inputs, forced
   NCCL_ALGO / NCCL_PROTO / NCCL_MIN,MAX_NCHANNELS, NCCL_DEBUG=INFO logged, compared bitwise with the reference
   for the rings, trees and NCCL version its log reports.

``--device cudasim --small`` runs everything that does not need a GPU in numba's simulator (tiny sizes) and
records the rest as "skipped: no GPU"; the CI runs that form.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
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


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


# --- 1. environment -------------------------------------------------------------------------------------------
def environment(dev) -> dict:
    env = {"python": platform.python_version(), "platform": platform.platform(), "numpy": np.__version__,
           "numba": _version("numba"), "numba-cuda": _version("numba-cuda"), "cupy": _version("cupy-cuda12x"),
           "cuda-python": _version("cuda-python"), "torch": _version("torch"), "device": dev.name}
    if not dev.is_gpu:
        env["gpu"] = NO_GPU
    else:
        import cupy as cp
        props = cp.cuda.runtime.getDeviceProperties(0)
        env["gpu"] = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        env["sm_count"] = int(props["multiProcessorCount"])
        env["memory_gib"] = round(props["totalGlobalMem"] / 2**30, 1)
        env["driver"] = cp.cuda.runtime.driverGetVersion()
        env["cuda_runtime"] = cp.cuda.runtime.runtimeGetVersion()
        if shutil.which("nvidia-smi"):
            q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                               capture_output=True, text=True, timeout=30)
            env["nvidia_smi"] = q.stdout.strip()
    torch = _torch()
    if torch is not None:
        env["nccl"] = ".".join(str(v) for v in _nccl_version(torch))
        env["torch_cuda"] = torch.version.cuda
    else:
        env["nccl"] = NO_GPU if env["torch"] != "not installed" or not dev.is_gpu else "skipped: torch not installed"
    return env


def _nccl_version(torch) -> tuple:
    v = torch.cuda.nccl.version()
    if isinstance(v, int):  # old torch: 2.x.y as 2xxyy / 2xyy
        return (v // 10000, v // 100 % 100, v % 100) if v >= 10000 else (v // 1000, v // 100 % 10, v % 100)
    return tuple(int(x) for x in v[:3])


# --- 2. IPC and cuMem between two processes ------------------------------------------------------------------
_IPC_CHILD = r"""
import sys, cupy as cp, numpy as np
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

_CUMEM_CHILD = r"""
import socket, sys
from cuda.bindings import driver as cu
def chk(r):
    err = r[0] if isinstance(r, tuple) else r
    if err != cu.CUresult.CUDA_SUCCESS:
        raise SystemExit(f"cuda error {err}")
    return r[1:] if isinstance(r, tuple) and len(r) > 2 else (r[1] if isinstance(r, tuple) and len(r) == 2 else None)
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.connect(sys.argv[1])
msg, fds, _, _ = socket.recv_fds(s, 64, 1)
size = int(msg.decode())
chk(cu.cuInit(0)); dev = chk(cu.cuDeviceGet(0)); ctx = chk(cu.cuDevicePrimaryCtxRetain(dev)); chk(cu.cuCtxSetCurrent(ctx))
h = chk(cu.cuMemImportFromShareableHandle(fds[0], cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
va = chk(cu.cuMemAddressReserve(size, 0, 0, 0))
chk(cu.cuMemMap(va, size, 0, h, 0))
acc = cu.CUmemAccessDesc(); acc.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE; acc.location.id = 0
acc.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
chk(cu.cuMemSetAccess(va, size, [acc], 1))
chk(cu.cuMemsetD32(va, 0x1234ABCD, size // 4)); chk(cu.cuCtxSynchronize())
s.sendall(b"ok")
"""


def ipc_probe(dev, outdir: Path) -> dict:
    if not dev.is_gpu:
        return {"ipc": NO_GPU, "cumem": NO_GPU}
    import cupy as cp
    res = {}
    a = cp.arange(1024, dtype=cp.float32)
    cp.cuda.runtime.deviceSynchronize()
    handle = cp.cuda.runtime.ipcGetMemHandle(a.data.ptr)
    p = subprocess.run([sys.executable, "-c", _IPC_CHILD], input=bytes(handle).hex() + "\n", capture_output=True,
                       text=True, timeout=120)
    doubled = bool(cp.all(a == 2 * cp.arange(1024, dtype=cp.float32)))
    res["ipc"] = ("ok: the peer process read our buffer and wrote into it (P2P/IPC)"
                  if p.stdout.strip() == "ok" and doubled else f"failed: {(p.stdout + p.stderr).strip()[-300:]}")
    res["cumem"] = _cumem_probe(outdir)
    return res


def _cumem_probe(outdir: Path) -> str:
    try:
        from cuda.bindings import driver as cu
    except ImportError:
        return "skipped: cuda-python (cuda.bindings) not installed"
    import socket

    def chk(r):
        if r[0] != cu.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuda error {r[0]}")
        return r[1] if len(r) == 2 else r[1:]

    chk((cu.cuInit(0), None))
    dev = chk(cu.cuDeviceGet(0))
    chk((cu.cuCtxSetCurrent(chk(cu.cuDevicePrimaryCtxRetain(dev)))[0], None))
    prop = cu.CUmemAllocationProp()
    prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = 0
    prop.requestedHandleTypes = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    gran = chk(cu.cuMemGetAllocationGranularity(
        prop, cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM))
    size = int(gran)
    handle = chk(cu.cuMemCreate(size, prop, 0))
    fd = chk(cu.cuMemExportToShareableHandle(
        handle, cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0))
    path = str(outdir / "cumem.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)
    child = subprocess.Popen([sys.executable, "-c", _CUMEM_CHILD, path], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        srv.settimeout(60)
        conn, _ = srv.accept()
        socket.send_fds(conn, [str(size).encode()], [int(fd)])
        conn.settimeout(60)
        reply = conn.recv(16)
        child.wait(60)
    finally:
        srv.close()
        os.unlink(path)
        if child.poll() is None:
            child.kill()
    va = chk(cu.cuMemAddressReserve(size, 0, 0, 0))
    chk((cu.cuMemMap(va, size, 0, handle, 0)[0], None))
    acc = cu.CUmemAccessDesc()
    acc.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    acc.location.id = 0
    acc.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    chk((cu.cuMemSetAccess(va, size, [acc], 1)[0], None))
    host = np.zeros(size // 4, np.uint32)
    chk((cu.cuMemcpyDtoH(host.ctypes.data, va, size)[0], None))
    if reply == b"ok" and np.all(host == 0x1234ABCD):
        return "ok: a cuMem allocation exported as a POSIX fd, imported and written by the peer (P2P/CUMEM)"
    return f"failed: {(child.stderr.read() if child.stderr else '')[-300:]}"


# --- 3. copy rate ---------------------------------------------------------------------------------------------
def copy_rate(dev, small: bool) -> dict:
    if not dev.is_gpu:
        return {"status": NO_GPU}
    import cupy as cp
    nbytes = (64 if small else 1024) << 20
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
    return {"status": "ok", "bytes": nbytes, "GBps": round(nbytes * reps / secs / 1e9, 1),
            "note": "bytes copied per second (each byte read once and written once)"}


# --- 4. bitwise matrix ----------------------------------------------------------------------------------------
def _inputs(rng, n, count, dtype):
    return [(rng.standard_normal(count) * 8).astype(np.float32).astype(dtype) for _ in range(n)]


def bitwise_matrix(dev, small: bool) -> dict:
    import ml_dtypes
    from collectives.device.common import CollectiveError
    from collectives.gpu_threads import ThreadComm
    from collectives.colls import COLLECTIVES
    from collectives.perf import count_wrong
    from collectives.perf_threads import reference_config
    nch = 1 if small else 2
    counts = (0, 1001, 3000) if small else (0, 1001, 3000, (1 << 20) + 5, (8 << 20) + 3)
    rows, wrong_total = [], 0
    for n in (2, 4):
        comm = ThreadComm(n, nch, dev)
        rng = np.random.default_rng(n)
        for func, algo in [(f, "Ring") for f in RING_FUNCS] + [("AllReduce", "Tree")]:
            for proto in ("Simple", "LL"):
                halves = [np.float16, ml_dtypes.bfloat16] if func == "AllReduce" and not small else []
                dtypes = [np.float32] + halves
                for dtype in dtypes:
                    wrong, elems = 0, 0
                    t0 = time.monotonic()
                    error = ""
                    for i, count in enumerate(counts):
                        root = i % n
                        xs = _inputs(rng, n, count * n if func == "ReduceScatter" else count, dtype)
                        try:
                            outs = comm.run(func, xs, proto=proto, algo=algo, root=root)
                        except CollectiveError as exc:  # the connections' steps are lost: start afresh
                            error, wrong = str(exc), wrong + 1
                            comm = ThreadComm(n, nch, dev)
                            break
                        for r in range(n):
                            want = COLLECTIVES[func].reference(xs, r, "sum", root,
                                                               **reference_config(comm, proto, algo))
                            got = outs[r]
                            if want is None:
                                wrong += int(np.any(got.view(np.uint8) != 0xA5))
                                continue
                            elems += want.size
                            wrong += count_wrong(got, want)
                    wrong_total += wrong
                    rows.append({"n": n, "func": func, "algo": algo, "proto": proto,
                                 "dtype": np.dtype(dtype).name, "elements": elems, "wrong": wrong,
                                 "seconds": round(time.monotonic() - t0, 2), **({"error": error} if error else {})})
    return {"status": "ok" if wrong_total == 0 else "failed", "wrong": wrong_total, "channels": nch,
            "counts": list(counts), "rows": rows}


# --- 5. busbw sweep -------------------------------------------------------------------------------------------
def sweep(dev, small: bool, copy: dict, outdir: Path) -> dict:
    from collectives.gpu_threads import ThreadComm
    if small:
        sizes, ll_sizes, nch, reps = [4096, 16384], [1024, 4096], 1, 1
    else:
        sizes, ll_sizes, nch, reps = [1 << s for s in range(20, 31, 2)], [1 << s for s in range(10, 17, 2)], 16, 5
    res = {"status": "ok", "channels": nch, "ring": [], "ll_vs_simple": [],
           "note": "simulator: times are not GPU times" if not dev.is_gpu else ""}
    for n in (2, 4):
        comm = ThreadComm(n, nch, dev)

        def timed(nbytes, proto):
            xs = [dev.to_device(np.ones(nbytes // 4, np.float32)) for _ in range(n)]
            launch = comm.prepare("AllReduce", xs, proto=proto)
            launch()  # warm-up (and compilation)
            t0 = time.perf_counter()
            for _ in range(reps):
                launch()
            return (time.perf_counter() - t0) / reps

        for nbytes in sizes:
            t = timed(nbytes, "Simple")
            algbw = nbytes / t / 1e9
            res["ring"].append({"n": n, "bytes": nbytes, "us": round(t * 1e6, 1), "algbw": round(algbw, 2),
                                "busbw": round(algbw * 2 * (n - 1) / n, 2)})
        for nbytes in ll_sizes:
            res["ll_vs_simple"].append({"n": n, "bytes": nbytes, "LL_us": round(timed(nbytes, "LL") * 1e6, 1),
                                        "Simple_us": round(timed(nbytes, "Simple") * 1e6, 1)})
    bound = copy.get("GBps")
    res["bound_note"] = ("busbw bound = copy rate / N: the N ranks share one GPU's memory, and every byte a ring "
                         "moves is at least one read and one write of it")
    if bound:
        res["bound_GBps"] = {n: round(bound / n, 1) for n in (2, 4)}
        big = [r for r in res["ring"] if r["n"] == 4 and r["bytes"] == max(sizes)]
        if big:
            res["n4_largest_fraction_of_bound"] = round(big[0]["busbw"] / (bound / 4), 3)
    _plot(res, outdir / "busbw.png", dev.is_gpu)
    return res


def _plot(res: dict, path: Path, gpu: bool) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    for n, color in ((2, "tab:blue"), (4, "tab:orange")):
        rows = [r for r in res["ring"] if r["n"] == n]
        ax.plot([r["bytes"] for r in rows], [r["busbw"] for r in rows], "o-", color=color,
                label=f"lab GPU ring AllReduce, N={n}")
        if "bound_GBps" in res:
            ax.axhline(res["bound_GBps"][n], color=color, ls="--", label=f"copy-rate bound / {n}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("bytes per rank")
    ax.set_ylabel("busbw (GB/s)")
    ax.set_title("Ring AllReduce, ranks as threads on one GPU" + ("" if gpu else " (simulator: not GPU times)"))
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --- 6. real NCCL ---------------------------------------------------------------------------------------------
_NCCL_WORKER = r"""
import os, sys, numpy as np, torch, torch.distributed as dist
rank, world, d = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), sys.argv[1]
torch.cuda.set_device(0)
dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda:0"))
for name in sorted(f for f in os.listdir(d) if f.startswith(f"in_r{rank}_")):
    x = torch.from_numpy(np.load(os.path.join(d, name))).cuda()
    dist.all_reduce(x)
    torch.cuda.synchronize()
    np.save(os.path.join(d, name.replace("in_", "out_")), x.cpu().numpy())
dist.destroy_process_group()
"""


def real_nccl(dev, small: bool, outdir: Path) -> dict:
    torch = _torch() if dev.is_gpu else None
    if torch is None:
        return {"status": NO_GPU if not dev.is_gpu else "skipped: torch with CUDA not installed"}
    from collectives import reference
    from collectives.perf import count_wrong
    from tracing import nccl_log
    version = _nccl_version(torch)
    multi = version >= (2, 30)
    configs = [("Ring", "Simple"), ("Ring", "LL"), ("Ring", "LL128"), ("Tree", "Simple"), ("Tree", "LL")]
    if small:
        configs = configs[:2]
    counts = (1001, (1 << 20) + 5)
    nch = 2
    rows, port = [], 29500 + os.getpid() % 1000
    logdir = outdir / "nccl_logs"
    logdir.mkdir(exist_ok=True)
    for n in (2, 4):
        for algo, proto in configs:
            port += 1
            tag = f"n{n}_{algo}_{proto}"
            with tempfile.TemporaryDirectory() as d:
                rng = np.random.default_rng(port)
                inputs = {c: _inputs(rng, n, c, np.float32) for c in counts}
                for c, xs in inputs.items():
                    for r, x in enumerate(xs):
                        np.save(os.path.join(d, f"in_r{r}_{c:012d}.npy"), x)
                env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(n),
                       "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,GRAPH,TUNING,ENV",
                       "NCCL_ALGO": algo, "NCCL_PROTO": proto, "NCCL_MIN_NCHANNELS": str(nch),
                       "NCCL_MAX_NCHANNELS": str(nch), "NCCL_DEBUG_FILE": str(logdir / f"{tag}.%h.%p.log")}
                if multi:
                    env["NCCL_MULTI_RANK_GPU_ENABLE"] = "1"
                else:
                    env.update(NCCL_SOCKET_IFNAME="lo", NCCL_IB_DISABLE="1")
                procs = []
                for r in range(n):
                    e = {**env, "RANK": str(r)}
                    if not multi:  # separate "nodes": NCCL's duplicate-GPU check passes, NET/Socket on loopback
                        e["NCCL_HOSTID"] = f"gpucheck-node{r}"
                    procs.append(subprocess.Popen([sys.executable, "-c", _NCCL_WORKER, d], env=e,
                                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
                outs = []
                for p in procs:
                    try:
                        outs.append(p.communicate(timeout=180)[0])
                    except subprocess.TimeoutExpired:
                        p.kill()
                        outs.append("timeout")
                if any(p.returncode for p in procs):
                    rows.append({"config": tag, "status": "failed", "output": "\n".join(outs)[-800:]})
                    continue
                text = "".join(f.read_text(errors="replace") for f in sorted(logdir.glob(f"{tag}.*.log")))
                log = nccl_log.parse(text)
                rings = [log.rings[c] for c in sorted(log.rings)] or None
                trees = [log.trees[c] for c in sorted(log.trees)] or None
                for c, xs in inputs.items():
                    want = reference.all_reduce(xs, rings=rings, nchannels=nch, proto=proto, algo=algo,
                                                trees=trees, nccl_version=version)
                    got = [np.load(os.path.join(d, f"out_r{r}_{c:012d}.npy")) for r in range(n)]
                    wrong = [count_wrong(g, want) for g in got]
                    rows.append({"config": tag, "count": c, "status": "equal" if not any(wrong) else "differ",
                                 "wrong_per_rank": wrong, "rings": rings, "log_channels": len(log.rings)})
    return {"status": "ok" if all(r["status"] == "equal" for r in rows) else "failed",
            "nccl": ".".join(map(str, version)),
            "mode": "NCCL_MULTI_RANK_GPU_ENABLE=1" if multi else "per-rank NCCL_HOSTID over NET/Socket (loopback)",
            "reference_follows": "2.28 channel split" if version < (2, 29) else "2.30", "rows": rows}


# --- 4b. ranks as processes --------------------------------------------------------------------------------------
def processes(dev) -> dict:
    """The communicator with 2 rank processes on the device (``python -m collectives.ring --device``): P2P/IPC
    between them, its own bitwise check.  On one GPU their persistent kernels time-slice, so this only shows that
    the handle exchange and the kernels work across processes (tiny sizes)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,P2P",
           "NCCL_BUFFSIZE": "65536", "NCCL_LL_BUFFSIZE": "16384"}
    rows, ok = [], True
    for coll in ("allreduce", "allgather"):
        cmd = [sys.executable, "-m", "collectives.ring", "--device", dev.name, "-g", "2", "--coll", coll, "-b", "4K",
               "-e", "4K", "-n", "1", "-w", "0"]
        try:
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=150, cwd=ROOT)
            out = p.stdout + p.stderr
            good = p.returncode == 0 and "Out of bounds values : 0 OK" in out
            via = sorted({line.split(" via ")[1].strip() for line in out.splitlines() if " via P2P/" in line})
            rows.append({"coll": coll, "rc": p.returncode, "ok": good, "via": via,
                         **({} if good else {"tail": out.strip()[-400:]})})
        except subprocess.TimeoutExpired:
            good = False
            rows.append({"coll": coll, "ok": False, "tail": "timed out after 150 s"})
        ok &= good
    return {"status": "ok" if ok else "failed", "rows": rows}


# --- driver ---------------------------------------------------------------------------------------------------
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir")
    ap.add_argument("--device", choices=("cuda", "cudasim"), default="cuda")
    ap.add_argument("--small", action="store_true", help="tiny sizes (the simulator, CI)")
    args = ap.parse_args(argv)
    # a kernel bug must cost seconds of the GPU's time, not NCCLLAB_TIMEOUT's default two minutes per wait
    os.environ.setdefault("NCCLLAB_TIMEOUT", "20")
    from collectives.device.backend import DeviceError, get_device
    try:
        dev = get_device(args.device)
    except DeviceError as exc:
        print(f"gpu_check: {exc}", file=sys.stderr)
        return 2
    outdir = Path(args.outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    report: dict = {"device": dev.name, "small": args.small, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                        time.gmtime())}
    steps = [("environment", lambda: environment(dev)), ("ipc", lambda: ipc_probe(dev, outdir)),
             ("copy_rate", lambda: copy_rate(dev, args.small)),
             ("bitwise", lambda: bitwise_matrix(dev, args.small)), ("processes", lambda: processes(dev)),
             ("sweep", lambda: sweep(dev, args.small, report.get("copy_rate", {}), outdir)),
             ("real_nccl", lambda: real_nccl(dev, args.small, outdir))]
    for name, step in steps:
        t0 = time.monotonic()
        try:
            report[name] = step()
        except Exception as exc:  # one step's failure is recorded, the others still run
            report[name] = {"status": f"failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
        report[name]["step_seconds"] = round(time.monotonic() - t0, 1)
        (outdir / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str))
        print(f"gpu_check: {name}: {_status(report[name])} ({report[name]['step_seconds']} s)", flush=True)
    (outdir / "gpu_check.txt").write_text(_text(report))
    print((outdir / "gpu_check.txt").read_text())
    failed = [k for k, v in report.items() if isinstance(v, dict) and str(v.get("status", "")).startswith("failed")]
    return 1 if failed else 0


def _status(step: dict) -> str:
    if "status" in step:
        return str(step["status"])
    return "; ".join(f"{k}: {v}" for k, v in step.items() if k != "step_seconds")[:200]


def _text(rep: dict) -> str:
    env = rep["environment"]
    lines = [f"gpu_check ({rep['device']}{', small' if rep['small'] else ''}) {rep['started']}",
             f"GPU: {env.get('gpu')}  driver {env.get('driver', '-')}  CUDA {env.get('cuda_runtime', '-')}  "
             f"cupy {env.get('cupy')}  numba {env.get('numba')}  numba-cuda {env.get('numba-cuda')}  "
             f"torch {env.get('torch')}  NCCL {env.get('nccl')}",
             f"IPC: {rep['ipc'].get('ipc', rep['ipc'].get('status'))}; cuMem: {rep['ipc'].get('cumem', '-')}",
             "copy rate: " + (f"{rep['copy_rate']['GBps']} GB/s" if "GBps" in rep["copy_rate"]
                              else str(rep["copy_rate"].get("status")))]
    b = rep["bitwise"]
    lines.append(f"bitwise (ranks as threads, {b.get('channels')} channel(s)): {b.get('status')}, "
                 f"{b.get('wrong', '?')} wrong elements in {len(b.get('rows', []))} configurations")
    for r in b.get("rows", []):
        if r["wrong"]:
            lines.append(f"  WRONG: n={r['n']} {r['func']}/{r['algo']}/{r['proto']} {r['dtype']}: {r['wrong']} "
                         f"{r.get('error', '')}")
    pr = rep.get("processes", {})
    lines.append(f"ranks as processes (the communicator, 2 ranks): {pr.get('status')} "
                 + "; ".join(f"{r['coll']} {'ok' if r['ok'] else 'FAILED'} via {', '.join(r.get('via', [])) or '-'}"
                             for r in pr.get("rows", [])))
    s = rep["sweep"]
    lines.append(f"busbw sweep: {s.get('status')} {s.get('note', '')}")
    for r in s.get("ring", []):
        lines.append(f"  N={r['n']} {r['bytes']:>11} B  {r['us']:>10} us  busbw {r['busbw']} GB/s")
    if "bound_GBps" in s:
        lines.append(f"  bound (copy rate / N): {s['bound_GBps']}; N=4 largest size at "
                     f"{s.get('n4_largest_fraction_of_bound')} of it")
    for r in s.get("ll_vs_simple", []):
        lines.append(f"  N={r['n']} {r['bytes']:>7} B  LL {r['LL_us']} us  Simple {r['Simple_us']} us")
    nc = rep["real_nccl"]
    lines.append(f"real NCCL: {nc.get('status')} {nc.get('nccl', '')} {nc.get('mode', '')} "
                 f"(reference follows {nc.get('reference_follows', '-')})")
    for r in nc.get("rows", []):
        lines.append(f"  {r['config']} count {r.get('count', '-')}: {r['status']} {r.get('wrong_per_rank', '')}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
