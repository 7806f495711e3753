"""``bench/client_scale.py`` reads the simulated server's ``inferlab:token_emit_lag_seconds``
from /metrics to say how many steps left the engine loop on time; the page writes each
bucket's labels in its own order (``le`` before ``model_name``), and a reader that took
``le`` as the last label found no bucket and printed every step as on time."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
from simserver import MODEL

BENCH = Path(__file__).resolve().parents[3] / "bench"
sys.path.insert(0, str(BENCH))
import client_scale  # noqa: E402


class _Page:
    """What ``_emit_lag`` asks of ``client_scale.Server``: a GET of one path."""

    def __init__(self, http: httpx.Client) -> None:
        self.http = http

    def get(self, path: str) -> str:
        return self.http.get(path).text


def test_client_scale_reads_the_emit_lag_buckets(http: httpx.Client) -> None:
    r = http.post("/v1/completions", json={"model": MODEL, "prompt": "hello", "max_tokens": 4})
    assert r.status_code == 200, r.text
    lag = client_scale._emit_lag(_Page(http))
    steps = lag["+Inf"]
    assert steps >= 1  # (the request ran steps, each one observed)
    bounds = sorted((float(le), n) for le, n in lag.items())
    assert [n for _, n in bounds] == sorted(n for _, n in bounds)  # cumulative, up to every step
    assert bounds[-1] == (float("inf"), steps)
