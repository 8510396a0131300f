"""Every Triton kernel compiles for a T4 and fits in its 64 KiB of shared memory per program.

Colab's free GPU is a T4: compute capability 7.5, at most 64 KiB of shared memory per block, and
(with Triton 3.3 and later) `tl.dot` on the FMA units rather than tensor cores. Triton can compile
for a GPU the machine does not have (`triton.compile` with an explicit `GPUTarget`) and reports
the shared memory the kernel needs (`metadata.shared`), so this runs anywhere, CPU-only CI
included. For each kernel, at the shapes of Mistral-7B (head_dim 128) and Llama-3.2-1B (head_dim
64) in fp16:

1. its Python wrapper runs on small CPU tensors of the model's widths, with
   MINIVLLM_KERNEL_CAPABILITY=7.5, and the launch it makes (arguments, constexprs, num_warps,
   num_stages) is recorded instead of run;
2. that launch is compiled for sm_75 and its shared memory compared with 64 KiB.

FP8 (e4m3) needs compute capability 8.9 (minivllm refuses fp8 below it, and Triton will not compile
tl.float8e4nv for less): the wrapper calls only fp8 makes (FP8_ONLY) compile for an sm_89 instead.

The compiling happens in a child Python process, this file run as a script: on a CPU the tests
run under TRITON_INTERPRET=1 (see the root conftest.py), and then `triton.jit`, for Triton's own
`tl.*` helpers too, makes interpreter stand-ins that cannot be compiled. By hand:
`python tests/test_kernels_t4.py` prints each kernel's shared memory and launch settings.
"""
from __future__ import annotations

import contextlib
import importlib
import inspect
import json
import os
import pkgutil
import subprocess
import sys
from unittest import mock

import pytest
import torch

import minivllm.kernels
from minivllm.kernels import target
from minivllm.models.presets import LLAMA_3_2_1B_CONFIG, MISTRAL_7B_CONFIG

T4_CAPABILITY = "7.5"
T4_SHARED_MEMORY = 64 * 1024   # bytes a T4 gives one program (one CUDA block), opting in beyond 48 KiB
MODELS = {"mistral-7b": MISTRAL_7B_CONFIG, "llama-3.2-1b": LLAMA_3_2_1B_CONFIG}
KERNEL_MODULES = [importlib.import_module(module.name)   # by module: the package's names are the wrappers
                  for module in pkgutil.iter_modules(minivllm.kernels.__path__, "minivllm.kernels.")]

# Each wrapper call the child makes (see `wrapper_calls`) -> the kernels it launches, in order.
# The decode kernel is compiled both whole and split 64 ways (the most `choose_num_splits` picks),
# which writes partial results instead and launches the reduce kernel with its widest tile.
LAUNCHES = {
    "rms_norm": ["_rms_norm_kernel"],
    "silu_and_mul": ["_silu_and_mul_kernel"],
    "apply_rotary_": ["_rotary_kernel"],
    "store_kv": ["_store_kv_kernel"],
    "decode": ["_decode_kernel"],
    "decode, 64 splits": ["_decode_kernel", "_reduce_kernel"],
    "prefill": ["_prefill_attention_kernel"],
    "w8_matmul": ["_w8_matmul_kernel"],
    "w8_matmul, one fp8 token": ["_w8_gemv_kernel"],
    "per_token_quant_fp8": ["_per_token_quant_fp8_kernel"],
}
# call -> the capability it compiles for instead of a T4's
FP8_ONLY = {"per_token_quant_fp8": "8.9", "w8_matmul, one fp8 token": "8.9"}
CASES = [(model, call, kernel) for model in MODELS for call, kernels in LAUNCHES.items() for kernel in kernels]


def test_every_kernel_is_measured():
    """A new kernel in minivllm.kernels must be added to LAUNCHES. A kernel (as opposed to a jit
    function that kernels call, like rotary's `_rotate_heads`) is one that asks its program id."""
    from triton.runtime import KernelInterface  # a jit function, compiled or interpreted
    kernels = {name for module in KERNEL_MODULES for name, obj in vars(module).items()
               if isinstance(obj, KernelInterface) and "tl.program_id" in inspect.getsource(obj.fn)}
    assert kernels == {kernel for _, _, kernel in CASES}


@pytest.fixture
def capability_env(monkeypatch):
    """Set MINIVLLM_KERNEL_CAPABILITY and forget the capability decided so far (it is decided once per
    device); afterwards the cache is cleared again, so no other test sees this one's choice."""
    def set_capability(value: str) -> None:
        monkeypatch.setenv(target.ENV_VAR, value)
        target.kernel_capability.cache_clear()
    yield set_capability
    monkeypatch.undo()
    target.kernel_capability.cache_clear()


def test_capability_override_steers_the_settings(capability_env):
    """MINIVLLM_KERNEL_CAPABILITY replaces the device's capability (decided once per device), so a
    torch.device("cuda") is enough to ask the choosers what a T4 or an H200 gets, without a GPU.
    The CPU interpreter's settings do not depend on it."""
    from minivllm.kernels import decode_attention, prefill_attention
    cuda, cpu = torch.device("cuda"), torch.device("cpu")

    capability_env("9.0")
    assert target.kernel_capability(cuda) == (9, 0)
    assert decode_attention._tile_size(cuda) == 128
    assert decode_attention._warps_and_stages(cuda) == (8, 3)
    assert prefill_attention._tiles(128, torch.float16, cuda) == (64, 64, 4, 3)

    capability_env(T4_CAPABILITY)
    assert target.kernel_capability(cuda) == (7, 5)
    assert decode_attention._tile_size(cuda) == 64
    assert decode_attention._warps_and_stages(cuda) == (4, 2)
    assert prefill_attention._tiles(128, torch.float16, cuda) == (64, 32, 4, 2)
    assert prefill_attention._tiles(64, torch.float16, cuda) == (64, 64, 4, 2)
    assert decode_attention._tile_size(cpu) == 16
    assert prefill_attention._tiles(128, torch.float16, cpu) == (16, 16, 4, 1)

    capability_env("sm_75")
    with pytest.raises(ValueError, match=target.ENV_VAR):
        target.kernel_capability(cuda)


@pytest.fixture(scope="module")
def t4_report():
    """{model: {"call / kernel": {"shared": bytes, ...} or {"error": message}}}, from the child."""
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    child = subprocess.run([sys.executable, __file__, "--json"], env=env, capture_output=True, text=True,
                           timeout=600)
    assert child.returncode == 0, child.stderr[-4000:]
    return json.loads(child.stdout)


@pytest.mark.slow  # 18 compilations: about 20 s on a CPU, unless Triton's cache already holds them
@pytest.mark.parametrize("model, call, kernel", CASES)
def test_kernel_fits_a_t4(t4_report, model, call, kernel):
    result = t4_report[model][f"{call} / {kernel}"]
    arch = "sm_" + FP8_ONLY.get(call, T4_CAPABILITY).replace(".", "")
    assert "error" not in result, f"{kernel} does not compile for {arch}: {result['error']}"
    assert result["shared"] <= T4_SHARED_MEMORY, f"{kernel} needs {result['shared']} bytes ({result['settings']})"


# ---- the child: record each wrapper's launches, compile them for sm_75 -------------------------

def wrapper_calls(config: dict) -> dict:
    """LAUNCHES' wrapper calls, on CPU tensors with the model's widths (a couple of tokens: the
    number of tokens sets the grid, not what one program does), in fp16. q, k and v are views
    into one packed qkv projection, as the model passes them."""
    from minivllm.kernels import (
        apply_rotary_,
        paged_decode_attention,
        paged_prefill_attention,
        per_token_quant_fp8,
        rms_norm,
        silu_and_mul,
        store_kv,
        w8_matmul,
    )
    fp16, i32, i64 = torch.float16, torch.int32, torch.int64
    hidden, ffn = config["hidden_size"], config["intermediate_size"]
    heads, kv_heads, dim = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    window, block_size, tokens = config.get("sliding_window"), 16, 2

    x = torch.zeros(tokens, hidden, dtype=fp16)
    qkv = torch.zeros(tokens, (heads + 2 * kv_heads) * dim, dtype=fp16)
    q = qkv[:, :heads * dim].view(tokens, heads, dim)
    k = qkv[:, heads * dim:(heads + kv_heads) * dim].view(tokens, kv_heads, dim)
    v = qkv[:, (heads + kv_heads) * dim:].view(tokens, kv_heads, dim)
    k_cache = torch.zeros(4, block_size, kv_heads, dim, dtype=fp16)
    v_cache = torch.zeros_like(k_cache)
    block_tables = torch.zeros(tokens, 4, dtype=i32)
    cos = sin = torch.zeros(64, dim // 2)

    def decode(num_splits):
        return lambda: paged_decode_attention(q, k_cache, v_cache, block_tables, torch.tensor([16, 30], dtype=i32),
                                              dim ** -0.5, window, num_splits=num_splits)

    return {
        "rms_norm": lambda: rms_norm(x, torch.ones(hidden, dtype=fp16), config["rms_norm_eps"], torch.zeros_like(x)),
        "silu_and_mul": lambda: silu_and_mul(torch.zeros(tokens, 2 * ffn, dtype=fp16)),
        "apply_rotary_": lambda: apply_rotary_(torch.zeros(tokens, dtype=i64), q, k, cos, sin),
        "store_kv": lambda: store_kv(k, v, k_cache, v_cache, torch.arange(tokens, dtype=i64)),
        "decode": decode(1),
        "decode, 64 splits": decode(64),
        "prefill": lambda: paged_prefill_attention(q, k_cache, v_cache, torch.tensor([0, tokens], dtype=i32),
                                                   torch.tensor([tokens], dtype=i32), block_tables[:1], dim ** -0.5,
                                                   window),
        "w8_matmul": lambda: w8_matmul(x, torch.zeros(ffn, hidden, dtype=torch.int8), torch.ones(ffn)),
        "w8_matmul, one fp8 token": lambda: w8_matmul(x[:1], torch.zeros(ffn, hidden, dtype=torch.float8_e4m3fn),
                                                      torch.ones(ffn)),
        "per_token_quant_fp8": lambda: per_token_quant_fp8(x),
    }


class Recorder:
    """Stands in for a kernel in its module: `kernel[grid](*args, **kwargs)` is written down, not run."""

    def __init__(self, kernel, launches: list):
        self.kernel, self.launches = kernel, launches

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launches.append((self.kernel, args, kwargs))


@contextlib.contextmanager
def recording():
    """Every jit function of the kernel modules replaced by a Recorder, and the settings choosers
    answering for a CUDA device: the wrappers run on CPU tensors, for which they would pick the
    interpreter's settings. The device's capability then comes from MINIVLLM_KERNEL_CAPABILITY, so
    nothing asks torch.cuda."""
    from triton.runtime import JITFunction

    from minivllm.kernels import decode_attention, prefill_attention
    cuda = torch.device("cuda")
    launches = []
    with contextlib.ExitStack() as stack:
        for module in KERNEL_MODULES:
            for name, obj in vars(module).items():
                if isinstance(obj, JITFunction):
                    stack.enter_context(mock.patch.object(module, name, Recorder(obj, launches)))
        for module, name in [(decode_attention, "_tile_size"), (decode_attention, "_warps_and_stages"),
                             (prefill_attention, "_tiles")]:
            chooser = getattr(module, name)   # each takes the device last
            stack.enter_context(mock.patch.object(module, name, lambda *args, f=chooser: f(*args[:-1], cuda)))
        yield launches


def triton_type(value) -> str:
    """The signature type Triton gives a launch argument: a tensor is a pointer to its dtype."""
    if isinstance(value, torch.Tensor):
        return "*" + {torch.float16: "fp16", torch.float32: "fp32", torch.int8: "i8", torch.uint8: "u8",
                      torch.int32: "i32", torch.int64: "i64"}[value.dtype]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -2 ** 31 <= value < 2 ** 31 else "i64"
    return "fp32"


def compile_for_t4(kernel, args: tuple, kwargs: dict, capability: str = T4_CAPABILITY):
    """Compile one recorded launch for sm_75 (or `capability`). A real launch also tells the compiler which
    pointers and integers are multiples of 16; left out here: that widens loads but leaves the tiles held in
    shared memory as they are (the same bytes either way, for both attention kernels)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    options = {key: kwargs[key] for key in ("num_warps", "num_stages") if key in kwargs}
    values = dict(zip(kernel.arg_names, args)) | {k: v for k, v in kwargs.items() if k not in options}
    constexprs = {p.name: values[p.name] for p in kernel.params if p.is_constexpr}
    signature = {name: "constexpr" if name in constexprs else triton_type(values[name]) for name in kernel.arg_names}
    major, minor = target.parse_capability(capability)
    gpu = GPUTarget("cuda", 10 * major + minor, 32)   # 32 threads a warp
    return triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constexprs), target=gpu,
                          options=options), options, constexprs


def measure(config: dict) -> dict:
    """{"call / kernel": {"shared": bytes, "settings": str} or {"error": message}} for one model."""
    report = {}
    for call, run in wrapper_calls(config).items():
        with recording() as launches:
            run()
        names = [kernel.__name__ for kernel, _, _ in launches]
        if names != LAUNCHES[call]:
            report |= {f"{call} / {kernel}": {"error": f"{call} launched {names}"} for kernel in LAUNCHES[call]}
            continue
        # Compiled once the Recorders are gone: a kernel's calls to other jit functions (rotary's
        # `_rotate_heads`) are looked up in its module when it compiles.
        for kernel, args, kwargs in launches:
            capability = FP8_ONLY.get(call, T4_CAPABILITY)
            try:
                compiled, options, constexprs = compile_for_t4(kernel, args, kwargs, capability)
            except Exception as error:          # reported by the test of this kernel
                report[f"{call} / {kernel.__name__}"] = {"error": f"{type(error).__name__}: {error}"}
                continue
            tiles = {k: v for k, v in constexprs.items() if k.startswith("BLOCK")}
            report[f"{call} / {kernel.__name__}"] = {"shared": compiled.metadata.shared,
                                                      "settings": str({**tiles, **options})}
    return report


def main():
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("unset TRITON_INTERPRET: the interpreter's stand-ins cannot be compiled")
    os.environ[target.ENV_VAR] = T4_CAPABILITY
    reports = {model: measure(config) for model, config in MODELS.items()}
    if "--json" in sys.argv:
        print(json.dumps(reports))
        return
    for model, report in reports.items():
        for launch, result in report.items():
            shared = f"{result['shared']:6} bytes" if "shared" in result else "ERROR"
            print(f"{model:13} {launch:50} {shared}  {result.get('settings', result.get('error'))}")


if __name__ == "__main__":
    main()
