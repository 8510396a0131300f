"""From a model name to a model on the device: folders, hub ids, presets, real or dummy weights.

    >>> source = resolve_model("smollm2-135m")       # a preset, a folder, or a hub id
    >>> model = build_model(source.config, device="cpu", dtype=torch.float32,
    ...                     max_positions=2048, folder=source.folder)

Safetensors tensors are read one by one onto the device, each rank reading only its slice
(`weight_loader`). With `folder=None` the weights stay random ("dummy").
"""
from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from ..config import ModelConfig
from ..layers.quantization import quantize_linear_layers
from .llama import PACKED_WEIGHTS, LlamaForCausalLM
from .presets import PRESETS

IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


@dataclass
class ModelSource:
    config: ModelConfig
    folder: Path | None  # None: a shape-only preset, dummy weights only


def resolve_model(model: str) -> ModelSource:
    if model in PRESETS:
        preset = PRESETS[model]
        if preset.config is not None:
            return ModelSource(ModelConfig.from_dict(preset.config), None)
        folder = preset.build_folder()
        return ModelSource(ModelConfig.from_folder(folder), folder)
    path = Path(model).expanduser()
    if path.is_dir():
        return ModelSource(ModelConfig.from_folder(path), path)
    if path.exists() or model.count("/") != 1:
        raise FileNotFoundError(
            f"model {model!r} is not a folder with config.json, a preset ({', '.join(PRESETS)}), or a hub id")
    return ModelSource(*_from_hub(model))


def _from_hub(repo_id: str):
    from huggingface_hub import snapshot_download
    try:
        folder = Path(snapshot_download(repo_id, allow_patterns=["*.json", "*.safetensors", "tokenizer*"]))
    except Exception as e:  # network down, repo missing, gated: one clear message
        raise FileNotFoundError(f"could not download {repo_id!r} from the Hugging Face hub: {e}") from e
    return ModelConfig.from_folder(folder), folder


@contextmanager
def _create_on(device, dtype):
    """Create parameters directly on `device` in `dtype`: no float32 copy on the host first."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(old)


def build_model(cfg: ModelConfig, device, dtype, max_positions: int, folder: Path | None = None,
                seed: int = 0, backend: str = "torch", quantization: str | None = None) -> LlamaForCausalLM:
    """The model on `device` in `dtype`, its kernels those of `backend` ("torch" or "triton"); the
    checkpoint's weights from `folder`, or seeded random ones (dummy weights) without a folder; its linear
    layers' weights then quantized to `quantization` ("fp8", "int8") if given."""
    torch.manual_seed(seed)  # dummy weights are the same from run to run
    with _create_on(device, dtype):
        model = LlamaForCausalLM(cfg, max_positions, backend)
    if folder is not None:
        load_weights(model, folder)
    if quantization is not None:
        quantize_linear_layers(model, quantization)
    return model.eval().requires_grad_(False)


def _safetensors_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [folder / s for s in shards]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {folder}")
    return files


@torch.no_grad()
def load_weights(model: LlamaForCausalLM, folder: Path) -> None:
    from safetensors import safe_open

    params = dict(model.named_parameters())
    modules = dict(model.named_modules())
    device = next(model.parameters()).device
    # A packed parameter (qkv, gate_up) needs each of its parts.
    missing = set()
    for name in params:
        packed_parts = getattr(modules[name.rsplit(".", 1)[0]], "shards", None)
        missing |= {(name, i) for i in range(len(packed_parts))} if packed_parts else {(name, None)}
    for file in _safetensors_files(folder):
        with safe_open(file, framework="pt", device=str(device)) as f:
            for name in f.keys():
                if name.endswith(IGNORED_SUFFIXES) or (model.config.tie_word_embeddings and name == "lm_head.weight"):
                    continue
                parts = name.split(".")
                target, shard = name, None
                for i, part in enumerate(parts):
                    if part in PACKED_WEIGHTS:
                        packed, shard = PACKED_WEIGHTS[part]
                        target = ".".join(parts[:i] + [packed] + parts[i + 1:])
                if target not in params:
                    raise ValueError(f"unexpected tensor {name!r} in {file.name}: not a Llama/Mistral weight")
                param, module = params[target].data, modules[target.rsplit(".", 1)[0]]
                checkpoint_slice = f.get_slice(name)  # nothing read yet
                split = hasattr(module, "weight_loader")  # a split layer reads this rank's slice only
                expected = tuple(module.checkpoint_shape(param, shard) if split else param.shape)
                shape = tuple(checkpoint_slice.get_shape())
                if shape != expected:
                    raise ValueError(f"{name}: checkpoint shape {shape} != model {expected}")
                if split:
                    module.weight_loader(param, checkpoint_slice, shard)
                else:
                    param.copy_(checkpoint_slice[:])
                missing.discard((target, shard))
    if missing:
        names = sorted(name if part is None else f"{name} (part {part})" for name, part in missing)
        raise ValueError(f"checkpoint in {folder} lacks {names[:5]}{'...' if len(names) > 5 else ''}")


def load_tokenizer(folder: Path | None):
    """transformers' tokenizer when the folder has one, else None (token-id prompts only)."""
    if folder is None or not any((folder / n).exists() for n in ("tokenizer.json", "tokenizer_config.json",
                                                                   "tokenizer.model")):
        return None
    from transformers import AutoTokenizer
    # Llama 3's tokenizer_config.json, among others, sets clean_up_tokenization_spaces=True, a clean-up for
    # WordPiece that would strip real spaces ("x != y" -> "x!= y"): transformers skips it for a BPE tokenizer,
    # as every Llama/Mistral one is, and warns at the first decode. False is what it does, without the warning.
    return AutoTokenizer.from_pretrained(folder, clean_up_tokenization_spaces=False)


def generation_eos_ids(cfg: ModelConfig, folder: Path | None) -> list[int]:
    """End-of-sequence ids: the config's plus generation_config.json's (chat models add theirs)."""
    ids = list(cfg.eos_token_ids)
    gen = folder / "generation_config.json" if folder else None
    if gen is not None and gen.is_file():
        eos = json.loads(gen.read_text()).get("eos_token_id")
        ids += [eos] if isinstance(eos, int) else list(eos or [])
    return sorted(set(ids))
