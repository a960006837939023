"""Ranks forked from a launcher that has already imported what they run: ``fork_python(argv, env)`` starts what
``python argv...`` would start, as a child that runs ``argv`` in the interpreter it inherits, and ``Forked`` watches
that child the way ``subprocess.Popen`` watches a program it executed.

NCCL starts no processes (mpirun, torchrun or the user does, each rank a fresh program), so nothing here mirrors
NCCL.  Our launcher (``collectives.job.spawn``) starts its own ranks, and on this lab's 2-core machine a fresh
interpreter cost each rank about 0.8 s of CPU before its first collective: 0.2 s for numpy and our modules, 0.3 s
for importing numba, 0.25 s for numba's first dispatch.  Eight ranks on two cores waited seconds for that.  So a
launcher that has done it once (``collectives.preload``) forks its ranks from itself, as a fork server does
(Python's ``multiprocessing`` forkserver with ``set_forkserver_preload``, Android's zygote).  A forked rank is a
process like an executed one, with its own memory, pid, signals and exit status; what it imported is there already.

What the child does, as ``python argv...`` would: it takes the rank's environment, Python's default SIGINT handler
and the signal mask it was forked with, and a fresh seed for numpy's global generator (``random`` reseeds itself,
and so do our per-process caches: ``tracing.debug``'s state and ``NCCL_DEBUG_FILE``, ``misc.param``'s logged
variables, by ``os.register_at_fork``); it closes the launcher's inherited descriptors (``close_fds``, as Popen
does); it sets ``sys.argv`` and ``sys.path[0]`` (the script's folder, or the working folder for ``-m``) and runs the
script or module as ``__main__`` (``runpy``); an uncaught exception goes to ``sys.excepthook`` and exit status 1,
``SystemExit`` gives its code, an uncaught KeyboardInterrupt ends the process by SIGINT.  Then, as the interpreter's
own shutdown does, it waits for non-daemon threads, runs the ``atexit`` functions, drops the script's namespace (a
file left open is flushed and closed), flushes stdout and stderr, and exits.  Unlike an executed rank, its command
line (``ps``) is the launcher's, and so is the rest of its interpreter: the modules imported, ``sys.path`` past its
first entry.
"""
from __future__ import annotations

import atexit
import fcntl
import gc
import os
import runpy
import signal
import subprocess
import sys
import threading
import time
import traceback
from typing import NoReturn


class Forked:
    """A forked child, with the part of ``subprocess.Popen``'s interface a launcher uses: ``pid``, ``returncode``
    (negative: the signal that ended it), ``poll``, ``wait``, ``send_signal`` and ``kill``."""

    def __init__(self, pid: int, args: list[str]):
        self.pid, self.args, self.returncode = pid, args, None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped by someone else: its status is gone
                self.returncode = 255
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() >= end:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.005)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:  # once reaped, the pid may be another process's
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def can_fork(argv: list[str]) -> bool:
    """Whether ``python argv...`` can be forked: ``-m module`` or a script file, from a process with one thread (a
    fork copies only the calling thread, and a lock another thread held would stay held in the child)."""
    if not hasattr(os, "fork") or threading.active_count() != 1 or not argv:
        return False
    if signal.getsignal(signal.SIGCHLD) == signal.SIG_IGN:  # the kernel would reap the ranks before their status
        return False
    if argv[0] == "-m":
        return len(argv) >= 2
    return not argv[0].startswith("-") and os.path.isfile(argv[0])


def open_fds() -> set[int]:
    """This process's descriptors above stderr (what ``Popen(close_fds=True)`` keeps from its child)."""
    try:
        listed = {int(fd) for fd in os.listdir("/proc/self/fd") if int(fd) > 2}
    except OSError:
        return set()
    found = set()
    for fd in listed:  # the listing's own descriptor is closed by now, and its number free for the next open
        try:
            fcntl.fcntl(fd, fcntl.F_GETFD)
            found.add(fd)
        except OSError:
            pass
    return found


def _flush_streams() -> None:
    """stdout and stderr, whatever they are now (closed, replaced, a broken pipe: nothing to say about it)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass


def fork_python(argv: list[str], env: dict, close: set[int] = frozenset()) -> Forked:
    """Fork a child that runs ``python argv...`` (``can_fork``) with environment ``env``, closing ``close``."""
    _flush_streams()  # else what they buffer now would be written by every child too
    pid = os.fork()
    if pid == 0:
        try:
            _child(argv, env, close)
        finally:  # whatever happens, the child never goes on with the launcher's code
            os._exit(1)
    return Forked(pid, list(argv))


def _child(argv: list[str], env: dict, close: set[int]) -> NoReturn:
    """The child's whole life: nothing may return into the launcher's stack or raise out of here."""
    status = 1
    try:
        os.environ.clear()
        os.environ.update(env)
        signal.signal(signal.SIGINT, signal.default_int_handler)  # the launcher's own handler is not the rank's
        legacy = sys.modules.get("numpy.random")
        if legacy is not None:  # numpy's global generator, as a new interpreter would seed it (random's reseeds itself)
            legacy.seed()
        for fd in close:
            try:
                os.close(fd)
            except OSError:
                pass
        status = _run(argv)
    except BaseException:  # noqa: B036  (a failure of the set-up itself: say it, as an interpreter would)
        _report(*sys.exc_info())
    finally:
        os._exit(_shut_down(status))


_main_globals: list = []  # the script's namespace, cleared at shutdown as the interpreter clears __main__'s


def _run(argv: list[str]) -> int | None:
    """Run the script or module as ``__main__``; return the exit status, or None for an uncaught KeyboardInterrupt."""
    try:
        if argv[0] == "-m":
            if not sys.flags.safe_path:
                sys.path[0] = os.getcwd()
            sys.argv = [argv[1], *argv[2:]]  # run_module puts the module's file in argv[0]
            _main_globals.append(runpy.run_module(argv[1], run_name="__main__", alter_sys=True))
        else:
            if not sys.flags.safe_path:
                sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
            sys.argv = list(argv)
            _main_globals.append(runpy.run_path(argv[0], run_name="__main__"))
        return 0
    except SystemExit as exc:
        return _exit_status(exc.code)
    except KeyboardInterrupt:
        _report(*sys.exc_info())
        return None
    except BaseException:  # noqa: B036
        _report(*sys.exc_info())
        return 1


def _exit_status(code) -> int:
    """``SystemExit``'s code as the interpreter turns it into an exit status: None is 0, a number its low byte,
    anything else is printed to stderr and gives 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        print(code, file=sys.stderr)
    except Exception:
        pass
    return 1


def _report(exc_type, exc, tb) -> None:
    """``sys.excepthook``, with the traceback starting where a fresh interpreter's would: at the script."""
    ours = (__file__, runpy.__file__, "<frozen runpy>")  # runpy is frozen into the interpreter from Python 3.11
    while tb is not None and tb.tb_frame.f_code.co_filename in ours:
        tb = tb.tb_next
    if exc is not None:
        exc.__traceback__ = tb  # the default hook prints the exception's own traceback, not the argument
    try:
        sys.excepthook(exc_type, exc, tb)
    except BaseException:  # noqa: B036  (the hook itself failed: the default one, as Python falls back to)
        try:
            sys.stderr.write("".join(traceback.format_exception(exc_type, exc, tb)))
        except Exception:
            pass


def _shut_down(status: int | None) -> int:
    """The interpreter's shutdown: non-daemon threads, ``atexit``, the script's objects (an unclosed file is
    flushed, as finalization does), the streams.  None (KeyboardInterrupt): end by SIGINT, which is how the
    launcher tells an interrupted rank from a failed one.  SIGINT stays blocked meanwhile: a Ctrl-C now (the
    launcher forwards one to a rank still running) must not raise where nothing would catch it."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        threading._shutdown()  # what Py_FinalizeEx calls first: wait for every non-daemon thread
    except BaseException:  # noqa: B036
        pass
    try:
        atexit._run_exitfuncs()
        for namespace in _main_globals:
            namespace.clear()
        gc.collect()
    except BaseException:  # noqa: B036
        pass
    _flush_streams()  # (SIGINT is blocked: no KeyboardInterrupt can come out of it)
    if status is None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        os.kill(os.getpid(), signal.SIGINT)
        status = 128 + signal.SIGINT
    return status
