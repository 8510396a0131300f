"""KV caches: the tensors, and the managers that hand their slots to sequences."""
from .contiguous import ContiguousCacheManager
from .kv_cache import allocate_kv_cache, kv_bytes_per_token

__all__ = ["ContiguousCacheManager", "allocate_kv_cache", "kv_bytes_per_token"]
