"""SamplingParams checks every field's type and range: a ValueError naming the field, never a
TypeError, an overflow later in torch, or a silent coercion."""
import dataclasses
import struct

import pytest
import torch

from minivllm import SamplingParams
from minivllm.sampling_params import INT64_MAX, INT64_MIN

HUGE = 2**70


@pytest.mark.parametrize("field, value", [
    ("temperature", "1"), ("temperature", None), ("temperature", True), ("temperature", [1.0]),
    ("temperature", {"a": 1}), ("temperature", float("nan")), ("temperature", float("inf")),
    ("temperature", 10**400), ("temperature", -0.5),
    ("top_p", "0.5"), ("top_p", None), ("top_p", False), ("top_p", float("nan")), ("top_p", 0),
    ("top_p", 1.0000001), ("top_p", -1),
    ("top_k", 2.0), ("top_k", "5"), ("top_k", True), ("top_k", None), ("top_k", HUGE), ("top_k", 2**31),
    ("top_k", 0), ("top_k", -2),
    ("max_tokens", 0), ("max_tokens", -1), ("max_tokens", 1.5), ("max_tokens", 16.0), ("max_tokens", "16"),
    ("max_tokens", True), ("max_tokens", None), ("max_tokens", 2**31), ("max_tokens", HUGE),
    ("ignore_eos", 1), ("ignore_eos", 0), ("ignore_eos", "true"), ("ignore_eos", None),
    ("seed", HUGE), ("seed", 2**63), ("seed", -2**63 - 1), ("seed", 1.0), ("seed", "1"), ("seed", True),
    ("stop", 5), ("stop", {"a": 1}), ("stop", {"a"}), ("stop", [""]), ("stop", ""), ("stop", [1]),
    ("stop", [["a"]]), ("stop", ["a", None]), ("stop", b"a"), ("stop", True),
    ("stop_token_ids", 5), ("stop_token_ids", "5"), ("stop_token_ids", {1: 2}), ("stop_token_ids", [True]),
    ("stop_token_ids", [-1]), ("stop_token_ids", [1.0]), ("stop_token_ids", [[1]]), ("stop_token_ids", [2**63]),
    ("stop_token_ids", [None]), ("stop_token_ids", True),
])
def test_a_bad_value_is_a_value_error_naming_its_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


@pytest.mark.parametrize("kwargs", [
    dict(), dict(temperature=0), dict(temperature=0.0), dict(temperature=2), dict(temperature=1e6),
    dict(top_p=1), dict(top_p=0.01), dict(top_k=-1), dict(top_k=1), dict(top_k=2**31 - 1),
    dict(max_tokens=1), dict(max_tokens=2**31 - 1), dict(ignore_eos=True), dict(seed=0), dict(seed=None),
    dict(seed=INT64_MAX), dict(seed=INT64_MIN), dict(stop="a"), dict(stop=["a", "b"]), dict(stop=("a",)),
    dict(stop=[]), dict(stop=None), dict(stop_token_ids=[0, 5]), dict(stop_token_ids=(7,)),
    dict(stop_token_ids=[]), dict(stop_token_ids=None),
])
def test_good_values_are_accepted(kwargs):
    p = SamplingParams(**kwargs)
    for name, value in kwargs.items():
        if name not in ("stop", "stop_token_ids"):
            assert getattr(p, name) == value


def test_stop_lists_are_normalised_and_copied():
    ids = [3, 4]
    p = SamplingParams(stop="x", stop_token_ids=ids)
    assert p.stop == ["x"] and p.stop_token_ids == [3, 4]
    ids.append(5)  # the caller's list is not shared
    assert p.stop_token_ids == [3, 4]
    assert SamplingParams(stop=("a", "b"), stop_token_ids=(1,)).stop == ["a", "b"]
    assert SamplingParams().stop == [] and SamplingParams().stop_token_ids == []


def test_the_seed_bounds_are_within_what_torch_takes():
    """Signed 64 bits, as vLLM's: torch also takes [2**63, 2**64), but msgpack's int64 would not."""
    for seed in (INT64_MIN, -1, 0, INT64_MAX):
        torch.rand(1, generator=torch.Generator().manual_seed(SamplingParams(seed=seed).seed))
    for seed in (INT64_MIN - 1, 2**64):  # past torch's own range: what the engine used to hit
        with pytest.raises((ValueError, RuntimeError), match="Overflow"):
            torch.Generator().manual_seed(seed)
        with pytest.raises(ValueError, match="seed"):
            SamplingParams(seed=seed)


def test_every_int_fits_in_signed_64_bits():
    """What msgpack's int64 (like struct's "q") can carry between processes."""
    p = SamplingParams(top_k=2**31 - 1, max_tokens=2**31 - 1, seed=INT64_MAX, stop_token_ids=[INT64_MAX],
                       temperature=INT64_MAX)
    ints = [v for v in dataclasses.astuple(p) if isinstance(v, int)] + p.stop_token_ids
    struct.pack(f"{len(ints)}q", *ints)


def test_errors_are_never_type_errors_and_messages_stay_short():
    with pytest.raises(ValueError, match="stop") as e:
        SamplingParams(stop=["ok", 5] + ["x" * 10**6])
    assert len(str(e.value)) < 300
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=10**400)  # math.isfinite would raise OverflowError on it
