"""``Communicator.split`` (``ncclCommSplit``: ``collectives/split.py``) between real processes: colors, keys, a
rank with no color, the children's AllReduce bitwise and their sends and receives, the parent usable throughout."""
import pytest

from conftest import run_ranks


@pytest.mark.parametrize("nodes", [1, 2])
def test_split_at_four_ranks(nodes):
    proc = run_ranks(4, "split", nodes=nodes, script="p2p_workers.py")
    assert proc.stdout.count("ok split") == 4, proc.stdout
