"""`import minivllm` and an LLM on a checkpoint folder need only the package's own dependencies: the
extras (plots, Jupyter, the server, the GGUF preset) stay out until their feature is used."""
import subprocess
import sys

EXTRAS = ["matplotlib", "IPython", "ipywidgets", "fastapi", "uvicorn", "prometheus_client", "gguf", "accelerate"]


def test_the_engine_imports_no_extra(tiny_llama):
    code = (f"import sys; from minivllm import LLM, SamplingParams; "
            f"LLM({tiny_llama[0]!r}, num_kv_blocks=8).generate([[1, 2, 3]], SamplingParams(max_tokens=2), use_tqdm=False); "
            f"print(sorted(m for m in {EXTRAS!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"
