"""Online serving: an OpenAI-compatible HTTP server over `AsyncLLM` (`minivllm serve MODEL`):
routes in `api_server.py`, request and response shapes in `protocol.py`, Prometheus metrics in
`metrics.py`, the chat page in `static/`.
"""
