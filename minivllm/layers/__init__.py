"""Layers a model is built from: `custom_op.py` (torch or Triton forward), `basic.py` (RMSNorm,
rotary, SwiGLU) and `parallel.py` (tensor-parallel linears, embedding, LM head). Attention is in
`minivllm.attention`.
"""
