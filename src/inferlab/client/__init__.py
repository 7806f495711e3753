"""The HTTP client: sends one request to an OpenAI-compatible server and records what
happened, and the preflight probe that runs before a benchmark.
"""
