"""The Llama/Mistral transformer, written for an inference engine.

Same math as Hugging Face's `LlamaForCausalLM`, but the forward takes one flat batch of tokens with
explicit positions and attention metadata; q/k/v and gate/up are packed into one matmul each
(`PACKED_WEIGHTS` maps the checkpoint's tensors); logits are computed only where needed; and the
matmuls are tensor-parallel layers. The backend ("torch" or "triton") is bound when the model is built.

    >>> model = LlamaForCausalLM(cfg, max_positions=512, backend="triton")
    >>> hidden = model(input_ids, positions, meta)          # [T, hidden_size]
    >>> logits = model.compute_logits(hidden[last_indices])  # [num_seqs, vocab]
"""
from __future__ import annotations

import torch
from torch import nn

from ..attention import Attention, AttentionBackend, get_attention_backend
from ..config import ModelConfig
from ..distributed.parallel_state import check_divisible, kv_heads_per_rank, tp_rank, tp_size
from ..layers.basic import RMSNorm, RotaryEmbedding, SiluAndMul
from ..layers.custom_op import CustomOp
from ..layers.parallel import ColumnParallelLinear, ParallelLMHead, RowParallelLinear, VocabParallelEmbedding

# checkpoint name -> (packed parameter, shard index)
PACKED_WEIGHTS = {
    "q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
}


class LlamaAttention(nn.Module):
    """This rank's attention heads: its share of the query heads, and the KV heads they read."""

    def __init__(self, cfg: ModelConfig, max_positions: int, attn_backend: AttentionBackend):
        super().__init__()
        n, rank, d = tp_size(), tp_rank(), cfg.head_dim
        check_divisible(cfg.num_heads, cfg.num_kv_heads, n)
        num_heads, num_kv_heads = cfg.num_heads // n, kv_heads_per_rank(cfg.num_kv_heads, n)
        # With more ranks than KV heads, several ranks hold a copy of the same head.
        first_kv_head = rank * cfg.num_kv_heads // n
        self.q_size, self.kv_size = num_heads * d, num_kv_heads * d
        full_q, full_kv = cfg.num_heads * d, cfg.num_kv_heads * d
        self.qkv_proj = ColumnParallelLinear(cfg.hidden_size, [
            (full_q, rank * self.q_size, self.q_size),
            (full_kv, first_kv_head * d, self.kv_size),
            (full_kv, first_kv_head * d, self.kv_size)], bias=cfg.attention_bias)
        self.o_proj = RowParallelLinear(full_q, cfg.hidden_size, bias=cfg.attention_bias)
        self.rotary = RotaryEmbedding(d, max_positions, cfg.rope_theta, cfg.rope_scaling)
        self.attn = Attention(num_heads, num_kv_heads, d, attn_backend)

    def qkv(self, positions, x):
        """The attention's inputs: q [T, Hq, D] and k, v [T, Hkv, D], rotated by position."""
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(-1, self.attn.num_heads, self.attn.head_dim)
        k = k.view(-1, self.attn.num_kv_heads, self.attn.head_dim)
        v = v.view(-1, self.attn.num_kv_heads, self.attn.head_dim)
        q, k = self.rotary(positions, q, k)
        return q, k, v

    def forward(self, positions, x, meta):
        return self.o_proj(self.attn(*self.qkv(positions, x), meta).flatten(1))


class LlamaMLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        full = cfg.intermediate_size
        if full % tp_size():
            raise ValueError(f"tensor_parallel_size={tp_size()} must divide intermediate_size={full}")
        part = full // tp_size()
        shard = (full, tp_rank() * part, part)  # this rank's rows of gate and of up
        self.gate_up_proj = ColumnParallelLinear(cfg.hidden_size, [shard, shard], bias=cfg.mlp_bias)
        self.act = SiluAndMul()
        self.down_proj = RowParallelLinear(full, cfg.hidden_size, bias=cfg.mlp_bias)

    def forward(self, x):
        return self.down_proj(self.act(self.gate_up_proj(x)))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, max_positions: int, attn_backend: AttentionBackend):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = LlamaAttention(cfg, max_positions, attn_backend)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = LlamaMLP(cfg)

    # Split at attention, the one op that reads other tokens (and the KV cache): everything else works row by row.
    def before_attention(self, positions, x, residual):
        """(q, k, v, residual). The residual is carried separately so each norm can fuse the residual add."""
        if residual is None:
            x, residual = self.input_layernorm(x), x
        else:
            x, residual = self.input_layernorm(x, residual)
        return *self.self_attn.qkv(positions, x), residual

    def after_attention(self, attn_out, residual):
        """attn_out [T, Hq, D] -> (x, residual) for the next layer."""
        x, residual = self.post_attention_layernorm(self.self_attn.o_proj(attn_out.flatten(1)), residual)
        return self.mlp(x), residual

    def forward(self, positions, x, residual, meta):
        q, k, v, residual = self.before_attention(positions, x, residual)
        return self.after_attention(self.self_attn.attn(q, k, v, meta), residual)


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig, max_positions: int, attn_backend: AttentionBackend):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg, max_positions, attn_backend)
                                    for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, input_ids, positions, meta):
        x, residual = self.embed_tokens(input_ids), None
        for layer in self.layers:
            x, residual = layer(positions, x, residual, meta)
        x, _ = self.norm(x, residual)
        return x


class LlamaForCausalLM(nn.Module):
    """Llama and Mistral (Mistral = Llama + an optional sliding window, set in the config)."""

    def __init__(self, cfg: ModelConfig, max_positions: int | None = None, backend: str = "torch"):
        super().__init__()
        self.config = cfg
        self.attn_backend = get_attention_backend(backend, cfg.sliding_window)
        self.model = LlamaModel(cfg, max_positions or cfg.max_position_embeddings, self.attn_backend)
        self.lm_head = ParallelLMHead(cfg.vocab_size, cfg.hidden_size)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        for module in self.modules():
            if isinstance(module, CustomOp):
                module.set_backend(backend)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta) -> torch.Tensor:
        """input_ids, positions: [T] -> final hidden states [T, hidden_size]."""
        return self.model(input_ids, positions, meta)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()

    def attention_layers(self) -> list[Attention]:
        return [layer.self_attn.attn for layer in self.model.layers]
