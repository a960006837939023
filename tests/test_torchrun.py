"""Launchers other than mpirun: torchrun (its store carries the unique id, as torch.distributed's ``env://`` init
uses it), our own launcher (a user's ``NCCL_COMM_ID`` reaches the ranks unchanged and means what NCCL means), and
Ctrl-C over NET (the launcher's one line, exit 130, no traceback from any rank)."""
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = str(ROOT / "tests" / "torchrun_script.py")
TORCHRUN = shutil.which("torchrun", path=os.path.dirname(sys.executable))
ENV = {**os.environ, "NCCL_SOCKET_IFNAME": "lo", "NCCLLAB_TIMEOUT": "20", "OMP_NUM_THREADS": "1"}
for var in ("NCCL_COMM_ID", "NCCLLAB_COMM_ID", "NCCLLAB_COMM_MAGIC", "NCCLLAB_RANK", "NCCLLAB_NRANKS", "RANK",
            "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "TORCHELASTIC_USE_AGENT_STORE"):
    ENV.pop(var, None)
needs_torchrun = pytest.mark.skipif(TORCHRUN is None, reason="torch is not installed (pip install -e '.[test]')")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ok_lines(out: str, nranks: int) -> dict[int, str]:
    """rank -> its ``ok`` line; every rank must have printed one."""
    found = {int(m.group(1)): m.group(0) for m in re.finditer(rf"^ok rank (\d+) of {nranks} .*$", out, re.M)}
    assert sorted(found) == list(range(nranks)), out[-4000:]
    return found


def roots(line: str) -> list[str]:
    return re.search(r"roots=(\S+)", line).group(1).split(",")


@needs_torchrun
def test_torchrun_standalone_two_ranks():
    """``torchrun --standalone``: MASTER_PORT is the agent's store, which already listens there; rank 0 puts a
    fresh unique id into it for each communicator, the other rank reads it."""
    proc = subprocess.run([TORCHRUN, "--standalone", "--nproc_per_node", "2", SCRIPT, "2"], env=ENV,
                          capture_output=True, text=True, timeout=90, cwd=ROOT)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    lines = ok_lines(proc.stdout, 2)
    assert roots(lines[0]) == roots(lines[1]), lines  # both ranks joined the same roots
    first, second = roots(lines[0])
    assert first != second, lines  # the second communicator did not reuse the first one's id
    assert "NCCL_COMM_ID=None" in lines[0]  # nothing of ours reached the user's variable


@needs_torchrun
def test_torchrun_c10d_two_invocations():
    """Two ``torchrun`` processes meeting through the c10d rendezvous (as on two nodes): the store of the one
    that hosts it carries the unique id to the other."""
    port = free_port()
    procs = [subprocess.Popen([TORCHRUN, "--nnodes", "2", "--node_rank", str(n), "--nproc_per_node", "1",
                               "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", "lab",
                               SCRIPT], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              cwd=ROOT) for n in range(2)]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=90)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    out = "\n".join(outs)
    assert [p.returncode for p in procs] == [0, 0], out[-4000:]
    lines = ok_lines(out, 2)
    assert roots(lines[0]) == roots(lines[1]), lines


def test_torchrun_environment_without_torch_is_one_line():
    """torchrun's variables but no torch: one line saying how to run, before anything listens or waits."""
    code = ("import runpy, sys; sys.modules['torch'] = None; sys.argv = sys.argv[1:]; "
            "runpy.run_path(sys.argv[0], run_name='__main__')")
    env = {**ENV, "RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    proc = subprocess.run([sys.executable, "-c", code, SCRIPT], env=env, capture_output=True, text=True, timeout=60,
                          cwd=ROOT)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "torch" in lines[0] and "collectives.tools.launcher" in lines[0], proc.stderr


def test_nccl_comm_id_under_torchrun_is_nccls(monkeypatch):
    """With a user's NCCL_COMM_ID, torchrun's ranks take NCCL's id of that address: no store, no torch."""
    from collectives import job

    def no_store(*args):
        raise AssertionError("the store was used")
    monkeypatch.setattr(job, "install_fatal_hook", lambda: None)  # keep pytest's own hooks
    monkeypatch.setattr(job, "_torchrun_store", no_store)
    for var in ("NCCLLAB_RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        monkeypatch.delenv(var, raising=False)
    for var, value in {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1",
                       "NCCL_COMM_ID": "10.1.2.3:5000"}.items():
        monkeypatch.setenv(var, value)
    uid, nranks, rank = job.rank_env()
    assert (uid.host, uid.port, nranks, rank) == ("10.1.2.3", 5000, 2, 1)
    assert os.environ["NCCL_COMM_ID"] == "10.1.2.3:5000"


def test_nccl_comm_id_reaches_the_ranks_and_hosts_the_root():
    """Our launcher passes its own root address in NCCLLAB_COMM_ID; a user's NCCL_COMM_ID stays as it was in every
    rank, and means NCCL's: rank 0 hosts the bootstrap root at that address."""
    port = free_port()
    env = {**ENV, "NCCL_COMM_ID": f"127.0.0.1:{port}"}
    proc = subprocess.run([sys.executable, "-m", "collectives.tools.launcher", "-g", "2", SCRIPT], env=env,
                          capture_output=True, text=True, timeout=90, cwd=ROOT)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    for line in ok_lines(proc.stdout, 2).values():
        assert line.endswith(f"NCCL_COMM_ID=127.0.0.1:{port}"), line
        assert roots(line)[0].startswith(f"127.0.0.1:{port}/"), line


def _children(pid: int) -> list[int]:
    kids = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            kids += [int(k) for k in f.read().split()]
    return kids


def test_a_second_ctrl_c_while_a_rank_reports_the_first_is_ignored():
    """The cause of ``Error in sys.excepthook``: a second SIGINT (the launcher's forward, the terminal's copy, a
    second press) handled while the rank's except hook runs.  Here it arrives exactly then, every time."""
    # The rank starts from Python's own SIGINT handler: a suite started with SIGINT ignored (a background job of a
    # non-interactive shell) passes SIG_IGN on, which install_fatal_hook rightly keeps, and no Ctrl-C would arrive.
    code = ("import os, signal, sys\n"
            "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
            "from collectives import job\n"
            "job.install_fatal_hook()\n"
            "hook = sys.excepthook\n"
            "def late(*exc):\n"
            "    os.kill(os.getpid(), signal.SIGINT)\n"
            "    hook(*exc)\n"
            "sys.excepthook = late\n"
            "os.kill(os.getpid(), signal.SIGINT)\n"
            "while True:\n"
            "    pass\n")
    env = {**ENV, "NCCLLAB_RANK": "0", "NCCLLAB_NRANKS": "1"}  # a rank of our launcher's
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.stderr == "", proc.stderr
    assert proc.returncode == -signal.SIGINT  # Python's own exit for an uncaught KeyboardInterrupt


@pytest.mark.parametrize("when", ["running", "importing"])
def test_ctrl_c_over_net_is_the_launchers_one_line(when):
    """Ctrl-C (SIGINT to the whole process group, twice, as an impatient user does) over NET between 2 emulated
    nodes: the launcher's one line and 130, nothing from any rank, no rank left; ``importing``: before the ranks
    have even loaded the library."""
    nranks = 2
    proc = subprocess.Popen([sys.executable, "-m", "collectives.ring", "-g", str(nranks), "--nodes", "2", "-b", "64M",
                             "-e", "64M", "-n", "50", "-c", "0"], env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT, start_new_session=True)
    err: list[str] = []
    header = threading.Event()  # the table's header: every rank is past init, in the timed loop

    def read_stdout():
        for line in proc.stdout:
            if "(elements)" in line:
                header.set()
    readers = [threading.Thread(target=lambda: err.append(proc.stderr.read()), daemon=True),
               threading.Thread(target=read_stdout, daemon=True)]
    for t in readers:
        t.start()
    try:
        end = time.monotonic() + 60
        if when == "running":
            assert header.wait(timeout=60), "the table's header never came"
            time.sleep(0.5)
        else:
            while len(_children(proc.pid)) < nranks and time.monotonic() < end:
                time.sleep(0.01)
        ranks = _children(proc.pid)
        assert len(ranks) == nranks, "the ranks never started"
        os.killpg(proc.pid, signal.SIGINT)
        time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    for t in readers:
        t.join(timeout=5)
    stderr = err[0] if err else ""
    assert proc.returncode == 130, stderr[-4000:]
    assert stderr == f"interrupted: {nranks} ranks stopped\n", stderr[-4000:]
    assert not [r for r in ranks if os.path.exists(f"/proc/{r}")], "a rank outlived the launcher"
