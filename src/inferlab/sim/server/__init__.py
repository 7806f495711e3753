"""The simulated engine behind an OpenAI-compatible HTTP server, in real time.
"""
