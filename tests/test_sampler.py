"""The sampler: validation, greedy, top-k/top-p sets, temperature, seeds."""
import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.worker.sampler import apply_top_k_top_p, sample


@pytest.mark.parametrize("kwargs", [dict(temperature=-0.1), dict(top_p=0), dict(top_p=1.5), dict(top_k=0),
                                    dict(top_k=-2), dict(max_tokens=0)])
def test_bad_sampling_params(kwargs):
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)


def draw(logits, n, temperature=1.0, top_k=-1, top_p=1.0, seed=0):
    """n independent draws from one row of logits, batched as n rows."""
    rows = logits.expand(n, -1).clone()
    g = torch.Generator().manual_seed(seed)
    return sample(rows, torch.full((n,), temperature), torch.full((n,), top_k), torch.full((n,), top_p),
                  [None] * n, g)


def test_top_k_never_leaves_the_k_most_likely():
    logits = torch.randn(1, 50)
    allowed = set(logits[0].topk(5).indices.tolist())
    tokens = set(draw(logits, 4000, temperature=2.0, top_k=5).tolist())
    assert tokens <= allowed and len(tokens) == 5


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = torch.tensor([[0.5, 0.3, 0.1, 0.06, 0.04]])
    tokens = set(draw(probs.log(), 4000, top_p=0.85).tolist())
    assert tokens == {0, 1, 2}  # 0.5 + 0.3 < 0.85 <= 0.5 + 0.3 + 0.1
    assert set(draw(probs.log(), 500, top_p=0.01).tolist()) == {0}  # the top token is always kept


def test_filter_matches_a_direct_definition():
    logits = torch.randn(6, 30)
    top_k = torch.tensor([-1, 1, 3, 30, 7, 2])
    top_p = torch.tensor([0.5, 1.0, 0.9, 0.3, 1.0, 0.99])
    filtered = apply_top_k_top_p(logits, top_k, top_p)
    for row in range(6):
        order = logits[row].argsort(descending=True)
        k = 30 if top_k[row] < 1 else int(top_k[row])
        kept_k = order[:k]
        p = logits[row, kept_k].softmax(-1)
        n_p = int((p.cumsum(0) - p < top_p[row]).sum())
        expected = set(kept_k[:n_p].tolist())
        assert set(torch.isfinite(filtered[row]).nonzero().flatten().tolist()) == expected


def test_sampling_follows_the_distribution():
    probs = torch.tensor([[0.6, 0.3, 0.1]])
    counts = torch.bincount(draw(probs.log(), 20000), minlength=3).float() / 20000
    torch.testing.assert_close(counts, probs[0], atol=0.015, rtol=0)


def test_greedy_rows_in_a_mixed_batch():
    logits = torch.randn(4, 20)
    out = sample(logits, torch.tensor([0.0, 1.0, 0.0, 1.0]), torch.full((4,), -1), torch.ones(4), [None] * 4,
                 torch.Generator().manual_seed(0))
    assert out[0] == logits[0].argmax() and out[2] == logits[2].argmax()


def test_seed_gives_the_same_tokens_whatever_the_batch(tiny_llama):
    llm = LLM(tiny_llama[0], max_model_len=64, num_kv_blocks=32, seed=1)
    seeded = SamplingParams(temperature=1.0, max_tokens=10, seed=42, ignore_eos=True)
    alone = llm.generate([[1, 2, 3]], seeded)[0].outputs[0].token_ids
    batch = llm.generate([[9, 9], [1, 2, 3], [4]], [SamplingParams(max_tokens=10, ignore_eos=True), seeded,
                                                   SamplingParams(max_tokens=5, ignore_eos=True)])
    assert batch[1].outputs[0].token_ids == alone
    other = llm.generate([[1, 2, 3]], SamplingParams(temperature=1.0, max_tokens=10, seed=7, ignore_eos=True))
    assert other[0].outputs[0].token_ids != alone
