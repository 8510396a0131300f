"""Start `minivllm serve` (or any server command) as a subprocess and wait until it is healthy.

    with running_server(["smollm2-135m", "--max-model-len", "1024"]) as base_url:
        httpx.get(base_url + "/v1/models")

Notebooks, tests and the GPU scripts start servers this way: on the loopback address, on a free port,
stopped (SIGINT, then SIGKILL) when the block ends; if the server dies or never answers `/health`,
the error carries the end of its log.
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_server(serve_args: list[str], command: list[str] | None = None, startup_timeout_s: float = 600,
                   port: int | None = None, env: dict | None = None):
    """`command` defaults to `python -m minivllm serve`; `serve_args` follow it, then host and port."""
    port = port or free_port()
    cmd = [*(command or [sys.executable, "-m", "minivllm", "serve"]), *serve_args,
           "--host", "127.0.0.1", "--port", str(port)]
    log = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + startup_timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}:\n{_tail(log)}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(base_url + "/health", timeout=1).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"server not healthy after {startup_timeout_s} s:\n{_tail(log)}")
            time.sleep(0.2)
        yield base_url
        if proc.poll() is not None:
            raise RuntimeError(f"server died while in use ({proc.returncode}):\n{_tail(log)}")
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()


def _tail(log, chars: int = 5000) -> str:
    log.seek(0)
    return log.read()[-chars:]
