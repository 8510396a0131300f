"""The naive generators every optimization is measured against.

- `recompute_generate`: minivllm's own model with no KV cache at all: every step runs the
  whole sequence again, so step t costs O(t) tokens of compute (notebook 02's "before").
- `hf_generate_sequential`: Hugging Face `generate()` one request at a time: what the
  post that started this project measured (17-18 tok/s on an A100; `constants.POST_HF_TOK_S_RANGE`).
- `hf_generate_static_batch`: Hugging Face `generate()` on padded batches: all requests of a
  batch start together and the batch runs until its longest answer is done.
- `hf_generate_continuous`: transformers' own continuous batching (`generate_batch`).

All of them are greedy and produce exactly `max_tokens` new tokens per prompt (no early
stop: the `ignore_eos` of the benchmarks), and return the new token ids of each prompt.

    >>> hf = hf_model_for(source, "cuda", torch.bfloat16)
    >>> outs = hf_generate_static_batch(hf, prompts, max_tokens=150, batch_size=60)
"""
from __future__ import annotations

import torch

from minivllm.attention import NoCacheMetadata
from minivllm.utils import progress


@torch.inference_mode()
def recompute_generate(model, prompts: list[list[int]], max_tokens: int, use_tqdm: bool = False) -> list[list[int]]:
    """Greedy generation without a KV cache: all sequences in one flat batch, recomputed in full each step."""
    device = next(model.parameters()).device
    seqs = [list(p) for p in prompts]
    for _ in progress(range(max_tokens), desc="recompute", enabled=use_tqdm):
        lens = [len(s) for s in seqs]
        cu_seqlens = torch.tensor([0] + lens, device=device).cumsum(0).to(torch.int32)
        input_ids = torch.tensor([t for s in seqs for t in s], device=device)
        positions = torch.cat([torch.arange(n, device=device) for n in lens])
        hidden = model(input_ids, positions, NoCacheMetadata(cu_seqlens, max(lens)))
        next_tokens = model.compute_logits(hidden[cu_seqlens[1:].long() - 1]).argmax(-1).tolist()
        for s, t in zip(seqs, next_tokens):
            s.append(t)
    return [s[len(p):] for s, p in zip(seqs, prompts)]


def hf_model_for(source, device, dtype):
    """The transformers model of a ModelSource (models.loader.resolve_model): the folder's
    weights, or random weights of a shape-only preset, created on the device."""
    from transformers import AutoConfig, AutoModelForCausalLM
    if source.folder is not None:
        return AutoModelForCausalLM.from_pretrained(source.folder, dtype=dtype).to(device).eval()
    from minivllm.models.presets import PRESETS
    preset = next(p for p in PRESETS.values() if p.config is not None and
                  p.config["hidden_size"] == source.config.hidden_size and
                  p.config["num_hidden_layers"] == source.config.num_layers)
    config = AutoConfig.for_model(**{k: v for k, v in preset.config.items() if k != "architectures"})
    with torch.device(device):
        return AutoModelForCausalLM.from_config(config, dtype=dtype).eval()


def _exactly(max_tokens: int) -> dict:
    # min_new_tokens suppresses EOS, so every request produces exactly max_tokens tokens.
    return dict(max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False)


@torch.inference_mode()
def hf_generate_sequential(hf_model, prompts, max_tokens: int, use_tqdm: bool = False) -> list[list[int]]:
    device = hf_model.device
    outs = []
    for p in progress(prompts, desc="HF one at a time", enabled=use_tqdm):
        ids = torch.tensor([p], device=device)
        out = hf_model.generate(ids, attention_mask=torch.ones_like(ids), **_exactly(max_tokens))
        outs.append(out[0, len(p):].tolist())
    return outs


@torch.inference_mode()
def hf_generate_static_batch(hf_model, prompts, max_tokens: int, batch_size: int, pad_token_id: int = 0,
                             use_tqdm: bool = False) -> list[list[int]]:
    """Left-padded batches of `batch_size`; each batch runs until all its requests are done."""
    device = hf_model.device
    outs = []
    for start in progress(range(0, len(prompts), batch_size), desc="HF static batch", enabled=use_tqdm):
        batch = prompts[start:start + batch_size]
        width = max(len(p) for p in batch)
        ids = torch.tensor([[pad_token_id] * (width - len(p)) + p for p in batch], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=device)
        gen = hf_model.generate(ids, attention_mask=mask, pad_token_id=pad_token_id, **_exactly(max_tokens))
        outs += gen[:, width:].tolist()
    return outs


def hf_generate_continuous(hf_model, prompts, max_tokens: int | list[int]) -> list[list[int]]:
    """transformers' own continuous batching (paged KV cache, requests join as others finish).

    `max_tokens` may differ per request (W2), so requests go through the batching manager one by
    one, as `generate_batch` does inside. Not under inference_mode: the manager's loop runs on
    another thread and resets tensors made here, which inference tensors refuse on the GPU."""
    from transformers import GenerationConfig
    lengths = [max_tokens] * len(prompts) if isinstance(max_tokens, int) else list(max_tokens)
    # eos_token_id=-1 (no token has it) switches end-of-sequence off: every request produces its max_tokens tokens.
    config = GenerationConfig(max_new_tokens=max(lengths), do_sample=False, eos_token_id=-1, pad_token_id=0)
    sizes = None
    if hf_model.device.type == "cpu":
        # transformers sizes its cache and batch from the GPU's free memory whenever a GPU is present, even for a
        # model on the CPU, whose pinned buffers then do not fit. A model on the CPU gets what these requests need.
        from transformers import ContinuousBatchingConfig
        defaults = ContinuousBatchingConfig()
        page = getattr(defaults, "page_size", None) or defaults.block_size  # block_size before transformers 5.2x
        sizes = ContinuousBatchingConfig(num_blocks=sum(-(-(len(p) + n) // page) for p, n in zip(prompts, lengths)),
                                         max_batch_tokens=max(len(p) for p in prompts) + len(prompts))
    done = {}
    with torch.no_grad(), hf_model.continuous_batching_context_manager(
            generation_config=config, continuous_batching_config=sizes, block=True, timeout=5) as manager:
        for i, (prompt, n) in enumerate(zip(prompts, lengths)):
            manager.add_request(list(prompt), request_id=f"req_{i}", max_new_tokens=n)
        bar = progress(total=sum(lengths), desc="HF continuous batching (tokens of finished requests)")
        while len(done) < len(prompts):
            result = manager.get_result(timeout=1)
            if result is not None and result.is_finished():
                done[result.request_id] = result.generated_tokens
                bar.update(len(result.generated_tokens))
            elif result is None and not manager.is_running():
                break
        bar.close()
    outs = [list(done.get(f"req_{i}", [])) for i in range(len(prompts))]
    if [len(o) for o in outs] != lengths:
        raise RuntimeError("transformers' continuous batching did not produce every requested token "
                           f"({sum(map(len, outs))} of {sum(lengths)}); its log says why")
    return outs
