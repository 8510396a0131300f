"""Incremental detokenization: the text grows token by token at O(1) cost per token (vLLM's method).

Decoding one token alone is wrong (a byte-level token may hold half a UTF-8 character; spaces depend on
the token before), decoding everything each step is O(n^2). So two offsets into the ids are kept: the
new text is decode(prefix..end) minus decode(prefix..read), held back while it ends in U+FFFD. Stop
strings are matched here, on the text: the output ends before them, as in OpenAI's API.
"""
from __future__ import annotations

# Enough context for a tokenizer to decide spaces and merges at the join (vLLM uses 5 too).
INITIAL_CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    def __init__(self, tokenizer, prompt_token_ids: list[int], stop: list[str] | None = None):
        self.tokenizer = tokenizer
        # The last prompt tokens give context to the first output tokens (a leading space, say).
        self.ids = list(prompt_token_ids[-INITIAL_CONTEXT_TOKENS:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.text = ""
        self.stop = stop or []
        self._longest_stop = max((len(s) for s in self.stop), default=0)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def add(self, token_id: int) -> bool:
        """Append one token's text; True if a stop string has ended the output."""
        self.ids.append(token_id)
        prefix = self._decode(self.ids[self.prefix_offset:self.read_offset])
        full = self._decode(self.ids[self.prefix_offset:])
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            return False  # nothing printable yet: wait for the rest of the character
        new_text = full[len(prefix):]
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        # Keep the id list short: only the window from prefix_offset on is ever decoded again.
        if self.prefix_offset > 0:
            self.ids = self.ids[self.prefix_offset:]
            self.read_offset -= self.prefix_offset
            self.prefix_offset = 0
        start = max(0, len(self.text) - self._longest_stop + 1)  # a stop string may straddle the join
        self.text += new_text
        return self._truncate_at_stop(start)

    def _truncate_at_stop(self, start: int) -> bool:
        hits = [i for i in (self.text.find(s, start) for s in self.stop) if i != -1]
        if not hits:
            return False
        self.text = self.text[:min(hits)]
        return True
