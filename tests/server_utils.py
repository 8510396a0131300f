"""The real server for tests: `minivllm serve` on the CPU in float32, on a free loopback port.

    with running_server("smollm2-135m", "--max-model-len", "512") as base_url: ...
"""
from __future__ import annotations

from minivllm.server.launcher import running_server as _running_server

STARTUP_TIMEOUT_S = 300  # building the SmolLM2 folder from GGUF the first time takes a while


def running_server(model: str, *extra_args: str, served_model_name: str | None = None):
    args = [model, "--device", "cpu", "--dtype", "float32", "--log-level", "warning", *extra_args]
    if served_model_name:
        args += ["--served-model-name", served_model_name]
    return _running_server(args, startup_timeout_s=STARTUP_TIMEOUT_S)
