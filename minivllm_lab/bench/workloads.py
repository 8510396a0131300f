"""The offline workloads every benchmark in this project runs, as token-id prompts.

A benchmark is only comparable across notebooks, engines and days if the requests are the same, so
the workloads live here, built from a seeded ``random.Random`` rather than from text: token ids need
no tokenizer, work with dummy weights of any shape, and pin the prompt lengths exactly.

- W1, the post's experiment: 60 requests, prompt lengths uniform in [16, 256], 150 output tokens each.
- W2, nano-vllm's offline benchmark: 256 requests, prompt and output lengths each uniform in [100, 1024],
  drawn exactly as nano-vllm draws them, so its published totals (133,966 output tokens) match.
- W3, serving the post's 1000 customers: 1000 requests that share one 128-token system prompt, each
  followed by its own user part of 16 to 256 tokens, 150 output tokens each (``python -m minivllm_lab.bench.serve``).
- W3-offline: W3's requests all submitted at t=0, one offline generate (``python -m minivllm_lab.bench``).

Run them with ``ignore_eos=True`` so every request produces exactly ``max_tokens`` tokens; otherwise
random weights stop at random places and the token count is no longer the workload's.

Example::

    w = w1(vocab_size=32000)
    len(w.prompts), w.num_output_tokens          # (60, 9000)
    smoke = w1(32000, num_requests=4, max_prompt=32, output_len=8)   # CI-sized version
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in w.max_tokens]
    outputs = llm.generate(w.prompts, params)
"""

import random
from dataclasses import dataclass, replace

# The post's numbers (minivllm_lab.constants): its batch of 60 queries, 150-token answers, 1000 customers.
from ..constants import ANSWER_TOKENS, POST_CUSTOMERS, POST_VLLM_BATCH


@dataclass(frozen=True)
class Workload:
    """A named list of prompts (token ids) and how many tokens to generate for each."""

    name: str
    prompts: list[list[int]]
    max_tokens: list[int]

    def __post_init__(self):
        if len(self.prompts) != len(self.max_tokens):
            raise ValueError(f"{len(self.prompts)} prompts but {len(self.max_tokens)} max_tokens")

    @property
    def num_prompt_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)

    @property
    def num_output_tokens(self) -> int:
        return sum(self.max_tokens)


def lowest_token_id(vocab_size: int) -> int:
    """The lowest id a random prompt draws: min(100, vocab_size // 2)."""
    # The first ids of a vocabulary are special tokens (BOS, EOS, padding, byte fallbacks);
    # a prompt full of them is unlike real text, and engines treat some of them specially.
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be positive, got {vocab_size}")
    return min(100, vocab_size // 2)


def _check_range(name: str, low: int, high: int) -> None:
    if not 1 <= low <= high:
        raise ValueError(f"{name}: need 1 <= min <= max, got [{low}, {high}]")


def w1(
    vocab_size: int,
    num_requests: int = POST_VLLM_BATCH,
    min_prompt: int = 16,
    max_prompt: int = 256,
    output_len: int = ANSWER_TOKENS,
    seed: int = 0,
) -> Workload:
    """W1, the post's 60 queries: prompt lengths uniform in [min_prompt, max_prompt], output_len tokens each.

    Draw order, fixed so the workload never changes under the same arguments: one
    ``random.Random(seed)``; first all prompt lengths (``randint``, both ends included), then the token
    ids of each prompt in turn, uniform in [min(100, vocab_size // 2), vocab_size).
    """
    _check_range("prompt length", min_prompt, max_prompt)
    if output_len < 1:
        raise ValueError(f"output_len must be at least 1, got {output_len}")
    low = lowest_token_id(vocab_size)
    rng = random.Random(seed)
    lengths = [rng.randint(min_prompt, max_prompt) for _ in range(num_requests)]
    prompts = [[rng.randrange(low, vocab_size) for _ in range(n)] for n in lengths]
    return Workload("W1", prompts, [output_len] * num_requests)


# nano-vllm's bench.py draws ids with randint(0, 10000); drawing the same way keeps the generator's
# stream, and so every prompt and output length, identical to theirs.
_NANO_VLLM_MAX_ID = 10000


def w2(
    vocab_size: int,
    num_requests: int = 256,
    min_len: int = 100,
    max_len: int = 1024,
    seed: int = 0,
) -> Workload:
    """nano-vllm's offline benchmark: prompt and output lengths each uniform in [min_len, max_len].

    Draw order is nano-vllm's ``bench.py`` (``seed(0)`` there is ``random.Random(0)`` here): for each
    request its prompt length, then its ids with ``randint(0, 10000)``; then all output lengths. So the
    defaults give nano-vllm's exact lengths (133,966 output tokens, the total in its README) and its
    results compare with ours. Only the ids differ: each drawn x becomes ``low + x % (vocab_size - low)``
    with low = min(100, vocab_size // 2), which skips the special ids and fits any vocabulary.
    """
    _check_range("length", min_len, max_len)
    low = lowest_token_id(vocab_size)
    rng = random.Random(seed)
    span = vocab_size - low
    prompts = [
        [low + rng.randint(0, _NANO_VLLM_MAX_ID) % span for _ in range(rng.randint(min_len, max_len))]
        for _ in range(num_requests)
    ]
    max_tokens = [rng.randint(min_len, max_len) for _ in range(num_requests)]
    return Workload("W2", prompts, max_tokens)


def w3(
    vocab_size: int,
    num_requests: int = POST_CUSTOMERS,
    system_len: int = 128,
    min_user: int = 16,
    max_user: int = 256,
    output_len: int = ANSWER_TOKENS,
    seed: int = 0,
) -> Workload:
    """Serving the post's 1000 customers: every prompt is one shared system prompt of ``system_len``
    tokens followed by that customer's own user part, uniform in [min_user, max_user] tokens;
    output_len tokens each. The shared prefix is what a prefix cache can reuse across customers.

    Draw order, fixed as in W1: one ``random.Random(seed)``; first the system prompt's ids, then all
    user lengths (``randint``, both ends included), then the ids of each user part in turn; every id
    uniform in [min(100, vocab_size // 2), vocab_size).
    """
    _check_range("user length", min_user, max_user)
    if system_len < 0 or output_len < 1:
        raise ValueError(f"need system_len >= 0 and output_len >= 1, got {system_len} and {output_len}")
    low = lowest_token_id(vocab_size)
    rng = random.Random(seed)
    system = [rng.randrange(low, vocab_size) for _ in range(system_len)]
    lengths = [rng.randint(min_user, max_user) for _ in range(num_requests)]
    prompts = [system + [rng.randrange(low, vocab_size) for _ in range(n)] for n in lengths]
    return Workload("W3", prompts, [output_len] * num_requests)


def w3_offline(vocab_size: int, **sizes) -> Workload:
    """W3's requests (same arguments as ``w3``) submitted all at once: the serving workload as an
    offline batch job. Named "W3-offline", one word, because ``base_workload`` keeps a name's first
    word: its rows and its roofline must not be mistaken for W3's."""
    return replace(w3(vocab_size, **sizes), name="W3-offline")


def base_workload(name: str) -> str:
    """The workload a row measured a part of: "W1 (first 6)" -> "W1" (rooflines are per workload)."""
    return name.split(" ")[0]
