"""Structured outputs offline: the grammar's mask, the matcher's progress, and answers that always parse.

The mask is checked alone first (random logits and bitmasks: a masked token is never sampled); then the real
SmolLM2 (it must write sensible JSON for the lesson to mean anything) under JSON schemas, a regex and choices,
with the overlap on and off, through AsyncLLM, with speculative decoding; bad specs fail alone at the door.
"""
import asyncio
import json
import random
import re

import jsonschema
import pytest
import torch

from minivllm import LLM, AsyncLLM, SamplingParams, StructuredOutputsParams
from minivllm.structured_output import GrammarBitmask, allowed_tokens
from minivllm.structured_output.bitmask import mask_logits
from minivllm.worker.sampler import sample

xgr = pytest.importorskip("xgrammar")

SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 24},
                                      "age": {"type": "integer", "minimum": 0, "maximum": 120}},
     "required": ["name", "age"]},
    {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24},
                                      "country": {"type": "string", "enum": ["France", "Japan", "Peru"]},
                                      "population": {"type": "integer"}},
     "required": ["city", "country"]},
    {"type": "object", "properties": {"order_id": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{4}$"},
                                      "urgent": {"type": "boolean"},
                                      "tags": {"type": "array", "items": {"type": "string", "maxLength": 12},
                                               "maxItems": 3}},
     "required": ["order_id", "urgent", "tags"]},
]
TOPICS = ["a customer", "a city you like", "an order to ship", "a friend", "a trip", "a support ticket", "a pet",
          "a book", "a football team", "a holiday", "a museum", "a restaurant"]


@pytest.fixture(scope="module")
def llm():
    return LLM("smollm2-135m", max_model_len=512, num_kv_blocks=256, dtype="float32", device="cpu")


def chat_prompt(llm, text: str) -> str:
    return llm.tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)


def test_masked_tokens_are_never_sampled():
    torch.manual_seed(0)
    B, V = 6, 100
    logits = torch.randn(B, V) * 5
    bitmask = torch.randint(-2**31, 2**31 - 1, (3, (V + 31) // 32), dtype=torch.int32)
    bitmask[2] = 0
    bitmask[2, 1] = 1 << 3  # row 2 of the mask allows token 35 alone
    mask = GrammarBitmask([1, 3, 4], bitmask)
    masked = mask.apply(logits)  # xgrammar's kernel on a CPU; the torch version (any other device) agrees
    assert torch.equal(masked, mask_logits(logits, mask.rows, bitmask))
    full = GrammarBitmask(list(range(B)), bitmask.repeat(2, 1))
    assert torch.equal(full.apply(logits), mask_logits(logits, full.rows, full.bitmask))
    for r, row in enumerate(mask.rows):
        allowed = set(allowed_tokens(bitmask[r], V).tolist())
        assert all((masked[row, t] > float("-inf")) == (t in allowed) for t in range(V))
    assert allowed_tokens(bitmask[2], V).tolist() == [35]
    assert torch.equal(masked[[0, 2, 5]], logits[[0, 2, 5]])  # unconstrained rows untouched
    assert torch.equal(mask.apply(torch.randn(10, V), row_index=[0, 2, 3, 5, 7, 9])[[2, 5, 7]].isinf().any(1),
                       torch.tensor([True, True, True]))  # a verify step's rows: sequence i at row_index[i]
    for seed in range(20):  # sampled at temperature 1 (and greedy): always an allowed token
        g = torch.Generator().manual_seed(seed)
        for temperature in (0.0, 1.0):
            tokens = sample(masked, torch.full((B,), temperature), torch.full((B,), -1), torch.ones(B), [None] * B, g)
            for r, row in enumerate(mask.rows):
                assert tokens[row].item() in set(allowed_tokens(bitmask[r], V).tolist())


def schema_requests(llm, n: int, seed: int):
    rng = random.Random(seed)
    requests = []
    for i in range(n):
        schema = SCHEMAS[i % len(SCHEMAS)]
        prompt = chat_prompt(llm, f"Describe {rng.choice(TOPICS)} as JSON with the keys "
                                  f"{', '.join(schema['properties'])}.")
        params = SamplingParams(temperature=rng.choice([0.0, 0.7, 1.0]), seed=rng.randrange(10**6), max_tokens=96,
                                structured_outputs=StructuredOutputsParams(json=schema))
        requests.append((prompt, params, schema))
    return requests


def test_every_answer_under_a_json_schema_validates(llm):
    """16 requests in one batch: random prompts, seeds, temperatures, three schemas. Every answer closes its JSON
    before max_tokens (the grammar then allows only the end of sequence: finish_reason "stop") and validates.
    The schemas bound their strings and arrays, so that no answer can run into max_tokens (then it would be
    cut, and could not parse: vLLM has the same limit)."""
    requests = schema_requests(llm, 16, seed=0)
    outs = llm.generate([p for p, _, _ in requests], [s for _, s, _ in requests], use_tqdm=False)
    for (_, _, schema), out in zip(requests, outs):
        assert out.outputs[0].finish_reason == "stop", out.outputs[0].text
        jsonschema.validate(json.loads(out.outputs[0].text), schema)
    stats = llm.llm_engine.get_stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"]


def test_the_matcher_follows_what_was_sampled_with_the_overlap_on_and_off(llm):
    """With the overlap on or off, every answer's tokens are exactly what a fresh matcher of its grammar accepts,
    ending with the grammar complete; greedy answers are the same either way."""
    engine = llm.llm_engine
    requests = schema_requests(llm, 6, seed=1)
    greedy = [SamplingParams(temperature=0, max_tokens=96, structured_outputs=p.structured_outputs)
              for _, p, _ in requests]
    answers = []
    for async_scheduling in (True, False):
        engine.config.async_scheduling = async_scheduling
        try:
            outs = llm.generate([p for p, _, _ in requests], greedy, use_tqdm=False)
        finally:
            engine.config.async_scheduling = True
        for params, out in zip(greedy, outs):
            matcher = xgr.GrammarMatcher(engine.structured_output.compile(params.structured_outputs),
                                         override_stop_tokens=engine.structured_output.eos_token_ids)
            assert all(matcher.accept_token(t) for t in out.outputs[0].token_ids) and matcher.is_terminated()
        answers.append([out.outputs[0].token_ids for out in outs])
    assert answers[0] == answers[1]


def test_regex_choice_and_grammar(llm):
    specs = [StructuredOutputsParams(regex=r"[0-9]{3}-[0-9]{4}"), StructuredOutputsParams(choice=["Paris", "Lyon"]),
             StructuredOutputsParams(grammar='root ::= "yes" | "no"'), StructuredOutputsParams(json_object=True)]
    prompts = ["Give me a phone number.", "Which city is the capital of France?", "Is water wet?",
               "Describe a cat in JSON."]
    outs = llm.generate([chat_prompt(llm, p) for p in prompts],
                        [SamplingParams(temperature=0, max_tokens=64, structured_outputs=s) for s in specs],
                        use_tqdm=False)
    texts = [o.outputs[0].text for o in outs]
    assert re.fullmatch(r"[0-9]{3}-[0-9]{4}", texts[0])
    assert texts[1] in ("Paris", "Lyon") and texts[2] in ("yes", "no")
    assert all(o.outputs[0].finish_reason == "stop" for o in outs[:3])
    if outs[3].outputs[0].finish_reason == "stop":
        assert isinstance(json.loads(texts[3]), dict)


def test_a_grammar_is_compiled_once(llm):
    manager = llm.llm_engine.structured_output
    spec = {"type": "object", "properties": {"answer": {"type": "string", "enum": ["a", "b"]}}, "required": ["answer"]}
    before = manager.num_compilations
    llm.generate([chat_prompt(llm, "a or b?")] * 3,
                 SamplingParams(temperature=0, max_tokens=16, structured_outputs=StructuredOutputsParams(json=spec)),
                 use_tqdm=False)
    llm.generate(chat_prompt(llm, "b or a?"),
                 SamplingParams(max_tokens=16, structured_outputs=StructuredOutputsParams(json=json.dumps(spec))),
                 use_tqdm=False)
    assert manager.num_compilations == before + 1


@pytest.mark.parametrize("spec, problem", [
    (dict(json={"type": "foo"}), r"invalid JSON schema.*Unsupported type"),
    (dict(json='{"type": '), "not valid JSON"),
    (dict(json=[1]), "a JSON schema"),
    (dict(regex="a("), r"invalid regex.*parenthesis"),
    (dict(grammar='root ::= "a" |'), "invalid grammar"),
    (dict(choice=[]), "choice must be"),
    (dict(choice=["a", 3]), "choice must be"),
    (dict(regex="a", choice=["a"]), "exactly one of"),
])
def test_a_bad_spec_is_refused_when_added_and_nothing_else_is_lost(llm, spec, problem):
    engine = llm.llm_engine
    engine.add_request("good", chat_prompt(llm, "Hi"), SamplingParams(temperature=0, max_tokens=4))
    with pytest.raises(ValueError, match=problem):
        engine.add_request("bad", chat_prompt(llm, "Hi"),
                           SamplingParams(max_tokens=4, structured_outputs=StructuredOutputsParams(**spec)))
    outs = []
    while engine.has_unfinished_requests():
        outs += [o for o in engine.step() if o.finished]
    assert [o.request_id for o in outs] == ["good"]
    assert engine.get_stats()["num_free_blocks"] == engine.get_stats()["num_total_blocks"]


def test_structured_outputs_must_be_the_params_object():
    with pytest.raises(ValueError, match="structured_outputs must be a StructuredOutputsParams"):
        SamplingParams(structured_outputs={"json": {}})


def test_with_speculation_constrained_requests_get_no_guesses():
    llm = LLM("smollm2-135m", max_model_len=512, num_kv_blocks=128, dtype="float32", device="cpu",
              speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    spec = StructuredOutputsParams(json=SCHEMAS[0])
    prompt = chat_prompt(llm, "Describe a customer as JSON with the keys name, age.")
    out = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=64, structured_outputs=spec),
                       use_tqdm=False)[0]
    assert llm.llm_engine.get_stats()["num_draft_tokens"] == 0
    jsonschema.validate(json.loads(out.outputs[0].text), SCHEMAS[0])


SHORT = {"type": "object", "properties": {"country": {"type": "string", "enum": ["France", "Japan", "Peru"]}},
         "required": ["country"]}  # a few tokens: AsyncLLM's core process on a shared 2-core CPU is slow


@pytest.mark.parametrize("engine_core_process", [True, False])
def test_through_async_llm(llm, engine_core_process):
    """The spec crosses to the engine core (in its process: as typed fields) and is compiled there."""
    engine = AsyncLLM("smollm2-135m", engine_core_process=engine_core_process, max_model_len=512,
                      num_kv_blocks=64, dtype="float32", device="cpu")
    params = SamplingParams(temperature=0, max_tokens=16, structured_outputs=StructuredOutputsParams(json=SHORT))
    prompt = chat_prompt(llm, "Where is Lima? Answer as JSON.")

    async def main():
        with pytest.raises(ValueError, match="invalid regex"):  # refused by the frontend, before the core
            await engine.add_request("bad", prompt, SamplingParams(structured_outputs=StructuredOutputsParams(
                regex="(")))
        last = None
        async for out in engine.generate(prompt, params, request_id="r"):
            last = out
        return last

    try:
        last = asyncio.run(main())
    finally:
        engine.shutdown()
    offline = llm.generate(prompt, params, use_tqdm=False)[0]
    assert last.outputs[0].token_ids == offline.outputs[0].token_ids
    assert last.outputs[0].finish_reason == "stop"
    jsonschema.validate(json.loads(last.outputs[0].text), SHORT)


def test_n_answers_each_follow_the_grammar_with_their_own_matcher(llm):
    """n > 1 forks after the prompt: each answer gets its own matcher (a fork of the prompt's), so each is valid
    and equals what its seed (seed + i) gives alone; logprobs ride along; every block comes back."""
    schema = {"type": "object", "required": ["city", "rank"], "additionalProperties": False,
              "properties": {"city": {"type": "string", "maxLength": 20}, "rank": {"type": "integer"}}}

    def params(**kw):
        return SamplingParams(temperature=0.9, max_tokens=60, logprobs=2,
                              structured_outputs=StructuredOutputsParams(json=schema), **kw)
    prompt = chat_prompt(llm, "Name a big city and its rank, as JSON.")
    answers = llm.generate(prompt, params(n=3, seed=1), use_tqdm=False)[0].outputs
    alone = [llm.generate(prompt, params(seed=1 + i), use_tqdm=False)[0].outputs[0] for i in range(3)]
    for answer, single in zip(answers, alone):
        assert answer.finish_reason == "stop" and answer.token_ids == single.token_ids
        jsonschema.validate(json.loads(answer.text), schema)
        assert len(answer.logprobs) == len(answer.token_ids)
    stats = llm.llm_engine.get_stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"]
