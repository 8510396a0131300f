"""The worker: one rank's model runner, KV cache, CUDA graphs and samplers."""
