"""Starting ranks: read mpirun/torchrun/launcher environments, or spawn local ranks ourselves.

* Under ``mpirun`` (MPICH's ``PMI_RANK``/``PMI_SIZE``, Open MPI's ``OMPI_COMM_WORLD_*``): rank 0 calls
  ``get_unique_id`` and MPI broadcasts it; MPI carries nothing else (this is how nccl-tests uses MPI).
* From ``spawn`` (no mpirun): ``NCCLLAB_RANK``/``NCCLLAB_NRANKS`` and ``NCCL_COMM_ID=127.0.0.1:port``; rank 0
  hosts the bootstrap root at that address (NCCL's ``NCCL_COMM_ID`` behaviour).
* torchrun style: ``RANK``/``WORLD_SIZE`` with ``MASTER_ADDR``/``MASTER_PORT`` as the root address.
``spawn`` watches its children: when one fails it gives the others ``FAILURE_GRACE_S`` to report (their peers'
abort flags and closed sockets reach them within milliseconds), then kills the rest, and finally removes any
shared-memory segment of the run that a crash left in ``/dev/shm``.
A rank's uncaught error is one line (``CollectiveError: rank 2: ...``) for the failures we diagnose, a traceback
for anything else; under mpirun the rank then calls ``MPI_Abort``, as nccl-tests does on an NCCL error, so that
every rank ends and MPI cleans up its own shared memory.
"""
from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import traceback

from transports.net_plugin import NetError
from transports.p2p import P2PError
from misc.shm_segment import ShmError, sweep

from .bootstrap import UniqueId, get_unique_id
from .device.backend import DeviceError
from .device.common import CollectiveError
from misc.sockets import BootstrapError

FAILURE_GRACE_S = 5.0
# their message names rank, peer and state (or the device and what it lacks): one line
REPORTED = (CollectiveError, BootstrapError, NetError, ShmError, DeviceError, P2PError)


def job_size() -> int | None:
    """The number of ranks mpirun (or torchrun) started, read from its environment; None when not launched so."""
    for var in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "WORLD_SIZE"):
        if os.environ.get(var, "").isdigit() and "NCCLLAB_RANK" not in os.environ:
            return int(os.environ[var])
    return None


def job_rank() -> int:
    for var in ("NCCLLAB_RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "RANK"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


def node_hostid(rank: int, nranks: int, nodes: int) -> str:
    """The emulated node of a rank: contiguous blocks of ranks, one ``NCCL_HOSTID`` per block."""
    return f"nccllab-node{rank * nodes // nranks}"


def emulated_node(nodes: int) -> None:
    """Under mpirun or torchrun, ``--nodes K`` sets this rank's ``NCCL_HOSTID`` as ``spawn`` does for its children."""
    size = job_size()
    if nodes > 1 and size:
        os.environ["NCCL_HOSTID"] = node_hostid(job_rank(), size, nodes)


def memory_available() -> int:
    """``MemAvailable`` from /proc/meminfo in bytes (0 when unknown)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def under_mpirun() -> bool:
    return "PMI_RANK" in os.environ or "OMPI_COMM_WORLD_RANK" in os.environ or "PMIX_RANK" in os.environ


def launched() -> bool:
    """True when this process is one rank of a job (mpirun, our spawn, or torchrun)."""
    return under_mpirun() or "NCCLLAB_RANK" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ)


def _fatal_excepthook(exc_type, exc, tb) -> None:
    """A rank's uncaught error: one line (or a traceback for a bug) in one ``write``, so that the reports of several
    ranks never interleave; under mpirun, then ``MPI_Abort`` so that no rank waits for this one forever."""
    secondary = getattr(exc, "secondary", False)
    if issubclass(exc_type, KeyboardInterrupt) or secondary:
        text = ""  # Ctrl-C: the launcher says it once; a peer's failure: that peer says it
    elif issubclass(exc_type, REPORTED):
        text = f"{exc_type.__name__}: {exc}\n"
    else:
        text = "".join(traceback.format_exception(exc_type, exc, tb))
    if text:
        os.write(2, text.encode(errors="replace"))
    if under_mpirun() and not issubclass(exc_type, KeyboardInterrupt):
        mpi = sys.modules.get("mpi4py.MPI")
        if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
            _unlink_mpi_segments()
            # let the rank that knows print its line and abort first; that rank waits a moment too, because
            # mpirun's proxy can kill every rank and exit before it has forwarded the line just written
            time.sleep(1.0 if secondary else 0.2)
            mpi.COMM_WORLD.Abort(1)


def _unlink_mpi_segments() -> None:
    """Unlink the ``/dev/shm/mpich_shm_*`` files this process maps.  MPICH (5.0, from pip) leaves them behind when
    a job ends by ``MPI_Abort`` or when mpirun SIGKILLs its ranks.  Once every local rank has mapped them (the end
    of ``MPI_Init``) their names are no longer needed, the rule our own segments follow: the mappings live on."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split(None, 5)[5].strip() for line in f if "/dev/shm/mpich_shm" in line}
    except (OSError, IndexError):
        return
    for path in paths:
        try:
            os.unlink(path.removesuffix(" (deleted)"))
        except OSError:
            pass


def install_fatal_hook() -> None:
    sys.excepthook = _fatal_excepthook


def rank_env() -> tuple[UniqueId, int, int]:
    """(unique id, nranks, rank) for this process from its environment."""
    install_fatal_hook()
    if "NCCLLAB_RANK" in os.environ:
        rank, nranks = int(os.environ["NCCLLAB_RANK"]), int(os.environ["NCCLLAB_NRANKS"])
        return get_unique_id(), nranks, rank
    if under_mpirun():
        from mpi4py import MPI
        world = MPI.COMM_WORLD
        uid = get_unique_id().to_bytes() if world.rank == 0 else None
        uid = world.bcast(uid, root=0)
        _unlink_mpi_segments()  # every rank is past MPI_Init, which maps them: see below
        return UniqueId.from_bytes(uid), world.size, world.rank
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("NCCL_COMM_ID", f"{addr}:{os.environ.get('MASTER_PORT', '29500')}")
        return get_unique_id(), int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    raise RuntimeError("no launcher environment: run under mpirun, or use collectives.launch.spawn")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(nranks: int, argv: list[str], env: dict | None = None, nodes: int = 1) -> int:
    """Run ``python argv...`` as ``nranks`` local ranks; return the first non-zero exit code (or 0).  With
    ``nodes > 1`` the ranks are split into that many contiguous blocks, each with its own ``NCCL_HOSTID``, so one
    machine plays several nodes (NET between them, SHM inside)."""
    magic = secrets.randbits(48) | 1
    base = dict(os.environ if env is None else env)
    base.update(NCCL_COMM_ID=f"127.0.0.1:{_free_port()}", NCCLLAB_NRANKS=str(nranks),
                NCCLLAB_COMM_MAGIC=hex(magic))
    procs = []
    for r in range(nranks):
        extra = {"NCCL_HOSTID": node_hostid(r, nranks, nodes)} if nodes > 1 else {}
        procs.append(subprocess.Popen([sys.executable, *argv], env={**base, "NCCLLAB_RANK": str(r), **extra}))
    rc, first_failure = 0, None
    grace = FAILURE_GRACE_S
    try:
        while any(p.returncode is None for p in procs):
            for p in procs:
                if p.returncode is None and p.poll() is not None and p.returncode != 0 and first_failure is None:
                    first_failure, rc = time.monotonic(), p.returncode
            if first_failure is not None and time.monotonic() - first_failure > grace:
                for p in procs:
                    if p.poll() is None:
                        p.kill()
            time.sleep(0.005)
    except KeyboardInterrupt:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        for p in procs:
            p.wait()
        print(f"interrupted: {nranks} ranks stopped", file=sys.stderr)
        rc = rc or 130
    finally:
        sweep(f"{magic:012x}"[-12:])
    return rc or next((p.returncode for p in procs if p.returncode), 0)


def main(argv: list[str] | None = None) -> int:
    """``python -m collectives.launch -g N [--nodes K] script.py args...``: run a script as N local ranks, as
    mpirun would; in it, ``collectives.Communicator()`` finds its rank in the environment."""
    import argparse
    p = argparse.ArgumentParser(prog="python -m collectives.launch", description=main.__doc__.split(":", 1)[1].strip(),
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("-g", "--nranks", "-n", dest="nranks", type=int, default=2, help="ranks to start")
    p.add_argument("--nodes", type=int, default=1, help="emulated nodes (per-rank NCCL_HOSTID): NET between them")
    p.add_argument("script", help="the Python script every rank runs")
    p.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    a = p.parse_args(argv)
    if a.nranks < 1 or not 1 <= a.nodes <= a.nranks:
        print(f"python -m collectives.launch: need -g >= 1 and 1 <= --nodes <= -g (got -g {a.nranks} --nodes "
              f"{a.nodes})", file=sys.stderr)
        return 2
    if not os.path.isfile(a.script):
        print(f"python -m collectives.launch: {a.script}: no such file", file=sys.stderr)
        return 2
    return spawn(a.nranks, [a.script, *a.args], nodes=a.nodes)


if __name__ == "__main__":
    sys.exit(main())
