"""KV caches: the tensors, and the block manager that hands their slots to sequences."""
from .block_manager import BlockManager
from .kv_cache import allocate_kv_cache, kv_bytes_per_token

__all__ = ["BlockManager", "allocate_kv_cache", "kv_bytes_per_token"]
