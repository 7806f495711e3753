"""``bench/client_scale.py`` and ``bench/sim_speed.py`` read the simulated server's
``inferlab:token_emit_lag_seconds`` from /metrics with ``emit_lag`` to say how many steps
left the engine loop on time; the page writes each bucket's labels in its own order
(``le`` before ``model_name``), and a reader that took ``le`` as the last label found no
bucket and printed every step as on time."""

from __future__ import annotations

import math

import httpx
import pytest
from simserver import MODEL

from inferlab.results.telemetry import emit_lag


def test_the_emit_lag_buckets_are_read_off_the_simulators_page(http: httpx.Client) -> None:
    r = http.post("/v1/completions", json={"model": MODEL, "prompt": "hello", "max_tokens": 4})
    assert r.status_code == 200, r.text
    lag = emit_lag(http.get("/metrics").text)
    steps = lag[math.inf]
    assert steps >= 1  # (the request ran steps, each one observed)
    assert list(lag) == sorted(lag) and list(lag.values()) == sorted(lag.values())  # cumulative, up to every step
    assert 0.001 in lag and 0.005 in lag  # (the bounds client_scale's "sim late" column reads)


def test_a_page_without_the_histogram_is_refused_not_read_as_no_step_late() -> None:
    with pytest.raises(ValueError, match="no inferlab:token_emit_lag_seconds"):
        emit_lag('vllm:num_requests_running{model_name="m"} 0\n')
