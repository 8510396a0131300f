"""The numbers and names of the two documents that started minivllm, written once.

The notebooks quote the post and the talk again and again: the baseline's tokens per second, vLLM's
385, the 1000 customers, reading speed. Written in each notebook by hand they drifted apart (17.5 in
one notebook, 18 in another; 1.3 tokens per word here, 1.33 there). Every notebook and helper imports
them from here instead, and the notebooks' prose states the same values.

    >>> from minivllm_lab.constants import POST_HF_TOK_S, reading_tok_s
    >>> POST_HF_TOK_S, round(reading_tok_s(), 2)
    (17.5, 5.33)

The names and descriptions are README's ("Two documents started it").
"""
from __future__ import annotations

# ---- The post ----------------------------------------------------------------------------------------
# README: "a LinkedIn post by an engineer deploying Mistral-7B-Instruct as a chat assistant for 1000
# customers (Hugging Face `generate` gave 17-18 tokens/s; vLLM on a batch of 60 queries 385 tokens/s;
# answers must stream at least as fast as people read)".
POST_NAME = "the LinkedIn post on serving Mistral-7B-Instruct to 1000 customers"
POST_DESCRIPTION = ("a LinkedIn post by an engineer deploying Mistral-7B-Instruct as a chat assistant "
                    "for 1000 customers")
POST_MODEL = "Mistral-7B-Instruct"
POST_GPU = "A100"                 # the GPU notebooks 00 and 06 name for the post's runs (README names none)
POST_CUSTOMERS = 1000             # the post: the assistant's 1000 customers
POST_HF_TOK_S_RANGE = (17, 18)    # the post: Hugging Face `generate`, one request at a time, "17-18 tokens/s"
POST_HF_TOK_S = sum(POST_HF_TOK_S_RANGE) / 2  # 17.5: one number for arithmetic, the middle of the post's range
POST_VLLM_TOK_S = 385             # the post: vLLM on a batch of 60 queries
POST_VLLM_BATCH = 60              # the post: the batch of queries vLLM served (the workload W1 has 60 requests)
POST_LATENCY_RATIO = 15           # the post: vLLM's mean latency 15x lower than one at a time (notebook 06)
ANSWER_TOKENS = 150               # W1's answer length (DESIGN's W1, minivllm_lab.bench.workloads.w1)

# Reading speed: the post asks that answers stream at least as fast as people read, about 240 words a
# minute. Tokens per word is a rule of thumb for BPE tokenizers such as Mistral's and Llama's (a token
# is about 3/4 of an English word); 4/3 is the value the serving SLO (0.19 s per token) is built on.
READING_WORDS_PER_MINUTE = 240
TOKENS_PER_WORD = 4 / 3


def reading_tok_s(words_per_minute: float = READING_WORDS_PER_MINUTE,
                  tokens_per_word: float = TOKENS_PER_WORD) -> float:
    """Tokens per second a reader consumes: 240 words a minute is 4 words/s, about 5.3 tokens/s."""
    return words_per_minute / 60 * tokens_per_word


# ---- The talk ----------------------------------------------------------------------------------------
# README: "Exploring the Space of Throughput, Latency, and Cost in LLM Inference with Mistral AI"
# (grouped-query attention, the KV cache, paged attention, sliding windows, chunked prefill, removing
# Python overhead).
TALK_TITLE = "Exploring the Space of Throughput, Latency, and Cost in LLM Inference with Mistral AI"
TALK_NAME = f'the talk "{TALK_TITLE}"'
# The talk: Mistral-7B without GQA on an A10 with 24 GB fits a batch of about 5 sequences of 4K tokens
# (notebooks 02 and 03 check it against the KV-cache arithmetic).
TALK_A10_MEMORY_GB = 24
TALK_A10_CONTEXT_TOKENS = 4096
TALK_A10_BATCH_WITHOUT_GQA = 5
# The talk: paged KV blocks of 16-32 tokens, as the project's notes summarise it (README does not list it);
# minivllm uses 16.
TALK_BLOCK_SIZES = (16, 32)
