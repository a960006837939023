"""gather / scatter (``collectives/rooted.py``: ``ncclGather`` / ``ncclScatter``, a group of sends and receives
around the root) between real processes, bitwise, at every root, over SHM and across emulated nodes over NET."""
import json

import pytest

from conftest import run_ranks


@pytest.mark.parametrize("n,nodes", [(1, 1), (2, 1), (3, 1), (4, 1), (4, 2)])
def test_gather_scatter_every_root(n, nodes):
    # 0 bytes, one element, odd counts, the LL/Simple switch, several Simple chunks
    proc = run_ranks(n, "rooted", json.dumps([0, 1, 7, 4097, 50001]), json.dumps(["float32", "int8"]), nodes=nodes,
                     script="p2p_workers.py")
    assert proc.stdout.count("ok rooted") == n, proc.stdout


@pytest.mark.parametrize("n", [1, 2, 3])
def test_gather_scatter_refusals_and_groups(n):
    proc = run_ranks(n, "rooted_usage", script="p2p_workers.py")
    assert proc.stdout.count("ok rooted_usage") == n, proc.stdout
