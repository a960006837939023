"""scripts/gpu_check.py runs end to end in numba's simulator (``--device cudasim --small``), as CI runs it: the
bitwise matrix with ranks as threads finds 0 wrong elements, the steps that need a GPU say so, and the report
files are written."""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(os.environ.get("NCCLLAB_SLOW_TESTS") != "1",
                    reason="takes over 5 minutes in numba's simulator on 2 cores (N = 4 ranks as threads, LL polling): "
                           "run with NCCLLAB_SLOW_TESTS=1")
def test_gpu_check_runs_in_the_simulator(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), str(tmp_path), "--device",
                        "cudasim", "--small"], env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rep = json.loads((tmp_path / "gpu_check.json").read_text())
    assert rep["environment"]["gpu"] == "skipped: no GPU"
    assert rep["copy_rate"]["status"] == "skipped: no GPU"
    assert rep["real_nccl"]["status"] == "skipped: no GPU"
    assert rep["bitwise"]["status"] == "ok" and rep["bitwise"]["wrong"] == 0
    funcs = {(r["n"], r["func"], r["algo"], r["proto"]) for r in rep["bitwise"]["rows"]}
    assert len(funcs) == 2 * 6 * 2  # N = 2 and 4, five ring collectives + Tree AllReduce, Simple and LL
    assert all(r["elements"] > 0 for r in rep["bitwise"]["rows"])
    assert rep["processes"]["status"] == "ok"  # the communicator, 2 rank processes over P2P
    assert all(r["via"] == ["P2P/IPC"] for r in rep["processes"]["rows"])
    assert {r["n"] for r in rep["sweep"]["ring"]} == {2, 4}
    assert (tmp_path / "busbw.png").stat().st_size > 0
    assert "bitwise (ranks as threads" in (tmp_path / "gpu_check.txt").read_text()


def test_gpu_check_without_cupy_is_one_line(tmp_path):
    if importlib.util.find_spec("cupy") is not None:
        pytest.skip("cupy is installed: --device cuda may well work here")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), str(tmp_path), "--device", "cuda"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.strip().splitlines() == ["gpu_check: device cuda needs cupy and numba-cuda (pip install -e .[gpu]): "
                                             "No module named 'cupy'"]
