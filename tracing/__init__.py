"""Observation of a run: NCCL-format debug logging (``debug``).  Imports nothing else of nccl-lab."""
