"""Incremental detokenization: an answer's text grows token by token, at O(1) cost per token.

A streaming client wants the new text of every step. Decoding the whole answer again at each
step costs O(n) per step, O(n^2) per answer. Decoding only the newest token alone is wrong: a
byte-level BPE token can hold half a UTF-8 character (an emoji spans several tokens), and
SentencePiece-style tokenizers drop or add a leading space depending on what precedes the token.

vLLM's answer, used here: keep two offsets into the output ids. `prefix_offset..read_offset` is a
few tokens already turned into text; decode `prefix_offset..end` and `prefix_offset..read_offset`,
and the difference of the two strings is the new text, exactly as the whole decode would give it.
If the new text ends in U+FFFD (an incomplete character), wait for the next token.

Stop strings (`SamplingParams.stop`) are matched here too, on the text: the answer ends before
the stop string, which is not part of the text, as in OpenAI's API.
"""
from __future__ import annotations

import copy

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
        self.num_added = 0  # tokens added so far (the answer's, not the prompt's)
        self._longest_stop = max((len(s) for s in self.stop), default=0)

    def clone(self) -> IncrementalDetokenizer:
        """A copy that grows on its own (the answers of a request with n > 1, forked after the prompt)."""
        other = copy.copy(self)
        other.ids = list(self.ids)
        return other

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def add(self, token_id: int) -> bool:
        """Append one token's text; True if a stop string has ended the answer."""
        self.ids.append(token_id)
        self.num_added += 1
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
