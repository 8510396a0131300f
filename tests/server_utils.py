"""Start the real server (`python -m minivllm serve`) as a subprocess on a free loopback port.

    with running_server("smollm2-135m", "--max-model-len", "512") as base_url:
        httpx.get(base_url + "/health")

The server runs on the CPU in float32 unless the extra flags say otherwise; it is stopped (SIGINT,
then SIGKILL) when the block ends, and its log is printed if it died or failed to start.
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import httpx

STARTUP_TIMEOUT_S = 300  # building the SmolLM2 folder from GGUF the first time takes a while


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_server(model: str, *extra_args: str, served_model_name: str | None = None):
    port = free_port()
    cmd = [sys.executable, "-m", "minivllm", "serve", model, "--host", "127.0.0.1", "--port", str(port),
           "--device", "cpu", "--dtype", "float32", "--log-level", "warning", *extra_args]
    if served_model_name:
        cmd += ["--served-model-name", served_model_name]
    log = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}:\n{_read(log)}")
            try:
                if httpx.get(base_url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"server not healthy after {STARTUP_TIMEOUT_S} s:\n{_read(log)}")
            time.sleep(0.2)
        yield base_url
        if proc.poll() is not None:
            raise RuntimeError(f"server died during the test ({proc.returncode}):\n{_read(log)}")
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()


def _read(log) -> str:
    log.seek(0)
    return log.read()[-5000:]
