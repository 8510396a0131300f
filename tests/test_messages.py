"""What the engine tells its user: a notice about a setting it had to change comes once per process, however many
engines a notebook builds (vLLM's `logger.warning_once`), and counts read as words do ("1 launch", "2 launches")."""
import logging

import pytest

from minivllm import LLM
from minivllm.config import EngineConfig
from minivllm.utils import plural, warning_once


@pytest.fixture
def fresh_warnings(caplog):
    """The records of minivllm's loggers, with every notice not yet said in this process."""
    warning_once.cache_clear()
    caplog.set_level(logging.WARNING, logger="minivllm")
    yield caplog
    warning_once.cache_clear()


def said(caplog, text: str) -> int:
    return sum(text in record.getMessage() for record in caplog.records)


def test_prefix_caching_off_for_a_sliding_window_is_said_once_where_asked_for(tiny_mistral, fresh_warnings):
    llm = LLM(tiny_mistral[0], max_model_len=64, num_kv_blocks=16)  # the default: off for this model, nothing said
    assert not llm.llm_engine.block_manager.enable_prefix_caching
    assert said(fresh_warnings, "prefix caching is turned off") == 0
    for _ in range(2):
        llm = LLM(tiny_mistral[0], max_model_len=64, num_kv_blocks=16, enable_prefix_caching=True)
        assert not llm.llm_engine.block_manager.enable_prefix_caching
    assert said(fresh_warnings, "prefix caching is turned off for models with a sliding window") == 1


def test_async_scheduling_off_for_speculative_decoding_is_said_once_where_asked_for(fresh_warnings):
    ngram = {"method": "ngram", "num_speculative_tokens": 2}
    assert EngineConfig("x", device="cpu").async_scheduling  # the default: on
    config = EngineConfig("x", device="cpu", speculative_config=ngram)  # the default: off here, nothing said
    assert not config.async_scheduling and said(fresh_warnings, "async_scheduling is turned off") == 0
    for _ in range(3):
        config = EngineConfig("x", device="cpu", speculative_config=ngram, async_scheduling=True)
        assert not config.async_scheduling
    assert said(fresh_warnings, "async_scheduling is turned off") == 1


def test_plural():
    assert [plural(n, "launch", "launches") for n in (0, 1, 2)] == ["0 launches", "1 launch", "2 launches"]
    assert plural(1, "step") == "1 step" and plural(2002, "kernel") == "2,002 kernels"
