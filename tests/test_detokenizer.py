"""Incremental detokenization and stop strings, with the real SmolLM2 tokenizer."""
import random

import pytest

from minivllm import LLM, SamplingParams
from minivllm.core.detokenizer import IncrementalDetokenizer


@pytest.fixture(scope="module")
def llm():
    return LLM("smollm2-135m", max_model_len=256, num_kv_blocks=64)


def test_incremental_text_equals_the_whole_decode(llm):
    tok = llm.tokenizer
    rng = random.Random()
    seed = rng.randrange(10**6)
    rng.seed(seed)
    text = "Héllo wörld! 你好，世界 🙂🚀 café\n\tdef f(x): return x**2  # ok"
    ids = tok.encode(text)
    for trial in range(20):
        # real text cut at random places, then random ids (byte fallbacks, half characters, specials)
        out = ids[rng.randrange(len(ids)):] + [rng.randrange(tok.vocab_size) for _ in range(rng.randint(0, 30))]
        # A prompt of whole characters: one that ended in half a character would lend its bytes to the
        # answer's first token, and then the answer alone (decoded below) is not the reference.
        prompt = tok.encode(rng.choice(["Hi", "Question: what is", "你好", "x = 1\n", "🙂 ok"]))
        detok = IncrementalDetokenizer(tok, prompt)
        for t in out:
            detok.add(t)
        full = tok.decode(out, skip_special_tokens=True)
        # A trailing half character waits for its next byte (and so does the rest of its token's text,
        # a leading space say); everything before it is exact.
        held_back = full[len(detok.text):]
        assert full.startswith(detok.text) and (not held_back or (full.endswith("\ufffd") and len(held_back) <= 8)), \
            (seed, trial)


def test_step_outputs_carry_growing_text(llm):
    engine = llm.llm_engine
    engine.add_request("t", "The capital of France is", SamplingParams(temperature=0, max_tokens=12))
    texts = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            texts.append(out.outputs[0].text)
            assert out.outputs[0].text == llm.tokenizer.decode(out.outputs[0].token_ids, skip_special_tokens=True)
    assert len(set(texts)) > 3 and all(b.startswith(a) for a, b in zip(texts, texts[1:]))


def test_stop_strings_end_the_answer_before_them(llm):
    free = llm.generate("The capital of France is", SamplingParams(temperature=0, max_tokens=12))[0].outputs[0]
    assert "." in free.text  # " Paris. ..." on this model
    stop = free.text[free.text.index("."):free.text.index(".") + 1]
    out = llm.generate("The capital of France is",
                       SamplingParams(temperature=0, max_tokens=12, stop=[stop, "never appears"]))[0].outputs[0]
    assert out.finish_reason == "stop" and out.text == free.text[:free.text.index(".")]
    assert len(out.token_ids) < len(free.token_ids)


def test_stop_string_across_tokens(llm):
    tok = llm.tokenizer
    detok = IncrementalDetokenizer(tok, [1], stop=["lo wor"])
    ids = tok.encode("Hello world and more")
    hits = [detok.add(t) for t in ids]
    assert hits.index(True) < len(ids) - 1  # the engine stops at the first hit
    detok = IncrementalDetokenizer(tok, [1], stop=["lo wor"])
    for t in ids[:hits.index(True) + 1]:
        detok.add(t)
    assert detok.text == "Hel"


def test_a_config_asking_for_clean_up_decodes_the_text_as_it_was(tmp_path):
    # Llama 3's tokenizer_config.json says clean_up_tokenization_spaces=True: transformers skips that clean-up
    # for BPE (it would strip the spaces before punctuation) and warns; the loader says False, so no warning.
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from minivllm.models.loader import load_tokenizer
    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    bpe = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    bpe.pre_tokenizer, bpe.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    PreTrainedTokenizerFast(tokenizer_object=bpe, clean_up_tokenization_spaces=True).save_pretrained(tmp_path)
    tok = load_tokenizer(tmp_path)
    assert tok.clean_up_tokenization_spaces is False
    text = "x != y , z . (a ' b)"
    assert tok.decode(tok.encode(text)) == text
