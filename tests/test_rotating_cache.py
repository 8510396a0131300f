"""The rotating KV cache (W slots, token p in slot p % W) gives the same attention as full
attention with a sliding-window mask, token by token, in chunks, for one sequence and a batch."""
import pytest
import torch

from minivllm.attention import torch_ref
from minivllm_lab.rotating_cache import RotatingKVCache, window_attention

HQ, HKV, D = 4, 2, 8


def windowed_reference(q, k, v, window):
    """Full attention of every query over all keys of its sequence, with the window as a mask:
    q [T, Hq, D], k/v [T, Hkv, D] -> [T, Hq, D] (the query at position p sees p - window < j <= p)."""
    T = q.shape[0]
    mask = torch_ref.attention_mask(torch.tensor([T]), torch.tensor([T]), T, T, sliding_window=window)
    return torch_ref.masked_attention(q[None], k[None], v[None], mask, D ** -0.5)[0]


def random_qkv(T, seed):
    g = torch.Generator().manual_seed(seed)  # fresh inputs for every case
    return (torch.randn(T, HQ, D, generator=g, dtype=torch.float64),
            torch.randn(T, HKV, D, generator=g, dtype=torch.float64),
            torch.randn(T, HKV, D, generator=g, dtype=torch.float64))


@pytest.mark.parametrize("window, T", [(1, 9), (3, 20), (5, 23), (16, 16), (7, 50), (40, 13)])
def test_token_by_token_equals_window_mask(window, T):
    """Decode one token at a time: positions cross the window boundary several times (T >> W),
    window 1 (each token sees only itself), and a window longer than the sequence (= full attention)."""
    q, k, v = random_qkv(T, seed=window * 1000 + T)
    cache = RotatingKVCache(window, HKV, D, dtype=torch.float64)
    want = windowed_reference(q, k, v, window)
    for p in range(T):
        cache.write(k[p:p + 1], v[p:p + 1], torch.tensor([p]))
        got = window_attention(q[p][None], cache)[0]
        torch.testing.assert_close(got, want[p], rtol=1e-10, atol=1e-10)
    # The memory never grew, and the slots hold the last min(T, W) positions, in window order.
    assert cache.k.shape == (1, window, HKV, D)
    _, _, positions, valid = cache.in_window_order()
    held = list(range(max(0, T - window), T))
    assert positions[valid].tolist() == held
    assert valid.sum().item() == len(held)


@pytest.mark.parametrize("window", [1, 4, 6])
def test_chunks_longer_and_shorter_than_the_window(window):
    """Writing a chunk of several tokens (a prefill) then querying its last token: the same keys
    survive as when writing one token at a time, also for a chunk longer than the window."""
    T = 31
    q, k, v = random_qkv(T, seed=7 + window)
    want = windowed_reference(q, k, v, window)
    cache = RotatingKVCache(window, HKV, D, dtype=torch.float64)
    start = 0
    for n in [2, 9, 1, 5, 14]:                          # chunk ends at 2, 11, 12, 17, 31
        pos = torch.arange(start, start + n)
        cache.write(k[pos], v[pos], pos)
        start += n
        torch.testing.assert_close(window_attention(q[start - 1][None], cache)[0], want[start - 1],
                                   rtol=1e-10, atol=1e-10)


def test_batch_of_sequences_of_different_lengths():
    """Three sequences in one cache, at different positions; padding (position -1) is skipped."""
    window, lengths = 4, [3, 11, 7]
    inputs = [random_qkv(n, seed=100 + n) for n in lengths]
    want = [windowed_reference(q, k, v, window) for q, k, v in inputs]
    cache = RotatingKVCache(window, HKV, D, batch_size=3, dtype=torch.float64)
    for t in range(max(lengths)):
        k = torch.zeros(3, 1, HKV, D, dtype=torch.float64)
        v = torch.zeros_like(k)
        pos = torch.full((3, 1), -1)
        for b, (n, (_, kb, vb)) in enumerate(zip(lengths, inputs)):
            if t < n:
                k[b, 0], v[b, 0], pos[b, 0] = kb[t], vb[t], t
        cache.write(k, v, pos)
        q = torch.stack([qb[min(t, n - 1)] for n, (qb, _, _) in zip(lengths, inputs)])
        out = window_attention(q, cache)
        for b, n in enumerate(lengths):
            if t < n:  # a finished sequence's cache stays as it was
                torch.testing.assert_close(out[b], want[b][t], rtol=1e-10, atol=1e-10)
    assert cache.positions.max(dim=1).values.tolist() == [n - 1 for n in lengths]


def test_slot_is_position_mod_window():
    cache = RotatingKVCache(5, 1, 2)
    for p in range(13):
        cache.write(torch.full((1, 1, 2), float(p)), torch.zeros(1, 1, 2), torch.tensor([p]))
        assert cache.k[0, p % 5, 0, 0].item() == p
    assert cache.positions.tolist() == [[10, 11, 12, 8, 9]]
    assert cache.in_window_order()[2].tolist() == [[8, 9, 10, 11, 12]]
    assert cache.nbytes() == 2 * 5 * 1 * 2 * 4


def test_window_must_be_positive():
    with pytest.raises(ValueError):
        RotatingKVCache(0, 1, 2)
