"""Transports (NCCL ``src/transport/``): how a connector's FIFO, head and tail reach the peer."""
