"""Reading a tile of keys and values through a sequence's block table: the step both attention kernels share.

Token n of a sequence lives in block block_table[n // BLOCK_SIZE], slot n % BLOCK_SIZE of the paged KV cache
[num_blocks, BLOCK_SIZE, Hkv, D]. An fp8 cache arrives as bytes (numpy, under the interpreter, has no fp8)
and is widened exactly to the queries' dtype; its scales are the caller's to apply.
"""
import triton
import triton.language as tl


@triton.jit
def load_kv_tile(K, V, block_table, offs_n, n_valid, offs_d, d_valid, kv_head,
                 stride_kb, stride_ks, stride_kh,
                 BLOCK_SIZE: tl.constexpr, FP8: tl.constexpr, WIDEN_TO: tl.constexpr):
    """k, v [len(offs_n), len(offs_d)] of KV head kv_head for the tokens offs_n (0 where not n_valid)."""
    # Masked: block table entries past the context or before the sliding window may be -1.
    block = tl.load(block_table + offs_n // BLOCK_SIZE, mask=n_valid, other=0)
    kv_off = block.to(tl.int64) * stride_kb + (offs_n % BLOCK_SIZE) * stride_ks + kv_head * stride_kh
    kv_mask = n_valid[:, None] & d_valid[None, :]
    k = tl.load(K + kv_off[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
    v = tl.load(V + kv_off[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
    if FP8:
        k = k.to(tl.float8e4nv, bitcast=True).to(WIDEN_TO)
        v = v.to(tl.float8e4nv, bitcast=True).to(WIDEN_TO)
    return k, v
