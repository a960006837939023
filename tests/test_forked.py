"""Ranks forked from a preloaded launcher (``collectives.misc.forked``, ``collectives.preload``) against the same
ranks executed (``NCCLLAB_FORK_RANKS=0``): the script must see the same interpreter, environment, arguments,
descriptors and signals, and the launcher must get the same exit statuses and output, in both."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from collectives.job import LATE_CTRL_C_S
from conftest import spawn_code

STATE = textwrap.dedent("""
    import json, os, signal, sys
    preloaded = "collectives.comm" in sys.modules
    import numpy as np
    draw = int(np.random.randint(1 << 62))  # numpy's global generator, seeded anew in each process
    fds = []
    for fd in sorted(os.listdir("/proc/self/fd"), key=int):
        try:
            fds.append((int(fd), os.readlink(f"/proc/self/fd/{fd}")))
        except OSError:  # listdir's own descriptor, closed meanwhile
            pass
    sys.stdout.write(json.dumps({"preloaded": preloaded, "name": __name__, "file": __file__, "argv": sys.argv,
                      "path0": sys.path[0], "main": sys.modules["__main__"].__file__,
                      "rank": os.environ["NCCLLAB_RANK"], "env": sorted(k for k in os.environ if k != "NCCLLAB_RANK"),
                      "host": os.environ.get("NCCL_HOSTID"), "sigint": signal.getsignal(signal.SIGINT) is
                      signal.default_int_handler, "blocked": sorted(signal.pthread_sigmask(signal.SIG_BLOCK, [])),
                      "fds": [fd for fd, target in fds if fd > 2 and "/proc/" not in target],
                      "ppid_is_launcher": os.getppid() == int(os.environ["LAUNCHER_PID"]), "draw": draw}) + "\\n")
    sys.stdout.flush()  # one write: the ranks share the pipe
""")


def launch(tmp_path, script: str, nranks: int = 2, fork: bool = True, argv_tail: str = "'a', 'b c'",
           **kwargs) -> subprocess.CompletedProcess:
    """Run ``script`` (written to a file) as ``nranks`` ranks with arguments ``argv_tail`` (``run_launcher``)."""
    path = tmp_path / "rank_script.py"
    path.write_text(script)
    return run_launcher(f"[{str(path)!r}, {argv_tail}]", nranks, fork, **kwargs)


def run_launcher(argv: str, nranks: int, fork: bool, nodes: int = 1, prefix: str = "", buffered: bool = False,
                 env: dict | None = None) -> subprocess.CompletedProcess:
    """A test launcher (``spawn_code``) of ``argv`` (a Python expression), ``prefix`` run before it, its ranks forked
    or executed."""
    env = {**os.environ, **(env or {}), "NCCLLAB_FORK_RANKS": "1" if fork else "0"}
    if buffered:  # the launcher's stdout (a pipe) keeps what it is given until flushed, as Python's default is
        env.pop("PYTHONUNBUFFERED", None)
    code = prefix + "import os; os.environ['LAUNCHER_PID'] = str(os.getpid()); " + spawn_code(nranks, argv, nodes)
    # an extra descriptor in the launcher, as a caller's open file: Popen(close_fds=True) keeps it from the ranks
    r, w = os.pipe()
    try:
        return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                              pass_fds=(r,))
    finally:
        os.close(r)
        os.close(w)


def states(proc) -> list[dict]:
    return sorted((json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")),
                  key=lambda s: s["rank"])


def test_a_forked_rank_sees_what_an_executed_one_sees(tmp_path):
    got = {fork: launch(tmp_path, STATE, fork=fork, nodes=2) for fork in (True, False)}
    for fork, proc in got.items():
        assert proc.returncode == 0, (fork, proc.stderr[-3000:])
    forked_states, executed = states(got[True]), states(got[False])
    assert [s["preloaded"] for s in forked_states] == [True, True]  # forked after the preload
    assert [s["preloaded"] for s in executed] == [False, False]
    assert forked_states[0]["draw"] != forked_states[1]["draw"]
    for a, b in zip(forked_states, executed):
        for key in ("preloaded", "draw"):
            a.pop(key), b.pop(key)
        assert a == b
    s = forked_states[1]
    assert s["name"] == "__main__" and s["argv"] == [s["file"], "a", "b c"] and s["main"] == s["file"]
    assert s["path0"] == os.path.dirname(s["file"]) and s["rank"] == "1" and s["host"] == "nccllab-node1"
    assert s["sigint"] and s["blocked"] == [2] and s["fds"] == [] and s["ppid_is_launcher"]


@pytest.mark.parametrize("body, status, err", [
    ("import sys; sys.exit(3)", 3, None),
    ("import sys; sys.exit(-1)", 255, None),
    ("import sys; sys.exit('went wrong')", 1, "went wrong\n"),
    ("def f():\n    raise ValueError('no')\nf()", 1, None),
])
def test_exit_statuses_and_errors_match_an_executed_rank(tmp_path, body, status, err):
    script = "import os\nif os.environ['NCCLLAB_RANK'] == '1':\n" + textwrap.indent(body, "    ") + "\n"
    got = {fork: launch(tmp_path, script, fork=fork) for fork in (True, False)}
    assert got[True].returncode == got[False].returncode == status
    assert got[True].stderr == got[False].stderr, (got[True].stderr, got[False].stderr)
    if err is not None:
        assert got[True].stderr == err
    if "ValueError" in body:  # the traceback starts at the script, as a fresh interpreter's does
        lines = got[True].stderr.splitlines()
        assert lines[0] == "Traceback (most recent call last):" and "rank_script.py" in lines[1], lines
        assert lines[-1] == "ValueError: no" and "runpy" not in got[True].stderr and "forked" not in got[True].stderr


def test_threads_atexit_and_the_launchers_buffer(tmp_path):
    """A non-daemon thread is waited for and ``atexit`` runs, in that order, as the interpreter's shutdown does; a
    file the script left open is flushed; what the launcher had buffered but not written is written once, not once
    per rank."""
    script = textwrap.dedent(f"""
        import atexit, os, sys, threading, time
        atexit.register(lambda: print("atexit", os.environ["NCCLLAB_RANK"], flush=True))
        threading.Thread(target=lambda: (time.sleep(0.3), print("thread", os.environ["NCCLLAB_RANK"]))).start()
        left_open = open(os.path.join({str(tmp_path)!r}, "left_open." + os.environ["NCCLLAB_RANK"]), "w")
        left_open.write("written")
    """)
    for fork in (True, False):
        proc = launch(tmp_path, script, fork=fork, prefix="import sys; sys.stdout.write('launcher\\n'); ",
                      buffered=True)
        assert proc.returncode == 0, proc.stderr
        lines = proc.stdout.splitlines()
        assert lines.count("launcher") == 1, lines
        for r in "01":
            assert lines.index(f"thread {r}") < lines.index(f"atexit {r}"), lines
            assert (tmp_path / f"left_open.{r}").read_text() == "written", (fork, r)
            (tmp_path / f"left_open.{r}").unlink()


def test_each_rank_logs_its_variables_to_its_own_debug_file(tmp_path):
    """NCCL prints each parameter read from the environment once per process (``ncclLoadParam``), into
    ``NCCL_DEBUG_FILE`` with ``%p`` its pid: a launcher that logged before forking leaves its ranks both to do."""
    script = "from collectives.misc.param import env_int\nenv_int('NCCL_NTHREADS', 0)\n"
    prefix = "from collectives.misc.param import env_int; env_int('NCCL_NTHREADS', 0); "
    for fork in (True, False):
        logs = tmp_path / f"logs-{fork}"
        logs.mkdir()
        env = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "ENV", "NCCL_NTHREADS": "256",
               "NCCL_DEBUG_FILE": str(logs / "debug.%p")}
        proc = launch(tmp_path, script, fork=fork, prefix=prefix, env=env)
        assert proc.returncode == 0, proc.stderr
        files = sorted(logs.iterdir())
        assert len(files) == 3, (fork, files)  # the launcher's and each rank's
        for f in files:
            assert f.read_text().count("NCCL INFO NCCL_NTHREADS set by environment to 256.") == 1, (fork, f)


def test_a_module_runs_as_with_dash_m(tmp_path):
    data = tmp_path / "x.json"
    data.write_text('{"b": 1, "a": [2]}')
    out = {}
    for fork in (True, False):
        proc = run_launcher(f"['-m', 'json.tool', '--sort-keys', {str(data)!r}]", 1, fork)
        assert proc.returncode == 0, proc.stderr
        out[fork] = proc.stdout
    assert out[True] == out[False] == '{\n    "a": [\n        2\n    ],\n    "b": 1\n}\n'


def test_only_a_script_or_module_from_one_thread_is_forked(tmp_path):
    """Asked in a new interpreter: this test process may hold threads of earlier tests (and pytest-xdist's)."""
    script = tmp_path / "s.py"
    script.write_text("")
    program = textwrap.dedent(f"""
        import signal, threading
        from collectives.misc import forked
        s, missing = {str(script)!r}, {str(tmp_path / "missing.py")!r}
        print(forked.can_fork([s]), forked.can_fork(["-m", "json.tool"]))
        print(forked.can_fork(["-c", "pass"]), forked.can_fork(["-m"]), forked.can_fork([missing]),
              forked.can_fork([]))
        previous = signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel would reap the ranks unseen
        print(forked.can_fork([s]))
        signal.signal(signal.SIGCHLD, previous)
        stop = threading.Event()
        t = threading.Thread(target=stop.wait)
        t.start()
        print(forked.can_fork([s]))  # a second thread: the launcher executes its ranks instead
        stop.set()
        t.join()
        print(forked.can_fork([s]))
    """)
    proc = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n") == ["True True", "False False False False", "False", "False", "True", ""]


def test_a_ctrl_c_after_the_launchers_line_is_ignored(tmp_path):
    """Ranks forked end within milliseconds of a Ctrl-C, so the launcher prints its line and returns before the
    terminal's next SIGINT (each key press signals the whole group): that one must not become a traceback.  After
    ``LATE_CTRL_C_S`` a Ctrl-C is the caller's again."""
    script = tmp_path / "wait.py"
    # a rank starts with SIGINT blocked until its communicator's hook unblocks it: this one, with no
    # communicator, does it itself, and ends quietly at its first Ctrl-C as that hook's ranks do
    script.write_text(textwrap.dedent("""
        import signal, sys, time
        def first_interrupt(*_):
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            sys.exit(0)
        signal.signal(signal.SIGINT, first_interrupt)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        sys.stdout.write('up\\n')  # one write: the ranks share the pipe
        sys.stdout.flush()
        time.sleep(60)
    """))
    code = ("import sys, time; from collectives.job import LATE_CTRL_C_S, spawn; "
            "from collectives.preload import preload\n"
            f"rc = spawn(2, [{str(script)!r}], preload=preload)\n"
            "time.sleep(1.0)\n"
            "try:\n    time.sleep(LATE_CTRL_C_S + 30)\nexcept KeyboardInterrupt:\n    print('caller interrupted')\n"
            "sys.exit(rc)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        assert [proc.stdout.readline() for _ in range(2)] == ["up\n", "up\n"]
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.stderr.readline() == "interrupted: 2 ranks stopped\n"
        os.killpg(proc.pid, signal.SIGINT)  # the launcher is in its caller's first sleep now: absorbed
        time.sleep(LATE_CTRL_C_S + 0.5)
        os.killpg(proc.pid, signal.SIGINT)  # past the window: the caller's Ctrl-C again
        assert proc.wait(timeout=30) == 130, proc.stderr.read()
        assert proc.stderr.read() == "" and proc.stdout.read() == "caller interrupted\n"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
