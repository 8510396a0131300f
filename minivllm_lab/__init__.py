"""The lab around the engine: benchmarks, baselines, the demo and the notebooks' helpers.

It imports `minivllm`; `minivllm` never imports it (a test holds the engine to that).

- `bench/`: workloads (W1, W2, W3), metrics, rooflines, profiles, the benchmark CLIs (`python -m minivllm_lab.bench`);
- `baselines.py`: the naive generators the engine is measured against;
- `notebook.py`: `setup()` for the notebooks (device, dtype, model, sizes, the T4 profile), figures, tiny checkpoints;
- `rotating_cache.py`: Mistral's rotating KV cache, which notebook 07 sets beside the engine's block release;
- `demo.py`: `python -m minivllm_lab.demo`.
"""
