"""The worker: one rank's model, its KV cache and the work of a step on its device.

- `model_runner.py`: builds a step's flat batch, runs the model, samples;
- `kv_cache.py`: the cache tensors and how many blocks fit;
- `block_table.py`: the persistent block tables the kernels read;
- `cuda_graphs.py`: decode steps captured and replayed;
- `sampler.py`: greedy, temperature, top-k, top-p, seeds, on the device.
"""
