"""The GPU kernels with ranks as processes (``--device cudasim``): each rank's communicator launches its own
persistent kernel in numba's CUDA simulator, connected by ``transports/p2p.py`` through a pool in POSIX shared memory
(the simulator's stand-in for CUDA IPC).  Bitwise against the NCCL-order reference, through the same ``bitwise``
worker as the CPU path: fresh random inputs, poisoned outputs, in place and out of place, counts 0, odd and a few
thousand, small FIFOs so that they wrap and run out of credit; Simple, LL and LL128.  1 channel where the
simulator's speed asks for it."""
import pytest

from conftest import run_ranks
from workers import ALL, Case

SIM = {"NCCLLAB_DEVICE": "cudasim", "NCCL_BUFFSIZE": "65536", "NCCL_LL_BUFFSIZE": "16384",
       "NCCL_LL128_BUFFSIZE": "65536"}


@pytest.mark.parametrize("n,proto,algo,dtypes", [
    (2, "Simple", "Ring", ["float32", "bfloat16", "int32"]),
    (3, "LL", "Ring", ["float32", "float16"]),
    (3, "Simple", "Tree", ["float32", "bfloat16"]),
    (2, "LL", "Tree", ["float32", "float64"]),
    (2, "LL128", "Ring", ["float32"]),  # named in NCCL_PROTO, LL128 runs (its FIFO rows are allocated only then)
])
def test_processes_bitwise(n, proto, algo, dtypes):
    colls = ["allreduce"] if algo == "Tree" else ALL
    proc = run_ranks(n, "bitwise", Case([0, 1001, 3000], dtypes, colls).arg(),
                     env={**SIM, "NCCL_PROTO": proto, "NCCL_ALGO": algo, "NCCL_DEBUG": "INFO",
                          "NCCL_DEBUG_SUBSYS": "INIT,P2P"}, timeout=120)
    assert proc.stdout.count(" ok") == n
    # transport selection puts P2P first: every ring edge says so, as NCCL's p2pSendSetup prints it
    assert proc.stdout.count("via P2P/IPC") >= n and "via SHM" not in proc.stdout
    assert "POSIX shared memory" in proc.stdout  # the simulator's stand-in is named


def test_p2p_read_mode_is_logged():
    proc = run_ranks(2, "bitwise", Case([1001], ["float32"], ["allreduce"]).arg(),
                     env={**SIM, "NCCL_PROTO": "Simple", "NCCL_P2P_READ_ENABLE": "1", "NCCL_DEBUG": "INFO",
                          "NCCL_DEBUG_SUBSYS": "P2P"}, timeout=120)
    assert "via P2P/IPC/read" in proc.stdout


def test_peer_that_never_enters_fails_every_rank_in_one_line():
    proc = run_ranks(2, "stuck", "6", env={**SIM, "NCCLLAB_TIMEOUT": "3"}, check=False, timeout=120)
    assert proc.returncode != 0
    assert "made no progress for 3 s (NCCLLAB_TIMEOUT): channel 0 step 0 waiting for" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("env,msg", [
    ({"NCCL_P2P_DISABLE": "1"}, "connects ranks through P2P only"),
])
def test_what_the_gpu_path_cannot_do_is_one_line(env, msg):
    proc = run_ranks(2, "bitwise", Case([8], ["float32"], ["allreduce"]).arg(), env={**SIM, **env}, check=False,
                     timeout=120)
    assert proc.returncode != 0 and msg in proc.stderr
    assert "Traceback" not in proc.stderr


def _runner(*args, env=None):
    import os
    import subprocess
    import sys
    return subprocess.run([sys.executable, "-m", "collectives.ring", *args], capture_output=True, text=True,
                          timeout=240, env={**os.environ, **SIM, **(env or {})})


@pytest.mark.parametrize("mode", [[], ["--threads"]])
def test_runner_on_the_simulator(mode):
    """``--device cudasim``: ranks as processes (P2P/IPC) or, with ``--threads``, as threads of one process; the
    runner's own bitwise check passes and its table says where the ranks ran."""
    proc = _runner("--device", "cudasim", *mode, "-g", "2", "-b", "1K", "-e", "4K", "-f", "4", "-n", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "# Out of bounds values : 0 OK" in proc.stdout
    assert "[cudasim]" in proc.stdout
    rows = [line.split() for line in proc.stdout.splitlines() if line.strip() and not line.startswith("#")]
    assert len(rows) == 2 and all(r[-1] == ("N/A" if mode else "0") for r in rows)  # --threads: out of place only


@pytest.mark.parametrize("args,msg", [
    (["--threads"], "--threads runs the GPU kernels: add --device cuda or --device cudasim"),
    (["--device", "cudasim", "--nodes", "2"], "connect one node's ranks (P2P), not NET"),
    (["--device", "tpu"], "invalid choice: 'tpu'"),
])
def test_runner_refuses_what_the_gpu_path_cannot_do_before_ranks_start(args, msg):
    proc = _runner(*args, "-g", "2", "-b", "8", "-e", "8", env={"NCCLLAB_DEVICE": ""})
    assert proc.returncode == 2 and msg in proc.stderr and "Traceback" not in proc.stderr
