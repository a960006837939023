"""``python -m collectives.device.precompile`` (what ``./lab`` runs at setup): after it, a new process finds every
kernel of the types it was asked for in numba's disk cache and compiles nothing."""
import os
import subprocess
import sys

from conftest import ROOT

# A new process: every kernel for int8 must come from the cache (hits, no misses).
CHECK = """
from collectives.device.compiled import KERNELS
from collectives.device.precompile import kernel_signature
import numpy as np
for name, kernel in KERNELS.items():
    kernel.compile(kernel_signature(np.int8))
    stats = kernel.stats
    assert sum(stats.cache_misses.values()) == 0 and sum(stats.cache_hits.values()) >= 1, (name, stats)
print("all from the cache")
"""


def _python(args: list[str], cache) -> subprocess.CompletedProcess:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache)}  # a cache of its own, empty at first
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)


def test_a_new_process_finds_every_kernel_in_the_cache_and_a_second_run_compiles_nothing(tmp_path):
    first = _python(["-m", "collectives.device.precompile", "--types", "int8"], tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "2 kernels in numba's cache (2 compiled, 0 loaded)" in first.stdout, first.stdout
    check = _python(["-c", CHECK], tmp_path)
    assert check.returncode == 0 and "all from the cache" in check.stdout, check.stderr[-3000:]
    again = _python(["-m", "collectives.device.precompile", "--types", "int8"], tmp_path)
    assert "(0 compiled, 2 loaded)" in again.stdout, again.stdout + again.stderr[-2000:]


def test_an_unknown_type_is_one_line_and_exit_2(tmp_path):
    proc = _python(["-m", "collectives.device.precompile", "--types", "int8,float16"], tmp_path)
    assert proc.returncode == 2
    assert "not a compiled type: float16" in proc.stderr.strip().splitlines()[-1], proc.stderr
