"""Topology decisions (NCCL ``src/graph/``): the ring order of each channel."""
