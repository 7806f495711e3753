"""What the simulated server's HTTP tests share: the model and context length of the
server the ``server`` fixture (``conftest.py``) starts, and the client timeout."""

from __future__ import annotations

MODEL = "Qwen/Qwen2.5-7B-Instruct"
MAX_MODEL_LEN = 4096  # sim serve's default (the common vLLM example)
HTTP_TIMEOUT_S = 30.0
