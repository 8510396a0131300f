"""Grammars for structured outputs, with xgrammar: checked at the door, compiled once, one matcher per request.

Three moments, as in vLLM's v1 `StructuredOutputManager`:

- `check_structured_outputs(params)`, when a request is added (by the frontend too): the schema, regex or
  grammar is parsed without the vocabulary (milliseconds), so a bad one is a `ValueError` naming the problem
  at once, never a failure in the middle of a step;
- `StructuredOutputManager.grammar_for(params)`, in the engine that runs the request: the grammar is compiled
  against the tokenizer's vocabulary (xgrammar precomputes, for each state of the grammar, which tokens can
  follow) once per distinct spec, and the request gets its own `RequestGrammar`, a matcher at the start;
- `grammar_bitmask(seqs)`, before each step samples: every constrained row gets a bitmask of the tokens its
  grammar allows next (one bit per token, 32 per int32 word), filled on the CPU; the sampler turns the other
  tokens' logits into -inf on the device. After the step, the scheduler makes each matcher accept its token.

xgrammar is an optional dependency (`pip install minivllm[structured]`): it is imported only here, and only
when a request asks for structured output. The tokenizer is loaded the same way: the engine core of a server
has none (its frontend makes the text), so it loads one, and builds xgrammar's `TokenizerInfo` from it, on the
first constrained request.
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable

import torch

from ..structured_outputs_params import StructuredOutputsParams
from .bitmask import GrammarBitmask

PARALLEL_FILL_MIN_ROWS = 128  # from this many constrained rows on, the bitmask is filled on several threads
MAX_CACHED_GRAMMARS = 256  # compiled grammars kept (a server meets the same few schemas again and again)
_XGRAMMAR_NOISE = re.compile(r"^\[[\d:]+\] \S+:\d+: (Check failed: .*? is false: )?")  # "[16:06:29] file.cc:94: "


def _xgrammar():
    try:
        import xgrammar
    except ImportError:
        raise ValueError("structured outputs need xgrammar: pip install 'minivllm[structured]'") from None
    return xgrammar


def _problem(e: Exception) -> str:
    """xgrammar's message without the C++ file and line it comes from."""
    return _XGRAMMAR_NOISE.sub("", str(e).strip())


def _ebnf_literal(text: str) -> str:
    """`text` as an EBNF string literal, whose escapes are JSON's. Characters are written as they are, not as
    `\\uXXXX` (json.dumps's default): xgrammar reads each escape as one character, so a character outside the
    BMP, escaped as a UTF-16 pair, would become two. (A lone surrogate, which UTF-8 cannot hold, stays escaped.)"""
    return json.dumps(text, ensure_ascii=False).encode("utf-8", "backslashreplace").decode("utf-8")


def _choice_grammar(choices: list[str]) -> str:
    return "root ::= " + " | ".join(_ebnf_literal(c) for c in choices)


_ANY_OBJECT = '{"type": "object"}'  # OpenAI's json_object: any JSON object, not any JSON value
_WHAT = {"json": "JSON schema", "regex": "regex", "grammar": "grammar", "choice": "choice", "json_object": "JSON"}


def check_structured_outputs(params: StructuredOutputsParams) -> None:
    """ValueError naming the problem if the spec can never be a grammar (no vocabulary needed)."""
    xgr = _xgrammar()
    kind, text = params.key
    try:
        if kind == "json":
            xgr.Grammar.from_json_schema(text, any_whitespace=False)
        elif kind == "regex":
            xgr.Grammar.from_regex(text)
        elif kind == "grammar":
            xgr.Grammar.from_ebnf(text)
    except RuntimeError as e:
        raise ValueError(f"invalid {_WHAT[kind]} in structured_outputs: {_problem(e)}") from None


class RequestGrammar:
    """One request's place in its grammar (an xgrammar GrammarMatcher)."""

    def __init__(self, matcher):
        self.matcher = matcher

    def fork(self) -> RequestGrammar:
        """Another answer of the same request (n > 1): a matcher at the same place, advanced on its own."""
        return RequestGrammar(self.matcher.fork())

    def accept_token(self, token: int) -> bool:
        """Advance by the sampled token; False if the grammar forbids it (the mask makes that impossible)."""
        return self.matcher.accept_token(token)

    @property
    def is_terminated(self) -> bool:
        """The grammar is complete and its stop token accepted: the answer is done."""
        return self.matcher.is_terminated()


class StructuredOutputManager:
    """The engine's compiler, its cache of compiled grammars, and the bitmask of each step."""

    def __init__(self, vocab_size: int, eos_token_ids, load_tokenizer: Callable[[], object],
                 pin_memory: bool = False):
        self.vocab_size = vocab_size                 # the model's (its logits' width): may exceed the tokenizer's
        self.eos_token_ids = list(eos_token_ids)     # what ends an answer once its grammar is complete
        self._load_tokenizer = load_tokenizer
        self.pin_memory = pin_memory                 # on a GPU: the bitmask's copy to the device does not block
        self._compiler = None
        self._serial_matcher = self._parallel_matcher = None
        self.compiled: dict[tuple[str, str], object] = {}  # by StructuredOutputsParams.key, oldest first
        self.num_compilations = 0

    def _compiler_or_build(self):
        if self._compiler is None:
            xgr = _xgrammar()
            tokenizer = self._load_tokenizer()
            if tokenizer is None:
                raise ValueError("structured outputs need the model's tokenizer; this model folder has none")
            try:  # (a model without end-of-sequence ids: xgrammar looks for the tokenizer's own)
                info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=self.vocab_size,
                                                          stop_token_ids=self.eos_token_ids or None)
            except (ValueError, RuntimeError) as e:
                raise ValueError(f"structured outputs: xgrammar cannot use this model's tokenizer: {e}") from None
            self._compiler = xgr.GrammarCompiler(info, max_threads=torch.get_num_threads())
            self._serial_matcher = xgr.BatchGrammarMatcher(max_threads=1)
            self._parallel_matcher = xgr.BatchGrammarMatcher()  # half the machine's cores
        return self._compiler

    def compile(self, params: StructuredOutputsParams):
        """The compiled grammar of a spec, from the cache if it was compiled before."""
        key = params.key
        compiled = self.compiled.pop(key, None)
        if compiled is None:
            compiler = self._compiler_or_build()
            kind, text = key
            try:
                if kind == "json":
                    compiled = compiler.compile_json_schema(text, any_whitespace=False)
                elif kind == "json_object":
                    compiled = compiler.compile_json_schema(_ANY_OBJECT, any_whitespace=False)
                elif kind == "regex":
                    compiled = compiler.compile_regex(text)
                else:
                    compiled = compiler.compile_grammar(_choice_grammar(json.loads(text)) if kind == "choice"
                                                        else text)
            except RuntimeError as e:
                raise ValueError(f"invalid {_WHAT[kind]} in structured_outputs: {_problem(e)}") from None
            self.num_compilations += 1
            if len(self.compiled) >= MAX_CACHED_GRAMMARS:
                self.compiled.pop(next(iter(self.compiled)))
        self.compiled[key] = compiled  # (re)inserted last: the least recently used goes first
        return compiled

    def grammar_for(self, params: StructuredOutputsParams) -> RequestGrammar:
        xgr = _xgrammar()
        # Without any_whitespace (compiled above) the JSON has json.dumps's spacing: a small model cannot
        # wander into endless newlines. The matcher's stop tokens are the engine's end-of-sequence ids (a model
        # without any ends its answer when the grammar is complete).
        return RequestGrammar(xgr.GrammarMatcher(self.compile(params), override_stop_tokens=self.eos_token_ids or None,
                                                 terminate_without_stop_token=not self.eos_token_ids))

    def grammar_bitmask(self, seqs) -> GrammarBitmask | None:
        """The allowed tokens of every row whose sequence has a grammar (None: no row has one). A sequence that
        finished meanwhile (its token in this step will be dropped) is left unmasked."""
        rows = [i for i, seq in enumerate(seqs) if seq.grammar is not None and not seq.is_finished]
        if not rows:
            return None
        words = (self.vocab_size + 31) // 32
        bitmask = torch.empty((len(rows), words), dtype=torch.int32, pin_memory=self.pin_memory)
        matchers = [seqs[i].grammar.matcher for i in rows]
        # Threads pay off only for many rows: waking them costs more than a few rows. Measured inside the engine on
        # an H200's 16-core host (Mistral-7B shape, a JSON schema on every request): 64 rows took 1.9 ms on 8
        # threads (figures/gpu_diagnose_fill_8_threads.json), 0.9 ms on one (gpu_diagnose.json); 256 rows 1.45 ms
        # on 8 threads (structured_outputs_gpu.json), 4.3 ms on one (..._fill_one_thread.json). vLLM's line: 128.
        matcher = self._parallel_matcher if len(rows) >= PARALLEL_FILL_MIN_ROWS else self._serial_matcher
        matcher.batch_fill_next_token_bitmask(matchers, bitmask)  # in C++, without the GIL
        return GrammarBitmask(rows, bitmask)
