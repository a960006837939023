"""What both sides of a connection share (NCCL ``src/include/``): the device view of a connector, NCCL_STEPS and the
LL flag (``device.h``), and one descriptor per protocol (``ProtoSimple``/``ProtoLL``/``ProtoLL128`` of
``primitives.h``).  The kernels (``collectives.device``) and the transports and their proxy import them from here,
below both."""
