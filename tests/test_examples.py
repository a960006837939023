"""The examples a user would write (``examples/``), run as real ranks by the launcher: a two-stage pipeline step
with send/recv and an MoE dispatch and combine with all_to_all over a split group.  Each checks itself bitwise
against the same computation done alone and exits non-zero on any difference."""
import os
import subprocess
import sys

import pytest

from conftest import ROOT


@pytest.mark.parametrize("script,nodes,ok", [("pipeline.py", 1, "ok, bitwise"), ("moe.py", 2, "ok, bitwise")])
def test_example_runs_bitwise(script, nodes, ok):
    proc = subprocess.run([sys.executable, "-m", "collectives.tools.launcher", "-g", "4", "--nodes", str(nodes),
                           str(ROOT / "examples" / script)], cwd=ROOT, capture_output=True, text=True, timeout=240,
                          env={**os.environ, "NCCLLAB_TIMEOUT": "30", "NCCL_SOCKET_IFNAME": "lo"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count(ok) == 4, proc.stdout
