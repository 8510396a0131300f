"""KV caches: the tensors, the block manager that hands their slots to sequences, and Mistral's rotating
cache (W slots per sequence), the other way to a sliding window, for notebook 07."""
from .block_manager import BlockManager
from .kv_cache import allocate_kv_cache, kv_bytes_per_token
from .rotating_cache import RotatingKVCache

__all__ = ["BlockManager", "RotatingKVCache", "allocate_kv_cache", "kv_bytes_per_token"]
