"""What NCCL's kernels do (``src/device/``), one CUDA block per channel, as resumable generators on a CPU."""
