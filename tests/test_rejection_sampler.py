"""Rejection sampling keeps the target's distribution: a statistical test that a wrong rule fails.

On a vocabulary of 6 tokens, with random target distributions p and draft distributions q (or the
n-gram proposer's one-hot guesses), 40,000 independent rows go through `rejection_sample` at once.
The first emitted token must follow p_0, and, among rows whose first guess was kept, the second must
follow p_1: a chi-square test against each (p-value threshold 1e-4, so a correct rule fails about once
in ten thousand runs). The same test run on two mutated rules (keeping every guess; drawing a rejected
position from p instead of the residual) must fail, which shows the test can tell. (Treating a draft
model's guesses as sure ones, q forgotten, is not such a mutation: that rule is exact too, only slower.)
"""
import pytest
import torch

from minivllm.worker.rejection_sampler import rejection_sample
from minivllm.worker.sampler import sampling_probs

V, K, N = 6, 3, 40_000
# The chi-square critical value for 5 degrees of freedom (V - 1) at p = 1e-4.
CHI2_CRITICAL_DF5 = 25.74


def chi_square(samples: torch.Tensor, p: torch.Tensor) -> float:
    observed = torch.bincount(samples, minlength=V).double()
    expected = p.double() * len(samples)
    keep = expected > 0
    assert observed[~keep].sum() == 0, "a token of probability 0 was emitted"
    return float(((observed[keep] - expected[keep]) ** 2 / expected[keep]).sum())


def draw(seed: int, deterministic_draft: bool):
    g = torch.Generator().manual_seed(seed)
    p = torch.rand(K + 1, V, generator=g).pow(3)
    p[1, 2] = 0.0  # a token the target never picks
    p = p / p.sum(-1, keepdim=True)
    q = torch.rand(K, V, generator=g).pow(2)
    q = q / q.sum(-1, keepdim=True)
    if deterministic_draft:  # the n-gram proposer: the same guess every time
        drafts = torch.randint(V, (K,), generator=g).expand(N, K).clone()
        draft_probs = None
    else:
        drafts = torch.multinomial(q, N, replacement=True, generator=g).T.contiguous()
        draft_probs = q.expand(N, K, V)
    uniforms = torch.rand(N, K, generator=g)
    races = torch.empty(N, V).exponential_(generator=g)
    return p, drafts, draft_probs, uniforms, races


def run_and_test(rule, seed: int, deterministic_draft: bool) -> tuple[float, float]:
    p, drafts, draft_probs, uniforms, races = draw(seed, deterministic_draft)
    tokens, emitted = rule(p.expand(N, K + 1, V), drafts, torch.full((N,), K), draft_probs, uniforms, races)
    first = chi_square(tokens[:, 0], p[0])
    kept = emitted > 1  # the first guess was kept: the second token follows p_1
    second = chi_square(tokens[kept, 1], p[1])
    return first, second


@pytest.mark.parametrize("deterministic_draft", [False, True], ids=["draft-model", "ngram"])
@pytest.mark.parametrize("seed", [0, 1])
def test_emitted_tokens_follow_the_target_distribution(seed, deterministic_draft):
    first, second = run_and_test(rejection_sample, seed, deterministic_draft)
    assert first < CHI2_CRITICAL_DF5 and second < CHI2_CRITICAL_DF5, (first, second)


def keep_every_guess(probs, drafts, num_drafts, draft_probs, uniforms, races):
    return rejection_sample(probs, drafts, num_drafts, draft_probs, torch.zeros_like(uniforms), races)


def residual_from_p(probs, drafts, num_drafts, draft_probs, uniforms, races):
    """Keeps guesses by the right rule, but draws a rejected position from p instead of max(p - q, 0)."""
    tokens, emitted = rejection_sample(probs, drafts, num_drafts, draft_probs, uniforms, races)
    rows, last = torch.arange(len(tokens)), emitted - 1
    redrawn = (probs[rows, last] / races).argmax(-1)
    tokens[rows, last] = torch.where(last < num_drafts, redrawn, tokens[rows, last])
    return tokens, emitted


@pytest.mark.parametrize("rule", [keep_every_guess, residual_from_p])
def test_a_wrong_rule_fails_the_same_test(rule):
    first, _ = run_and_test(rule, 0, deterministic_draft=False)
    assert first > CHI2_CRITICAL_DF5, first


def test_greedy_keeps_guesses_equal_to_the_argmax_then_corrects():
    logits = torch.tensor([[0.0, 5.0, 1.0], [4.0, 0.0, 1.0], [0.0, 0.0, 9.0]])
    probs = sampling_probs(logits, torch.zeros(3), torch.full((3,), -1), torch.ones(3))
    tokens, emitted = rejection_sample(probs[None], torch.tensor([[1, 2]]), torch.tensor([2]), None,
                                       torch.rand(1, 2), torch.empty(1, 3).exponential_())
    assert tokens[0, :emitted[0]].tolist() == [1, 0]  # guess 1 is the argmax; guess 2 is not: the argmax, 0


def test_all_guesses_kept_gives_one_more_token():
    logits = torch.tensor([[0.0, 9.0], [9.0, 0.0], [0.0, 9.0]])
    probs = sampling_probs(logits, torch.zeros(3), torch.full((3,), -1), torch.ones(3))
    tokens, emitted = rejection_sample(probs[None], torch.tensor([[1, 0]]), torch.tensor([2]), None,
                                       torch.rand(1, 2), torch.empty(1, 2).exponential_())
    assert tokens[0, :emitted[0]].tolist() == [1, 0, 1]

