"""The engine core behind AsyncLLM: the same tokens in a process or a thread, and its faults.

The core's loop runs here in a thread with test-owned ZMQ sockets (so its messages can be forged and
its engine made to fail), then for real in its own process: killed, crashing mid-step, and asked
to stop by SIGTERM and Ctrl-C, behind a real server.
"""
from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import httpx
import msgspec
import pytest
import zmq

from minivllm import LLM, AsyncLLM, SamplingParams
from minivllm.config import engine_config
from minivllm.engine import core as core_module
from minivllm.engine.async_llm import EngineDeadError
from minivllm.engine.core import EngineCore
from minivllm.engine.core_messages import (
    AbortRequests,
    CoreOutput,
    EngineCoreFailed,
    EngineCoreOutputs,
    EngineCoreReady,
    EngineCoreRequest,
    Shutdown,
)
from minivllm.server.launcher import free_port

ENGINE = dict(max_model_len=128, block_size=8, num_kv_blocks=40, max_num_seqs=6)


def request(request_id: str, prompt: list[int], max_tokens: int) -> EngineCoreRequest:
    return EngineCoreRequest(request_id, prompt, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))


# ---- the frontend's two clients give the offline engine's tokens ------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("engine_core_process", [True, False])
def test_streams_equal_the_offline_engine_in_both_modes(tiny_llama, engine_core_process):
    rng = random.Random()
    prompts = [[rng.randrange(211) for _ in range(rng.randint(1, 40))] for _ in range(8)]
    params = [SamplingParams(temperature=0, max_tokens=rng.randint(1, 24), ignore_eos=True) for _ in prompts]
    engine = AsyncLLM(tiny_llama[0], engine_core_process=engine_core_process, **ENGINE)

    async def collect(i):
        return [out async for out in engine.generate(prompts[i], params[i], f"r{i}")]

    async def main():
        return await asyncio.gather(*(collect(i) for i in range(len(prompts))))

    try:
        streams = asyncio.run(main())
    finally:
        engine.shutdown()
    offline = LLM(tiny_llama[0], **ENGINE).generate(prompts, params, use_tqdm=False)
    for outs, ref in zip(streams, offline):
        assert outs[-1].finished and outs[-1].outputs[0].token_ids == ref.outputs[0].token_ids
    assert (engine.llm_engine is not engine) == (not engine_core_process)  # thread mode: the engine is here


# ---- the core's loop with forged messages ----------------------------------------------------
class CoreInAThread:
    """run_engine_core in a thread of the test, talking to sockets the test holds."""

    def __init__(self, tmp_path, model: str):
        self.context = zmq.Context()
        self.push, self.pull = self.context.socket(zmq.PUSH), self.context.socket(zmq.PULL)
        inputs, outputs = f"ipc://{tmp_path}/in", f"ipc://{tmp_path}/out"
        self.push.bind(inputs)
        self.pull.bind(outputs)
        self.decoder = msgspec.msgpack.Decoder(CoreOutput)
        self.code = None
        config = engine_config("test", model, ENGINE)
        self.thread = threading.Thread(target=lambda: setattr(self, "code", core_module.run_engine_core(
            inputs, outputs, config)), daemon=True)
        self.thread.start()

    def send(self, message) -> None:
        self.push.send(message if isinstance(message, bytes) else msgspec.msgpack.encode(message))

    def receive(self, timeout_s: float = 30):
        if not self.pull.poll(int(timeout_s * 1000)):
            raise AssertionError("the core sent nothing")
        return self.decoder.decode(self.pull.recv())

    def outputs_until_finished(self, request_id: str) -> tuple[list[int], str, list]:
        tokens, rejected = [], []
        while True:
            message = self.receive()
            assert isinstance(message, EngineCoreOutputs), message
            rejected += message.rejected
            for out in message.outputs:
                if out.request_id == request_id:
                    tokens += out.new_token_ids
                    if out.finish_reason is not None:
                        return tokens, out.finish_reason, rejected

    def close(self) -> None:
        self.thread.join(timeout=30)
        self.context.destroy(linger=0)


def test_the_core_drops_malformed_messages_and_goes_on(tiny_llama, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="minivllm.engine.core")
    core = CoreInAThread(tmp_path, tiny_llama[0])
    ready = core.receive(timeout_s=120)
    assert isinstance(ready, EngineCoreReady) and ready.vocab_size == 211
    malformed = [b"", b"\xc1 not msgpack", msgspec.msgpack.encode({"type": "add", "request_id": 5}),
                 msgspec.msgpack.encode({"type": "exec", "code": "import os"}), msgspec.msgpack.encode([[[[1]]]]),
                 msgspec.msgpack.encode({"type": "abort", "request_ids": "abc"})]
    for frame in malformed:
        core.send(frame)
    core.send(request("outside", [5, 10**6], 4))  # well formed, but checked again by the core
    # Typed right but a bad value: SamplingParams refuses it while decoding, and the core rejects it by its id.
    core.send(msgspec.msgpack.encode({"type": "add", "request_id": "cold", "prompt_token_ids": [1, 2],
                                      "sampling_params": {"temperature": -1.0}}))
    core.send(request("good", [1, 2, 3], 6))
    tokens, reason, rejected = core.outputs_until_finished("good")
    assert len(tokens) == 6 and reason == "length"
    assert [r.request_id for r in rejected] == ["outside", "cold"] and "vocabulary" in rejected[0].message
    assert "temperature" in rejected[1].message
    dropped = [r for r in caplog.records if "malformed" in r.getMessage()]
    assert len(dropped) == len(malformed)
    core.send(request("long", [4, 5], 100))
    core.send(AbortRequests(["long", "no-such-request"]))
    _, reason, _ = core.outputs_until_finished("long")
    assert reason == "abort"
    core.send(Shutdown())
    core.close()
    assert core.code == 0
    assert gc.get_freeze_count() == 0  # what the core froze at startup is given back (see the test below)


def test_a_crash_mid_step_is_reported_and_the_core_exits_non_zero(tiny_llama, tmp_path, monkeypatch):
    real_step, calls = EngineCore.step, []

    def failing_step(self):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("injected failure in step 3")
        return real_step(self)

    monkeypatch.setattr(EngineCore, "step", failing_step)
    core = CoreInAThread(tmp_path, tiny_llama[0])
    assert isinstance(core.receive(timeout_s=120), EngineCoreReady)
    core.send(request("r", [1, 2, 3], 50))
    while not isinstance(message := core.receive(), EngineCoreFailed):
        assert isinstance(message, EngineCoreOutputs)
    assert message.error_type == "RuntimeError" and "injected failure in step 3" in message.message
    core.close()
    assert core.code == 1
    assert gc.get_freeze_count() == 0


def test_the_core_process_exits_without_triton_leak_reports(tiny_llama):
    # The core freezes its startup objects (gc.freeze): never given back, they outlived the interpreter, and
    # Triton's extension (nanobind) printed each of its objects still alive as a leak, some 30 lines at exit.
    script = ("from minivllm import AsyncLLM\n"
              f"AsyncLLM({tiny_llama[0]!r}, device='cpu', attention_backend='triton', **{ENGINE!r}).shutdown()\n")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "TRITON_INTERPRET": "1"})
    assert run.returncode == 0, run.stderr
    assert "nanobind" not in run.stderr, run.stderr


def test_generate_steps_with_the_startup_objects_frozen_and_gives_them_back(tiny_llama):
    # A full collection during generate() would walk every object of torch and transformers: they are frozen
    # while it steps, and unfrozen after (an object left frozen is never freed), unless frozen before it began.
    llm = LLM(tiny_llama[0], **ENGINE)
    real_step, seen = llm.llm_engine.step, []

    def step():
        seen.append(gc.get_freeze_count())
        return real_step()

    llm.llm_engine.step = step
    out = llm.generate([[1, 2, 3], [4, 5]], SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in out] == [4, 4]
    assert seen and min(seen) > 0 and gc.get_freeze_count() == 0
    gc.freeze()
    try:
        llm.generate([1, 2, 3], SamplingParams(max_tokens=2), use_tqdm=False)
        assert gc.get_freeze_count() > 0  # the caller's freeze is the caller's to undo
    finally:
        gc.unfreeze()


async def three_streams_until_the_core_dies(engine, fault, match: str, timeout_s: float) -> None:
    """Three long streams; `fault()` is called once the first has two outputs. Every stream must end
    with EngineDeadError matching `match`, within the timeout (nothing hangs)."""
    async def read(i):
        outs = []
        with pytest.raises(EngineDeadError, match=match):
            async for out in engine.generate([i + 1, 2], SamplingParams(max_tokens=100, ignore_eos=True), f"r{i}"):
                outs.append(out)
                if i == 0 and len(outs) == 2:
                    fault()

    await asyncio.wait_for(asyncio.gather(*(read(i) for i in range(3))), timeout=timeout_s)


def test_a_crash_in_thread_mode_fails_every_stream(tiny_llama, monkeypatch):
    engine = AsyncLLM(tiny_llama[0], engine_core_process=False, **ENGINE)
    real_step = EngineCore.step
    crash = threading.Event()

    def step(self):
        if crash.is_set():
            raise RuntimeError("injected failure")
        return real_step(self)

    monkeypatch.setattr(EngineCore, "step", step)

    try:
        asyncio.run(three_streams_until_the_core_dies(engine, crash.set, "injected failure", timeout_s=60))
        assert not engine.is_running and not engine.requests
        with pytest.raises(EngineDeadError):
            asyncio.run(engine.add_request("late", [1], SamplingParams()))
    finally:
        engine.shutdown()


@pytest.mark.slow
def test_a_killed_core_process_fails_every_stream(tiny_llama):
    engine = AsyncLLM(tiny_llama[0], **ENGINE)

    def kill():
        os.kill(engine.engine_core.process.pid, signal.SIGKILL)

    try:
        asyncio.run(three_streams_until_the_core_dies(engine, kill, "exited", timeout_s=30))
        assert not engine.is_running and not engine.requests
    finally:
        engine.shutdown()


# ---- the real server: its core killed, crashing, or asked to stop ---------------------------
TINY_WORDS = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 256, "hidden_size": 64,
              "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "torch_dtype": "float32"}
# Loaded by every Python process that has it on PYTHONPATH, the core's included: its step fails
# on the 6th call, as a GPU error or a bug would.
# The step raises once the test drops a flag file beside it: after the stream's first event has been read,
# whatever the machine's speed (a fixed step count could crash before the first event was sent).
CRASHING_STEP = textwrap.dedent("""
    import os
    from minivllm.engine.core import EngineCore
    real_step, flag = EngineCore.step, os.path.join(os.path.dirname(__file__), "crash-now")
    def step(self):
        if os.path.exists(flag):
            raise RuntimeError("injected failure mid-step")
        return real_step(self)
    EngineCore.step = step
""")


@pytest.fixture(scope="module")
def word_model(tmp_path_factory):
    from minivllm_lab.bench.word_model import write_word_model
    return str(write_word_model(tmp_path_factory.mktemp("words"), TINY_WORDS))


def start_server(model: str, tmp_path, env: dict | None = None) -> tuple[subprocess.Popen, str]:
    port = free_port()
    with open(tmp_path / "server.log", "w") as log:  # the child keeps its own copy of the file
        proc = subprocess.Popen([sys.executable, "-m", "minivllm", "serve", model, "--load-format", "dummy",
                                 "--device", "cpu", "--dtype", "float32", "--max-model-len", "256",
                                 "--num-kv-blocks", "64", "--host", "127.0.0.1", "--port", str(port),
                                 "--log-level", "warning"],
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, **(env or {})})
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        assert proc.poll() is None, (tmp_path / "server.log").read_text()
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("the server never answered /health")


def core_processes(server_pid: int) -> list[int]:
    """The server's children that run the engine core (from /proc: field 4 of stat is the parent)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                command = Path(f"/proc/{entry}/cmdline").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == server_pid and "minivllm.engine.core" in command:
                found.append(int(entry))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def completion(model: str, stream: bool, max_tokens: int = 200) -> dict:
    return {"model": model, "prompt": [1, 2, 3], "max_tokens": max_tokens, "ignore_eos": True, "stream": stream}


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["sigkill", "crash"])
def test_the_server_when_its_core_dies(word_model, tmp_path, fault):
    env = None
    if fault == "crash":
        (tmp_path / "sitecustomize.py").write_text(CRASHING_STEP)
        env = {"PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc, url = start_server(word_model, tmp_path, env)
    try:
        [core_pid] = core_processes(proc.pid)
        whole: dict = {}
        waiting = threading.Thread(target=lambda: whole.update(response=httpx.post(
            url + "/v1/completions", json=completion(word_model, False), timeout=60)))
        with httpx.stream("POST", url + "/v1/completions", json=completion(word_model, True), timeout=60) as response:
            lines = response.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            assert "choices" in first
            waiting.start()
            if fault == "sigkill":
                os.kill(core_pid, signal.SIGKILL)
            else:
                (tmp_path / "crash-now").touch()
            events = [line for line in lines if line.startswith("data: ")]
        assert "[DONE]" not in events[-1]
        error = json.loads(events[-1].removeprefix("data: "))["error"]
        assert error["type"] == "server_error" and error["message"]
        waiting.join(timeout=30)
        assert whole["response"].status_code == 503 and whole["response"].json()["error"]["message"]
        # The server stays up a moment so that streams get their error; meanwhile it says so.
        health = httpx.get(url + "/health", timeout=5)
        assert health.status_code == 503 and "error" in health.json()
        assert proc.wait(timeout=15) == 1
        assert not alive(core_pid)
        if fault == "crash":
            assert "injected failure mid-step" in (tmp_path / "server.log").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
@pytest.mark.parametrize("how", ["sigterm", "ctrl-c"])
def test_sigterm_and_ctrl_c_stop_the_server_and_its_core(word_model, tmp_path, how):
    proc, url = start_server(word_model, tmp_path)
    try:
        [core_pid] = core_processes(proc.pid)
        body = completion(word_model, True, 250)
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as response:
            next(line for line in response.iter_lines() if line.startswith("data: "))
            if how == "sigterm":
                proc.send_signal(signal.SIGTERM)
            else:  # a terminal's Ctrl-C: SIGINT to the foreground process group (the core has its own)
                os.killpg(proc.pid, signal.SIGINT)
            assert proc.wait(timeout=20) == 0
        deadline = time.monotonic() + 5
        while alive(core_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(core_pid)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
