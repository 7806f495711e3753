"""``inferlab gateway``: a token-aware OpenAI-compatible proxy in front of one or more
engines. Streams relayed as they arrive, Prometheus metrics (TTFT, TPOT, ITL, tokens),
admission by tokens in flight, per-key RPM/TPM limits charged before dispatch, a
response cache for deterministic requests.

- ``config``: ``GatewayConfig`` and ``load_config`` (flags + a TOML file).
- ``app``: ``Gateway`` (the aiohttp app) and ``start``.
- ``upstream``: sending to an upstream, on the project's httptools client or aiohttp's.
- ``relay``: an upstream's answer relayed to the client and observed.
- ``admission``, ``ratelimit``, ``cache``, ``routing``, ``estimate``, ``metrics``: the
  policies, each plain bookkeeping.
"""
