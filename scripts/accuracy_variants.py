"""Two variants that might lift quantization's top-1 agreement on SmolLM2-135M (float32, a CPU), against the gates
of minivllm_lab.accuracy; neither is in the package.

    python scripts/accuracy_variants.py

1. Weight scales chosen by a clipping search: per output channel, the scale among amax * r / top (r from 1.0 down
   to 0.8) with the smallest squared error of the rounded row, instead of amax / top.
2. The fp8 KV cache with per-tensor scales other than 1.0 (the engine's, as vLLM's without calibration), after the
   K and V magnitudes the model writes on the gates text.
"""
from __future__ import annotations

import torch

import minivllm.layers.quantization as quantization
from minivllm import LLM
from minivllm_lab.accuracy import GATES_TEXT, agreement, quantization_gates, teacher_forced

ARGS = dict(dtype="float32", device="cpu", max_model_len=1024, num_kv_blocks=128)
CLIP_RATIOS = (1.0, 0.98, 0.96, 0.94, 0.92, 0.9, 0.88, 0.85, 0.8)


def clip_searched(weight: torch.Tensor, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    top = quantization.FP8_MAX if kind == "fp8" else quantization.INT8_MAX
    w = weight.float()
    amax = w.abs().amax(dim=1).clamp(min=1e-12)

    def error(scale):  # the squared error of each row rounded with these scales
        s = (w / scale[:, None]).clamp(-top, top)
        rounded = s.round() if kind == "int8" else s.to(torch.float8_e4m3fn).float()
        return ((rounded * scale[:, None] - w) ** 2).sum(1)

    best_scale = amax / top
    best_err = error(best_scale)
    for r in CLIP_RATIOS[1:]:
        scale = amax * r / top
        err = error(scale)
        better = err < best_err
        best_err, best_scale = torch.where(better, err, best_err), torch.where(better, scale, best_scale)
    scaled = w / best_scale[:, None]
    if kind == "int8":
        scaled = scaled.round()
    return scaled.clamp(-top, top).to(quantization.DTYPES[kind]), best_scale


def main() -> None:
    configs = {"fp8": ("fp8", "auto"), "int8": ("int8", "auto")}
    plain = quantization_gates("smollm2-135m", configs=configs, **ARGS)
    original, quantization.quantize_per_channel = quantization.quantize_per_channel, clip_searched
    try:
        clipped = quantization_gates("smollm2-135m", configs=configs, **ARGS)
    finally:
        quantization.quantize_per_channel = original
    for name in configs:
        print(f"{name}: top-1 agreement {plain[name]['top1_agreement']:.3f} with amax scales, "
              f"{clipped[name]['top1_agreement']:.3f} with clip-searched scales")

    reference = LLM("smollm2-135m", **ARGS)
    token_ids = reference.tokenizer.encode(GATES_TEXT.read_text())
    ref_top1, _ = teacher_forced(reference, token_ids)
    written = []
    hooks = [layer.self_attn.attn.register_forward_hook(lambda m, args, out: written.append(args[1:3]))
             for layer in reference.llm_engine.model.model.layers]
    teacher_forced(reference, token_ids)
    for hook in hooks:
        hook.remove()
    for name, values in (("K", torch.cat([k.abs().flatten() for k, _ in written])),
                         ("V", torch.cat([v.abs().flatten() for _, v in written]))):
        print(f"{name}: max {values.max():.2f}, median {values.median():.3f}, below e4m3's smallest normal (2^-6) "
              f"{100 * (values < 2 ** -6).float().mean():.1f}%")
    for scale in (1.0, 0.25, 1 / 16):
        llm = LLM("smollm2-135m", kv_cache_dtype="fp8", **ARGS)
        for layer in llm.llm_engine.model.model.layers:
            layer.self_attn.attn.k_scale = layer.self_attn.attn.v_scale = scale
        top1, _ = teacher_forced(llm, token_ids)
        print(f"fp8 KV, k_scale = v_scale = {scale:g}: top-1 agreement "
              f"{agreement(top1, ref_top1):.3f}")


if __name__ == "__main__":
    main()
