"""Online serving: an OpenAI-compatible HTTP server over `AsyncLLM` (`minivllm serve MODEL`).

    api_server.py   FastAPI routes: completions and chat (streamed or whole), models, health, metrics, /
    protocol.py     OpenAI's request and response shapes, checked by hand; errors in OpenAI's shape
    metrics.py      Prometheus metrics under vLLM's names
    static/         the chat page served at /
"""
