"""The fault suite: each fault, injected into a real job under mpirun (and our own launcher), gives a one-line
error naming the culprit, ends every rank within the deadline plus a few seconds, and leaves nothing behind."""
import pytest

from faults import DEADLINE_S, FAULTS, MPIRUN, run_fault

LAUNCHERS = ["mpirun", "spawn"]


@pytest.mark.parametrize("kind", sorted(FAULTS))
@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_fault_ends_the_job_naming_the_culprit(kind, launcher):
    if launcher == "mpirun" and MPIRUN is None:
        pytest.skip("mpirun not installed")
    if launcher == "spawn" and kind == "port_taken":
        pytest.skip("our launcher picks a free bootstrap port itself")
    r = run_fault(kind, launcher)
    assert r.returncode != 0, r.output[-3000:]
    assert "unexpected success" not in r.output
    assert r.message, f"no line names the culprit:\n{r.output[-4000:]}"
    assert "Traceback" not in r.output, r.output[-4000:]
    assert r.ended_s < DEADLINE_S + 10, f"the job ended {r.ended_s:.1f} s after the fault"
    assert not r.left_procs, r.left_procs
    assert not r.left_shm, r.left_shm


@pytest.mark.parametrize("kind", ["sigkill_shm", "mismatch", "skip_destroy"])
def test_torchrun_style_ranks_end_by_themselves(kind):
    """With torchrun's variables and no launcher to kill anyone, every surviving rank still ends, non-zero."""
    r = run_fault(kind, "torchrun-env", nranks=3)
    survivors = r.exit_codes[:-1]  # the last rank is the culprit
    assert survivors and all(c != 0 for c in survivors), (r.exit_codes, r.output[-3000:])
    assert r.message, r.output[-3000:]
    assert r.ended_s < DEADLINE_S + 10
    assert not r.left_procs and not r.left_shm
