"""The IB plugin's settings, NCCL's names and defaults (``NCCL_PARAM`` lines of ``src/transport/net_ib/``)."""
from __future__ import annotations

from dataclasses import dataclass

from collectives.misc.param import env_int, env_str


@dataclass
class IbParams:
    hca: str = ""                 # NCCL_IB_HCA
    gid_index: int = -1           # NCCL_IB_GID_INDEX (-1: pick)
    timeout: int = 20             # NCCL_IB_TIMEOUT
    retry_cnt: int = 7            # NCCL_IB_RETRY_CNT
    sl: int = 0                   # NCCL_IB_SL
    tc: int = 0                   # NCCL_IB_TC
    pkey: int = 0                 # NCCL_IB_PKEY
    use_inline: int = 0           # NCCL_IB_USE_INLINE
    qps_per_conn: int = 1         # NCCL_IB_QPS_PER_CONNECTION
    split_data_on_qps: int = 0    # NCCL_IB_SPLIT_DATA_ON_QPS
    ar_threshold: int = 8192      # NCCL_IB_AR_THRESHOLD
    adaptive_routing: int = -2    # NCCL_IB_ADAPTIVE_ROUTING (-2: on for InfiniBand links)

    @classmethod
    def from_env(cls) -> "IbParams":
        p = cls(hca=env_str("NCCL_IB_HCA"), gid_index=env_int("NCCL_IB_GID_INDEX", -1),
                timeout=env_int("NCCL_IB_TIMEOUT", 20), retry_cnt=env_int("NCCL_IB_RETRY_CNT", 7),
                sl=max(0, env_int("NCCL_IB_SL", 0)), tc=max(0, env_int("NCCL_IB_TC", 0)),
                pkey=env_int("NCCL_IB_PKEY", 0), use_inline=env_int("NCCL_IB_USE_INLINE", 0),
                qps_per_conn=env_int("NCCL_IB_QPS_PER_CONNECTION", 1),
                split_data_on_qps=env_int("NCCL_IB_SPLIT_DATA_ON_QPS", 0),
                ar_threshold=env_int("NCCL_IB_AR_THRESHOLD", 8192),
                adaptive_routing=env_int("NCCL_IB_ADAPTIVE_ROUTING", -2))
        if not 1 <= p.qps_per_conn <= 128:
            raise ValueError(f"NCCL_IB_QPS_PER_CONNECTION={p.qps_per_conn}: expected 1..128")
        return p
