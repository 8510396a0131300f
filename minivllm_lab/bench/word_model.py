"""A model folder for serving benchmarks with random weights: its config and a word-level tokenizer.

A serving benchmark must send the same prompts to every server, and an OpenAI chat request carries
text, not token ids. With random weights no real tokenizer is needed, so this one is made up: token
i is the word "w{i}", split on spaces. A prompt drawn as token ids (workload W3) is written as words,
and every server turns it back into exactly those ids. The chat template joins the messages' texts,
so a chat request's prompt is the system words then the user words, nothing else.

    write_word_model("/tmp/mistral-7b-words", MISTRAL_7B_CONFIG)   # config.json + tokenizer
    minivllm serve /tmp/mistral-7b-words --load-format dummy

`eos_token_id` is removed from the config: random weights would stop at random places, and a server
that does not know vLLM's `ignore_eos` (transformers' does not) must still answer every token asked.
"""
from __future__ import annotations

import json
from pathlib import Path

CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }} {% endfor %}"


def words(token_ids: list[int]) -> str:
    """Token ids as the text this tokenizer reads back into the same ids."""
    return " ".join(f"w{t}" for t in token_ids)


def write_word_model(folder, config: dict) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = {**config, "eos_token_id": None, "bos_token_id": None}
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    vocab = {f"w{i}": i for i in range(config["vocab_size"])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": CHAT_TEMPLATE, "unk_token": "w0",
        "model_max_length": config.get("max_position_embeddings", 4096)}, indent=2))
    return folder
