"""Pictures of a run (diagrams and curves) and parsers of nccl-tests output."""
