"""``Communicator.split`` (``ncclCommSplit``: ``collectives/split.py``) between real processes: colors, keys, a
rank with no color, the children's AllReduce bitwise and their sends and receives, the parent usable throughout, and children running in their own threads at the same time as the parent."""
import pytest

from conftest import run_ranks


@pytest.mark.parametrize("nodes", [1, 2])
def test_split_at_four_ranks(nodes):
    proc = run_ranks(4, "split", nodes=nodes, script="p2p_workers.py")
    assert proc.stdout.count("ok split") == 4, proc.stdout


def test_children_run_concurrently_with_the_parent():
    """Two children (even and odd ranks) run AllReduce and send/recv in their own threads while the parent runs
    AllReduce and all-to-all at the same time, over SHM and NET (2 nodes): every result bitwise."""
    proc = run_ranks(4, "split_concurrent", nodes=2, script="p2p_workers.py")
    assert proc.stdout.count("ok split_concurrent") == 4, proc.stdout
