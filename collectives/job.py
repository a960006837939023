"""A job's ranks: how each finds its place (mpirun, torchrun or our launcher's environment), and how our
launcher starts them (``spawn``, behind ``python -m collectives.tools.launcher`` and the runner's ``-g N``).

How each rank gets its unique id mirrors NCCL's ``ncclGetUniqueId`` (``src/init.cc`` → ``bootstrapGetUniqueId``,
``src/bootstrap.cc``) and its ``NCCL_COMM_ID`` handling: a user's ``NCCL_COMM_ID=host:port`` is never replaced,
and means what it means in NCCL (every rank's id names that address; rank 0 hosts the root there).  Otherwise:

* Under ``mpirun`` (MPICH's ``PMI_RANK``/``PMI_SIZE``, Open MPI's ``OMPI_COMM_WORLD_*``): rank 0 calls
  ``get_unique_id`` and MPI broadcasts it; MPI carries nothing else (this is how nccl-tests uses MPI).
* From ``spawn`` (no mpirun): ``NCCLLAB_RANK``/``NCCLLAB_NRANKS``, and the root address the launcher chose in a
  variable of ours, ``NCCLLAB_COMM_ID`` (with ``NCCLLAB_COMM_MAGIC``); rank 0 hosts the root there.
* Under torchrun (``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT``): ``MASTER_PORT`` is torchrun's own
  store, which already listens there, so nothing of ours binds it.  As ``torch.distributed``'s ``env://`` init
  does (``torch/distributed/rendezvous.py``: ``_env_rendezvous_handler`` → ``_create_c10d_store``), every rank
  opens a ``TCPStore`` on it (a client of the elastic agent's store when ``TORCHELASTIC_USE_AGENT_STORE=True``,
  else rank 0 hosts it); rank 0 puts ``get_unique_id().to_bytes()`` under a key of ours, the others wait for it.
``spawn`` forks its ranks from itself once it has preloaded the lab (``collectives.preload``, ``misc.forked``: a rank
starts in 0.06 s of CPU instead of 0.8 s), or executes each as a new ``python``.  It watches its children: when one
fails it gives the others ``FAILURE_GRACE_S`` to report (their peers' abort flags and closed sockets reach them
within milliseconds), then kills the rest, and finally removes any shared-memory segment of the run that a crash
left in ``/dev/shm``.  On Ctrl-C it prints one line and returns 130.
A rank's uncaught error is one line (``CollectiveError: rank 2: ...``) for the failures we diagnose, a traceback
for anything else, nothing for Ctrl-C; under mpirun the rank then calls ``MPI_Abort``, as nccl-tests does on an
NCCL error, so that every rank ends and MPI cleans up its own shared memory.
"""
from __future__ import annotations

import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from datetime import timedelta
from typing import Callable

from collectives.misc import forked, sockets
from collectives.misc.param import env_int, env_str, timeout_s
from collectives.misc.shm_segment import ShmError, sweep
from collectives.misc.sockets import BootstrapError
from transports.net_plugin import NetError
from transports.p2p import P2PError

from .bootstrap import UniqueId, get_unique_id
from .device.backend import DeviceError
from .device.common import CollectiveError

FAILURE_GRACE_S = 5.0
LATE_CTRL_C_S = 2.0  # after a Ctrl-C has stopped the job, further ones are absorbed this long (spawn)
LAUNCHER_COMM_ID = "NCCLLAB_COMM_ID"  # spawn's root address for its children; NCCL_COMM_ID stays the user's
STORE_KEY = "nccllab/attempt_{attempt}/unique_id/{n}"  # our key in torchrun's store (one per communicator)
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
    if launched():  # this rank is ending: a later Ctrl-C must not interrupt the report or the shutdown after it
        _ignore_sigint()  # (an interactive session goes on after its errors: its Ctrl-C stays as it was)
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


def _ignore_sigint() -> None:
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def _first_interrupt(signum, frame) -> None:
    """SIGINT: the first one ends the rank (KeyboardInterrupt, which the fatal hook keeps silent); those that
    follow are ignored.  A Ctrl-C reaches a rank more than once (the terminal signals the whole process group, our
    launcher forwards it once more, users press twice), and Python handles a later one wherever the main thread
    then is: in ``_fatal_excepthook`` (``Error in sys.excepthook`` and both tracebacks) or in the interpreter's
    shutdown (``Exception ignored in ...``).  Over NET that is likely: the proxy and socket threads share the
    interpreter lock with a 0.2 ms switch interval, which stretches those few lines into milliseconds."""
    _ignore_sigint()
    raise KeyboardInterrupt


def install_fatal_hook() -> None:
    sys.excepthook = _fatal_excepthook
    if threading.current_thread() is not threading.main_thread() or not launched():
        return  # signal handlers belong to the main thread; a process that is no job's rank keeps Python's
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # never replace a handler of the user's
        signal.signal(signal.SIGINT, _first_interrupt)
    if "NCCLLAB_RANK" in os.environ:
        # spawn starts its ranks with SIGINT blocked, so that a Ctrl-C during the imports (a traceback from deep
        # inside numba) waits until here, where the handler above turns it into a silent exit
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _launcher_id() -> UniqueId:
    """The id of a rank started by ``spawn``: the user's ``NCCL_COMM_ID`` (NCCL's meaning), else the launcher's
    address in ``NCCLLAB_COMM_ID``; in both, rank 0's ``Bootstrap`` hosts the root there."""
    if env_str("NCCL_COMM_ID"):
        return get_unique_id()
    addr, magic = env_str(LAUNCHER_COMM_ID), env_str("NCCLLAB_COMM_MAGIC")
    if not addr or not magic:
        raise BootstrapError(f"NCCLLAB_RANK is set but not {LAUNCHER_COMM_ID} and NCCLLAB_COMM_MAGIC (or "
                             "NCCL_COMM_ID): start the ranks with python -m collectives.tools.launcher -g N")
    host, port = sockets.parse_addr(addr)
    return UniqueId(host, port, int(magic, 0))


_store = None  # this process's client of torchrun's store, made once (torch keeps one default store per process)
_store_ids = 0  # communicators that took their id from it: the key's counter, so none reads an earlier one's id


def _torchrun_store(rank: int, nranks: int):
    """``_create_c10d_store`` (``torch/distributed/rendezvous.py``), as ``env://`` calls it with MASTER_ADDR and
    MASTER_PORT: under torchrun's agent (``TORCHELASTIC_USE_AGENT_STORE=True``) every rank is a client of the
    agent's store, which already listens there; otherwise rank 0 hosts a multi-tenant TCPStore there itself."""
    global _store
    if _store is not None:
        return _store
    try:
        from torch.distributed import TCPStore
    except ImportError:
        raise BootstrapError("RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT are set (torchrun's environment), and "
                             "torchrun's store carries the unique id, but torch is not importable: pip install "
                             "torch, or start the ranks with python -m collectives.tools.launcher -g N (or "
                             "mpirun)") from None
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    timeout = timedelta(seconds=timeout_s())
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == str(True)
    try:
        if agent:
            _store = TCPStore(host, port, nranks, is_master=False, timeout=timeout)
        else:
            _store = TCPStore(host, port, nranks, is_master=rank == 0, timeout=timeout, multi_tenant=True)
    except RuntimeError as exc:  # torch's DistNetworkError / DistStoreError; its first line says what
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        who = "torchrun's store" if agent else "the store that rank 0 hosts (torch's env:// rendezvous)"
        raise BootstrapError(f"rank {rank}: {who} at {host}:{port} (MASTER_ADDR:MASTER_PORT): {first}") from None
    return _store


def _store_unique_id(rank: int, nranks: int) -> UniqueId:
    """torch's ProcessGroupNCCL way: rank 0 makes the id (``get_unique_id``: a random magic, a root on a port of
    its own) and sets it in the store; the others wait up to NCCLLAB_TIMEOUT for it.  The key carries torchrun's
    restart count and this process's communicator count, as torch's prefix stores carry the group's name."""
    global _store_ids
    store = _torchrun_store(rank, nranks)
    n, _store_ids = _store_ids, _store_ids + 1
    key = STORE_KEY.format(attempt=os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"), n=n)
    if rank == 0:
        uid = get_unique_id()
        store.set(key, uid.to_bytes())
        return uid
    try:
        raw = store.get(key)
    except RuntimeError:
        where = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
        raise BootstrapError(f"rank {rank}: no unique id under {key} in the store at {where} after "
                             f"{timeout_s():g} s (NCCLLAB_TIMEOUT): rank 0 never made communicator {n}") from None
    return UniqueId.from_bytes(bytes(raw))


def rank_env() -> tuple[UniqueId, int, int]:
    """(unique id, nranks, rank) for this process from its environment."""
    install_fatal_hook()
    if "NCCLLAB_RANK" in os.environ:
        rank, nranks = int(os.environ["NCCLLAB_RANK"]), int(os.environ["NCCLLAB_NRANKS"])
        return _launcher_id(), nranks, rank
    if under_mpirun():
        from mpi4py import MPI
        world = MPI.COMM_WORLD
        uid = get_unique_id().to_bytes() if world.rank == 0 else None
        uid = world.bcast(uid, root=0)
        _unlink_mpi_segments()  # every rank is past MPI_Init, which maps them: see below
        return UniqueId.from_bytes(uid), world.size, world.rank
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        rank, nranks = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        if env_str("NCCL_COMM_ID"):
            return get_unique_id(), nranks, rank  # NCCL's: each rank's id names that address, no store needed
        missing = [v for v in ("MASTER_ADDR", "MASTER_PORT") if not env_str(v)]
        if missing:
            raise BootstrapError(f"RANK and WORLD_SIZE are set but not {' and '.join(missing)}: run under "
                                 "torchrun, which sets all four, or set NCCL_COMM_ID=host:port")
        return _store_unique_id(rank, nranks), nranks, rank
    raise RuntimeError("no launcher environment: run under mpirun, or use collectives.job.spawn")


def _ephemeral_low() -> int:
    """The bottom of the kernel's ephemeral port range (``ip_local_port_range``), 32768 if unknown."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _free_port(addr: str) -> int:
    """A port for rank 0 to host the root on, free now.  Below the ephemeral range: the port is released before
    rank 0 binds it, and in that gap any connection's automatic source port (every rank's bootstrap and NET
    sockets) could take one from the ephemeral range (CI once saw "Address already in use"); nothing the kernel
    assigns comes from below it.  Falls back to an ephemeral one when none there is free."""
    low = _ephemeral_low()
    rng = random.Random()
    for port in rng.sample(range(max(1024, low - 12288), low), k=min(64, max(0, low - 1024))):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((addr, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def _root_address() -> str:
    """Where spawn's rank 0 will host the root: the interface the ranks themselves pick (``get_unique_id``'s
    choice), since they no longer see an ``NCCL_COMM_ID`` on loopback's subnet; if none fits, loopback, and the
    ranks report the interface problem themselves."""
    try:
        return sockets.find_interface()[1]
    except BootstrapError:
        return "127.0.0.1"


def _stop(procs: list) -> None:
    """Ctrl-C: SIGINT to each rank still running (a rank run by itself, or signalled alone, needs it), then
    ``FAILURE_GRACE_S`` for all of them to end before the rest are killed."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
    end = time.monotonic() + FAILURE_GRACE_S
    for p in procs:
        try:
            p.wait(timeout=max(0.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _absorbing(previous: Callable, until: float) -> Callable:
    """A SIGINT handler that ignores Ctrl-C until ``until`` (monotonic), then puts ``previous`` back and calls it."""
    def handler(signum, frame):
        if time.monotonic() >= until:
            signal.signal(signal.SIGINT, previous)
            previous(signum, frame)
    return handler


def spawn(nranks: int, argv: list[str], env: dict | None = None, nodes: int = 1,
          preload: Callable[[], None] | None = None) -> int:
    """Run ``python argv...`` as ``nranks`` local ranks; return the first non-zero exit code (or 0; 130 after
    Ctrl-C).  With ``nodes > 1`` the ranks are split into that many contiguous blocks, each with its own
    ``NCCL_HOSTID``, so one machine plays several nodes (NET between them, SHM inside).  The root's address goes
    to the ranks in ``NCCLLAB_COMM_ID``: a user's ``NCCL_COMM_ID`` reaches them untouched, and wins.
    ``preload`` (``collectives.preload``): called once here, then each rank is forked from this process
    (``misc.forked``) instead of executed, unless ``env`` is given (what the preload read at import would be this
    process's environment, not the ranks'), ``NCCLLAB_FORK_RANKS=0``, or ``forked.can_fork`` says no."""
    magic = secrets.randbits(48) | 1
    base = dict(os.environ if env is None else env)
    addr = _root_address()
    base.update({LAUNCHER_COMM_ID: f"{addr}:{_free_port(addr)}", "NCCLLAB_NRANKS": str(nranks),
                 "NCCLLAB_COMM_MAGIC": hex(magic)})
    interrupted: list = []
    try:  # Ctrl-C sets a flag that the loop reads: no KeyboardInterrupt can cut the launcher short halfway
        previous = signal.signal(signal.SIGINT, lambda signum, frame: interrupted.append(signum))
        previous = signal.default_int_handler if previous is None else previous  # None: set outside Python
    except ValueError:  # not the main thread: Ctrl-C stays the caller's
        previous = None
    procs = []
    rc, first_failure = 0, None
    grace = FAILURE_GRACE_S
    try:
        fork = preload is not None and env is None and env_int("NCCLLAB_FORK_RANKS", 1) != 0 and forked.can_fork(argv)
        if fork:  # (a Ctrl-C meanwhile sets the flag: no rank starts)
            inherited = forked.open_fds()  # before the preload: its own descriptors (if any) are the ranks' too
            preload()
            fork = forked.can_fork(argv)  # still one thread
        # The ranks start with SIGINT blocked (the mask survives fork and exec); install_fatal_hook unblocks it.
        old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            for r in range(0 if interrupted else nranks):
                extra = {"NCCL_HOSTID": node_hostid(r, nranks, nodes)} if nodes > 1 else {}
                child_env = {**base, "NCCLLAB_RANK": str(r), **extra}
                procs.append(forked.fork_python(argv, child_env, inherited) if fork
                             else subprocess.Popen([sys.executable, *argv], env=child_env))
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        while any(p.returncode is None for p in procs) and not interrupted:
            for p in procs:
                if p.returncode is None and p.poll() is not None and p.returncode != 0:
                    if p.returncode == -signal.SIGINT:  # a rank interrupted alone: the job is interrupted
                        interrupted.append(signal.SIGINT)
                    elif first_failure is None:
                        first_failure, rc = time.monotonic(), p.returncode
            if first_failure is not None and time.monotonic() - first_failure > grace:
                for p in procs:
                    if p.poll() is None:
                        p.kill()
            time.sleep(0.005)
        if interrupted:
            _stop(procs)
            os.write(2, f"interrupted: {nranks} ranks stopped\n".encode())
            return rc or 130
    finally:
        for p in procs:  # an exception of the launcher's own: no rank outlives it
            if p.poll() is None:
                p.kill()
                p.wait()
        sweep(f"{magic:012x}"[-12:])
        if previous is not None:
            # After a Ctrl-C more may follow at once (the terminal signals the whole group at each press, users
            # press twice; forked ranks end within the 20 ms between two): Python's default handler would turn the
            # one line above into a traceback, so for LATE_CTRL_C_S they are absorbed, as a rank ignores those after
            # its first (_first_interrupt); then Ctrl-C is the caller's again.  A handler of the caller's own returns.
            late = bool(interrupted) and previous is signal.default_int_handler
            signal.signal(signal.SIGINT, _absorbing(previous, time.monotonic() + LATE_CTRL_C_S) if late else previous)
    return rc or next((p.returncode for p in procs if p.returncode), 0)
