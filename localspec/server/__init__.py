"""`localspec serve`: an OpenAI-compatible HTTP server over one loaded pair.

- `schemas`: the request bodies (pydantic) and what they mean for the engine.
- `chat`: messages and tools to the chat template; tool calls parsed from the answer.
- `worker`: the one thread that decodes, one request at a time in arrival order.
- `metrics`: the Prometheus figures.
- `app`: the FastAPI routes, the error shape, the API key.

The engine knows nothing of HTTP: the worker consumes its events as the chat does.
"""
