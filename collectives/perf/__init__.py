"""The nccl-tests runner (nccl-tests ``src/common.cu`` and ``src/*.cu``), behind ``python -m collectives.ring`` and
``python -m collectives.tree``: ``args`` (the flags, the sizes, the checks before any rank starts), ``runner`` (the
timing loop and the bitwise check), ``table`` (nccl-tests' header, rows and footer), ``threads`` (``--threads``:
every rank a thread of one process on a GPU device), ``colls`` (the five collectives as one table), ``main`` and
``reference`` (the NCCL-order oracle the check compares with, which shares no code with what it checks).

Per size: out-of-place then in-place; ``-w`` warm-up calls, ``-n`` timed calls, time averaged over ranks (``-a 1``).
With ``-c 1`` each placement is then run once more on fresh random inputs with the output poisoned, and every
element is compared bitwise with the reference (NCCL's summation order): ``#wrong`` counts the mismatches over all
ranks.  ``--json FILE`` writes the same rows as records.
"""
