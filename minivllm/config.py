"""Configuration: what the model is (ModelConfig) and how the engine runs it (EngineConfig).

`ModelConfig` keeps what a Llama/Mistral forward needs from a Hugging Face `config.json` (rope
settings at the top level, as transformers 4 writes them, or in transformers 5's `rope_parameters`)::

    >>> cfg = ModelConfig.from_dict({"architectures": ["LlamaForCausalLM"], "vocab_size": 100,
    ...     "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    ...     "num_attention_heads": 4, "num_key_value_heads": 2})
    >>> cfg.head_dim, cfg.num_kv_heads, cfg.rope_theta
    (16, 2, 10000.0)
"""
from __future__ import annotations

import importlib.util
import json
import logging
import os
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch

from .utils import plural, warning_once

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM")
logger = logging.getLogger("minivllm")


@dataclass
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # {"rope_type": "linear" | "llama3", ...} or None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    sliding_window: int | None = None  # attend to the last `sliding_window` tokens only
    attention_bias: bool = False
    mlp_bias: bool = False
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    torch_dtype: str = "float32"

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        archs = d.get("architectures") or []
        arch = archs[0] if archs else {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM"}.get(
            d.get("model_type", ""), "")
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ValueError(f"unsupported architecture {arch!r}; minivllm runs {SUPPORTED_ARCHITECTURES}")
        try:
            hidden, heads = d["hidden_size"], d["num_attention_heads"]
            rope = d.get("rope_parameters") or {}
            scaling = d.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
            if scaling is not None:
                scaling = dict(scaling)
                scaling["rope_type"] = scaling.get("rope_type", scaling.get("type"))
                if scaling["rope_type"] == "default":
                    scaling = None
            eos = d.get("eos_token_id")
            window = d.get("sliding_window") if arch == "MistralForCausalLM" else None
            return cls(
                architecture=arch,
                vocab_size=d["vocab_size"],
                hidden_size=hidden,
                intermediate_size=d["intermediate_size"],
                num_layers=d["num_hidden_layers"],
                num_heads=heads,
                num_kv_heads=d.get("num_key_value_heads") or heads,
                head_dim=d.get("head_dim") or hidden // heads,
                rms_norm_eps=d.get("rms_norm_eps", 1e-6),
                rope_theta=float(d.get("rope_theta", rope.get("rope_theta", 10000.0))),
                rope_scaling=scaling,
                max_position_embeddings=d.get("max_position_embeddings", 2048),
                tie_word_embeddings=d.get("tie_word_embeddings", False),
                sliding_window=window,
                attention_bias=d.get("attention_bias", False),
                mlp_bias=d.get("mlp_bias", False),
                bos_token_id=d.get("bos_token_id"),
                eos_token_ids=[] if eos is None else ([eos] if isinstance(eos, int) else list(eos)),
                torch_dtype=str(d.get("dtype") or d.get("torch_dtype") or "float32"),
            )
        except KeyError as e:
            raise ValueError(f"config.json is missing required field {e}") from None

    @classmethod
    def from_folder(cls, folder: str | Path) -> "ModelConfig":
        path = Path(folder) / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"no config.json in {folder}")
        try:
            return cls.from_dict(json.loads(path.read_text()))
        except json.JSONDecodeError as e:
            raise ValueError(f"malformed {path}: {e}") from None


DTYPE_NAMES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
               "fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def resolve_dtype(dtype: str | torch.dtype, model_config: ModelConfig, device: str = "cpu") -> torch.dtype:
    """The torch dtype for a dtype choice: "auto" is the checkpoint's dtype on a GPU, float32 on a CPU."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        if str(device).startswith("cpu"):
            return torch.float32
        chosen = DTYPE_NAMES.get(model_config.torch_dtype.replace("torch.", ""), torch.float32)
        # No bf16 in hardware before sm_80 (a T4): torch would emulate it and Triton's tl.dot refuses it.
        if chosen == torch.bfloat16 and torch.cuda.get_device_capability(device)[0] < 8:
            chosen = torch.float16
        return chosen
    return DTYPE_NAMES[dtype]


def resolve_kv_cache_dtype(kv_cache_dtype: str, dtype: torch.dtype) -> torch.dtype:
    """The KV cache's torch dtype: "auto" is the model's, "fp8" is e4m3."""
    return torch.float8_e4m3fn if kv_cache_dtype == "fp8" else dtype


SPECULATIVE_METHODS = ("ngram", "draft_model")


@dataclass
class SpeculativeConfig:
    """Speculative decoding (vLLM's `speculative_config`): propose `num_speculative_tokens` draft tokens,
    then verify them in one forward of the target model.

    method "ngram" (prompt lookup: an earlier occurrence of the sequence's last `prompt_lookup_min`..
    `prompt_lookup_max` tokens proposes what followed it) or "draft_model" (a smaller `model` with the
    same vocabulary). `disable_by_batch_size`: no drafts while this many sequences or more are running.
    `adaptive`: each request proposes one draft token more than it has recently had accepted (1 to
    `num_speculative_tokens`)."""
    method: str
    num_speculative_tokens: int
    prompt_lookup_min: int = 1
    prompt_lookup_max: int = 4
    model: str | None = None
    disable_by_batch_size: int | None = None
    adaptive: bool = True

    @classmethod
    def parse(cls, value) -> SpeculativeConfig:
        """A dict (the JSON of --speculative-config) or a SpeculativeConfig -> a checked one."""
        if isinstance(value, cls):
            value = {f.name: getattr(value, f.name) for f in fields(cls)}
        if not isinstance(value, dict):
            raise ValueError(f"speculative_config must be a dict, e.g. {{'method': 'ngram', "
                             f"'num_speculative_tokens': 4}}; got {value!r}")
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - names)
        if unknown:
            raise ValueError(f"speculative_config: unknown {'key' if len(unknown) == 1 else 'keys'} {unknown}; "
                             f"the keys are {sorted(names)}")
        if value.get("method") not in SPECULATIVE_METHODS:
            raise ValueError(f"speculative_config['method'] must be one of {SPECULATIVE_METHODS}, "
                             f"got {value.get('method')!r}")
        if "num_speculative_tokens" not in value:
            raise ValueError("speculative_config needs 'num_speculative_tokens'")
        config = cls(**value)
        for name in ("num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max", "disable_by_batch_size"):
            v = getattr(config, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"speculative_config['{name}'] must be a positive integer, got {v!r}")
        if config.prompt_lookup_min > config.prompt_lookup_max:
            raise ValueError(f"speculative_config: prompt_lookup_min ({config.prompt_lookup_min}) is more than "
                             f"prompt_lookup_max ({config.prompt_lookup_max})")
        if (config.method == "draft_model") != (config.model is not None):
            raise ValueError("speculative_config: 'model' (the draft's folder) goes with method 'draft_model', "
                             "and only with it")
        if not isinstance(config.adaptive, bool):
            raise ValueError(f"speculative_config['adaptive'] must be true or false, got {config.adaptive!r}")
        if config.model is not None and not isinstance(config.model, str):
            raise ValueError(f"speculative_config['model'] must be a string, got {config.model!r}")
        return config


@dataclass
class EngineConfig:
    """The keywords of `LLM(...)`, each a `--kebab-case` flag of `minivllm serve` (described in README.md)."""
    model: str
    dtype: str = "auto"
    device: str | None = None
    load_format: str = "auto"
    block_size: int = 16
    num_kv_blocks: int | None = None
    gpu_memory_utilization: float = 0.9
    # The GPU memory this engine treats as the whole GPU (gpu_memory_utilization is a share of it).
    gpu_memory_limit_bytes: int | None = None
    # None: sized by the device and the caller (`default_batch_limits`).
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None
    enable_prefix_caching: bool | None = None  # None: on, unless the model has a sliding window
    enable_chunked_prefill: bool = True
    # Ablation switches: a contiguous cache (one max_model_len block per sequence), static batching.
    enable_paged_kv: bool = True
    enable_continuous_batching: bool = True
    attention_backend: str = "auto"
    enforce_eager: bool = False
    # vLLM's async scheduling: the CPU prepares step n+1 while the GPU runs step n. None: on, unless speculative
    # decoding needs it off.
    async_scheduling: bool | None = None
    tensor_parallel_size: int = 1
    # A dict of SpeculativeConfig's fields, or None.
    speculative_config: dict | None = None
    seed: int = 0
    # Weights quantized when the model loads, per output channel: None, "fp8" (e4m3) or "int8".
    quantization: str | None = None
    # The KV cache's dtype: "auto" (the model's) or "fp8" (e4m3).
    kv_cache_dtype: str = "auto"
    # The KV pool's size in bytes, on any device (instead of gpu_memory_utilization; num_kv_blocks wins).
    kv_cache_memory_bytes: int | None = None

    def __post_init__(self):
        # Every field is a server flag: check each here with a clear message, not deep inside the engine.
        for name in ("block_size", "max_num_seqs", "tensor_parallel_size", "num_kv_blocks", "max_num_batched_tokens",
                     "max_model_len", "gpu_memory_limit_bytes", "kv_cache_memory_bytes"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.dtype != "auto" and not isinstance(self.dtype, torch.dtype) and self.dtype not in DTYPE_NAMES:
            raise ValueError(f"dtype must be one of 'auto', {sorted(DTYPE_NAMES)}; got {self.dtype!r}")
        self.device = _check_device(self.device)
        if self.load_format not in ("auto", "dummy"):
            raise ValueError(f"load_format must be 'auto' or 'dummy', got {self.load_format!r}")
        if self.attention_backend not in ("auto", "torch", "triton"):
            raise ValueError(f"attention_backend must be 'auto', 'torch' or 'triton', got {self.attention_backend!r}")
        has_triton = importlib.util.find_spec("triton") is not None  # an optional extra
        if self.attention_backend == "auto":
            self.attention_backend = "triton" if torch.device(self.device).type == "cuda" and has_triton else "torch"
        if self.attention_backend == "triton" and not has_triton:
            raise ValueError("attention_backend='triton' needs the triton package: pip install 'minivllm[triton]'")
        if (self.attention_backend == "triton" and torch.device(self.device).type != "cuda"
                and os.environ.get("TRITON_INTERPRET") != "1"):
            raise ValueError("attention_backend='triton' on a CPU needs Triton's interpreter: set "
                             "TRITON_INTERPRET=1 before triton is first imported")
        parsed = torch.device(self.device)
        if parsed.type == "cuda" and (parsed.index or 0) + self.tensor_parallel_size > torch.cuda.device_count():
            raise ValueError(f"tensor_parallel_size={self.tensor_parallel_size} needs that many GPUs from "
                             f"{self.device}; {torch.cuda.device_count()} are visible")
        if not isinstance(self.gpu_memory_utilization, (int, float)) or not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError("gpu_memory_utilization must be in (0, 1]")
        if self.quantization is not None and self.quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization must be None or one of {list(QUANTIZATIONS)}, got {self.quantization!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {list(KV_CACHE_DTYPES)}, got {self.kv_cache_dtype!r}")
        if parsed.type == "cuda" and "fp8" in (self.quantization, self.kv_cache_dtype):
            capability = torch.cuda.get_device_capability(parsed)
            if capability < (8, 9):
                raise ValueError(f"fp8 needs a GPU of compute capability 8.9 or more (this one: {capability[0]}."
                                 f"{capability[1]}): use quantization='int8', and kv_cache_dtype='auto'")
        if self.speculative_config is not None:
            self.speculative_config = SpeculativeConfig.parse(self.speculative_config)
            if self.speculative_config.method == "draft_model" and self.tensor_parallel_size > 1:
                raise ValueError("a draft model runs on rank 0 alone: speculative_config's 'draft_model' does not "
                                 "combine with tensor_parallel_size > 1 (the 'ngram' method does)")
            if self.async_scheduling:  # asked for, explicitly
                # A step's proposals depend on the tokens the previous step accepted.
                warning_once(logger, "speculative decoding runs the CPU's work and the GPU's one after the other: "
                                     "async_scheduling is turned off")
            self.async_scheduling = False
        elif self.async_scheduling is None:
            self.async_scheduling = True

    @property
    def num_speculative_tokens(self) -> int:
        return self.speculative_config.num_speculative_tokens if self.speculative_config else 0


# vLLM V1's defaults: (max_num_seqs, max_num_batched_tokens) by (a large GPU?, who runs the engine). The server
# takes a smaller token budget than offline use: a step's tokens set the time between a client's tokens.
BATCH_LIMIT_DEFAULTS = {
    (True, "llm"): (1024, 16384), (True, "server"): (1024, 8192),
    (False, "llm"): (256, 8192), (False, "server"): (256, 2048),
}
LARGE_GPU_BYTES = 70 * 2**30


def default_batch_limits(device: str, usage_context: str, gpu_memory_limit_bytes: int | None = None) -> tuple[int, int]:
    """(max_num_seqs, max_num_batched_tokens) for `usage_context` "llm" (offline) or "server". Large on a GPU of
    70 GiB or more that is not an A100 (where vLLM measured the larger budget to slow it down); small on others
    (a T4; `gpu_memory_limit_bytes` counts as the GPU's size) and on a CPU."""
    large = False
    if torch.device(device).type == "cuda":
        props = torch.cuda.get_device_properties(torch.device(device))
        memory = min(props.total_memory, gpu_memory_limit_bytes or props.total_memory)
        large = memory >= LARGE_GPU_BYTES and "a100" not in props.name.lower()
    return BATCH_LIMIT_DEFAULTS[large, usage_context]


QUANTIZATIONS = ("fp8", "int8")
KV_CACHE_DTYPES = ("auto", "fp8")


def _check_device(device) -> str:
    """None -> the GPU if there is one; a device that does not exist here -> a clear ValueError."""
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}") from None
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device={device!r} but no CUDA GPU is visible here; use device='cpu'")
        if parsed.index is not None and parsed.index >= torch.cuda.device_count():
            count = torch.cuda.device_count()
            raise ValueError(f"device={device!r} but only {plural(count, 'GPU')} {'is' if count == 1 else 'are'} "
                             "visible")
    elif parsed.type != "cpu":
        raise ValueError(f"device must be 'cpu' or 'cuda[:N]', got {device!r}")
    return str(device)


def engine_config(caller: str, model, engine_args: dict) -> EngineConfig:
    """EngineConfig from a caller's keywords, with the caller's name in the error for a typo."""
    names = [f.name for f in fields(EngineConfig) if f.name != "model"]
    unknown = sorted(set(engine_args) - set(names))
    if unknown:
        raise TypeError(f"{caller}() got unknown keyword {'argument' if len(unknown) == 1 else 'arguments'} "
                        f"{unknown}; the engine's keywords are {names}")
    return EngineConfig(model=str(model), **engine_args)
