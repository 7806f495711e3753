"""The access log has one record per answered request, whoever answered it (an
upstream, the cache, or the gateway's own refusal), each with the client key's name and
the time the gateway finished answering; inferlab's readers of a run still read it."""

from __future__ import annotations

from pathlib import Path

from inferlab.gateway.config import (
    CacheConfig,
    GatewayConfig,
    KeyConfig,
    UpstreamConfig,
    hash_key,
)
from inferlab.results.records import RequestRecord
from inferlab.results.runfiles import read_records

AUTH = {"Authorization": "Bearer sk-alice"}


def config(url: str, log: Path, **kw: object) -> GatewayConfig:
    return GatewayConfig(upstreams=(UpstreamConfig(url),), keys=(KeyConfig("alice", hash_key("sk-alice")),),
                         cache=CacheConfig(enabled=False), access_log=str(log), **kw)  # type: ignore[arg-type]


def records(log: Path) -> list[RequestRecord]:
    return sorted(read_records(log / "requests.jsonl"), key=lambda r: r.index)


def test_a_record_written_before_the_key_field_reads_back_without_one() -> None:
    old = RequestRecord(3, status=200, end_ns=5).to_json()
    del old["key"]
    assert RequestRecord.from_json(old).key is None
    assert RequestRecord.from_json(RequestRecord(3, key="alice").to_json()).key == "alice"
