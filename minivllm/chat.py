"""Chat messages -> prompt token ids, through the tokenizer's chat template.

Messages are checked first (`check_messages`, also run by the server on each request), so a bad one
gets a clear error rather than a failure inside the template engine.
"""
from __future__ import annotations

import reprlib

ROLES = ("system", "user", "assistant")


def message_text(message: dict, index: int) -> str:
    """The text of one message: a string, or OpenAI's list of {"type": "text", "text": ...} parts."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise ValueError(f"messages[{index}].content must be a string or a list of "
                     f"{{'type': 'text', 'text': str}} parts, got {reprlib.repr(content)}")


def check_messages(messages) -> list[dict]:
    """[{"role", "content"}, ...] with known roles and text content, as plain {"role", "content"} dicts."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list of {'role', 'content'} objects")
    checked = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ValueError(f"messages[{i}] must be an object with 'role' and 'content'")
        role = message.get("role")
        if role not in ROLES:
            raise ValueError(f"messages[{i}].role must be one of {ROLES}, got {reprlib.repr(role)}")
        checked.append({"role": message["role"], "content": message_text(message, i)})
    return checked


def encode_chat(tokenizer, messages) -> list[int]:
    """Token ids of a conversation with the assistant's turn opened."""
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise ValueError("this model has no tokenizer with a chat template: use token-id prompts")
    text = tokenizer.apply_chat_template(check_messages(messages), tokenize=False, add_generation_prompt=True)
    # The template already wrote the special tokens.
    return tokenizer.encode(text, add_special_tokens=False)
