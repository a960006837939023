"""The README's API script, run by tests/test_torchrun.py under torchrun and under our launcher.

``python tests/torchrun_script.py [ROUNDS]``: ROUNDS communicators one after another (each a fresh unique id), each
an AllReduce checked against the expected sum; each rank then prints one line
``ok rank R of N roots=HOST:PORT/MAGIC,... NCCL_COMM_ID=<value or None>``: each communicator's unique id (where
its bootstrap root was), and the ``NCCL_COMM_ID`` this rank sees (a user's setting must reach the ranks unchanged).
"""
import os
import sys

import numpy as np

import collectives

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 1
roots = []
for i in range(rounds):
    with collectives.Communicator() as comm:
        x = np.full((4, 250), comm.rank + 1 + i, np.float32)
        y = comm.all_reduce(x)
        want = sum(r + 1 + i for r in range(comm.nranks))
        assert y.shape == x.shape and np.all(y == want), (y.ravel()[:4], want)
        uid = comm.bootstrap.uid
        roots.append(f"{uid.host}:{uid.port}/{uid.magic:x}")
line = f"ok rank {comm.rank} of {comm.nranks} roots={','.join(roots)} NCCL_COMM_ID={os.environ.get('NCCL_COMM_ID')}"
os.write(1, (line + "\n").encode())  # one write: the ranks share the pipe
