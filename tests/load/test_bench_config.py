"""``BenchConfig.to_json``: what lands in config.json and summary.json."""

from __future__ import annotations

import json

import pytest

from inferlab import BenchConfig, LoadConfig, OpenLoop


@pytest.mark.parametrize("name", [
    "Authorization", "X-Api-Key", "api_key", "X-APIKEY", "X-Auth-Token", "X-Client-Secret",
    "Cookie", "Set-Cookie", "X-Password", "Ocp-Apim-Subscription-Key",
])
def test_secret_headers_are_redacted(name: str) -> None:
    cfg = BenchConfig(LoadConfig(OpenLoop(1.0), num_requests=1), api_key="sk-A", headers=((name, "sk-X"), ("X-Trace", "abc")))
    d = cfg.to_json()
    assert d["headers"] == {name: "***", "X-Trace": "abc"}
    assert d["api_key"] == "***"
    assert "sk-" not in json.dumps(d)
