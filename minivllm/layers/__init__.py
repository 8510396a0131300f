"""Layers: the building blocks a model is made of.

- `custom_op.py`: a layer with a torch forward and a Triton one, one bound when the model is built;
- `basic.py`: RMSNorm, rotary embeddings, SwiGLU's activation;
- `parallel.py`: column- and row-parallel linears, the vocabulary-parallel embedding and LM head (the
  plain layers when there is one rank).

Attention, the one layer with a cache and per-step metadata, has a package of its own (`minivllm.attention`).
"""
