"""A hang made on purpose, for the hangs chapter (docs/07-hangs.md).

    mpirun -n 4 python docs/book/hang_demo.py skip                             # the last rank skips the 3rd call
    python -m collectives.tools.launcher -g 4 docs/book/hang_demo.py freeze   # the last rank stops (SIGSTOP) in it

Every rank calls AllReduce five times, except the culprit, the last rank: with ``skip`` it leaves out the third
call, so after its fourth the others are still in their fifth while it works elsewhere, its communicator open;
with ``freeze`` it stops itself on the third, as a rank stuck in a debugger or a swapped-out process would.  The
lab's deadline (``NCCLLAB_TIMEOUT``) ends every rank; the waits' early warning (``NCCLLAB_WARN_AFTER``) and the
hang reports name the culprit.  This is ours: the mirror of no NCCL file, a user's program that hangs.
"""
import argparse
import os
import signal
import time

import numpy as np

import collectives

p = argparse.ArgumentParser(prog="hang_demo.py", description=__doc__.split("\n\n")[0])
p.add_argument("mode", choices=("skip", "freeze"), help="skip: the last rank leaves out its third call; freeze: "
               "it stops itself (SIGSTOP) in it")
mode = p.parse_args().mode
with collectives.Communicator() as comm:
    culprit = comm.nranks - 1
    for call in range(5):
        if comm.rank == culprit and call == 2:
            if mode == "skip":
                continue
            os.kill(os.getpid(), signal.SIGSTOP)
        comm.all_reduce(np.ones(1 << 16, np.float32))
    if comm.rank == culprit:
        time.sleep(60)  # busy elsewhere, its communicator still open: the others wait in their fifth call
