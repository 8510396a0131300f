"""Structured outputs whose strings hold characters outside the BMP (an emoji), quotes, backslashes and
newlines: the output's text is exactly the string (the real SmolLM2, greedy, float32, CPU).

The bug this catches: a `choice` was written into its EBNF grammar with `json.dumps`, which escapes "🎉" as
the UTF-16 pair \\ud83c\\udf89; xgrammar reads those as two characters, so the output came back as U+FFFD
characters. The spec also goes through msgpack (msgspec), as it does on its way to
a server's engine core.
"""
import json

import msgspec
import pytest

from minivllm import LLM, SamplingParams, StructuredOutputsParams

pytest.importorskip("xgrammar")

EMOJI = "🎉 Déjà vu"
SPECS = {
    "choice": dict(choice=[EMOJI]),
    "regex": dict(regex=EMOJI),
    "json const": dict(json={"const": EMOJI}),
    "grammar": dict(grammar=f'root ::= "{EMOJI}"'),
}


@pytest.fixture(scope="module")
def llm():
    return LLM("smollm2-135m", max_model_len=256, num_kv_blocks=64, dtype="float32", device="cpu")


def generate(llm, spec: StructuredOutputsParams) -> str:
    spec = msgspec.msgpack.decode(msgspec.msgpack.encode(spec), type=StructuredOutputsParams)  # as to a core
    params = SamplingParams(temperature=0, max_tokens=40, structured_outputs=spec)
    out = llm.generate(["Repeat after me: party time!"], params, use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "stop"
    return out.text


@pytest.mark.parametrize("kind", SPECS)
def test_an_emoji_comes_back_whole(llm, kind):
    """Planted (and real) bug: `_choice_grammar` built with `json.dumps(c)` (ASCII escapes) instead of
    `_ebnf_literal(c)`: the choice's emoji comes back as U+FFFD characters."""
    text = generate(llm, StructuredOutputsParams(**SPECS[kind]))
    assert (json.loads(text) if kind == "json const" else text) == EMOJI


@pytest.mark.parametrize("choice", ['say "hi"', "back\\slash", "two\nlines\tand a tab", "🎉"])
def test_a_choice_with_quotes_backslashes_and_newlines(llm, choice):
    """A single choice is the output, character for character, whatever it holds."""
    assert generate(llm, StructuredOutputsParams(choice=[choice])) == choice


def test_the_model_picks_among_emoji_choices(llm):
    """Several choices that share their first characters and differ in an emoji only."""
    choices = ["party 🎉", "party 🎂", "party 🥳"]
    assert generate(llm, StructuredOutputsParams(choice=choices)) in choices
