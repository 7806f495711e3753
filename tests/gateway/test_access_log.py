"""The access log has one record per answered request, whoever answered it (an
upstream, the cache, or the gateway's own refusal), each with the client key's name and
the time the gateway finished answering; inferlab's readers of a run still read it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
from aiohttp import web
from fakeupstream import USAGE, ChatUpstream, FakeUpstream
from gateway_helpers import chat_body, post, serving

from inferlab.gateway.config import (
    AdmissionConfig,
    CacheConfig,
    GatewayConfig,
    KeyConfig,
    UpstreamConfig,
    hash_key,
)
from inferlab.openai.response import Completion
from inferlab.results.export import requests_csv
from inferlab.results.records import ErrorKind, RequestRecord
from inferlab.results.runfiles import read_records
from inferlab.results.summary import summarize

AUTH = {"Authorization": "Bearer sk-alice"}


def config(url: str, log: Path, **kw: object) -> GatewayConfig:
    return GatewayConfig(upstreams=(UpstreamConfig(url),), keys=(KeyConfig("alice", hash_key("sk-alice")),),
                         cache=CacheConfig(enabled=False), access_log=str(log), **kw)  # type: ignore[arg-type]


def records(log: Path) -> list[RequestRecord]:
    return sorted(read_records(log / "requests.jsonl"), key=lambda r: r.index)


class ContextUpstream(ChatUpstream):
    """Lists model ``m`` with a context of 100 tokens (vLLM's ``max_model_len``), and
    answers it with a whole body."""

    models = ("m",)

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model", "max_model_len": 100}]})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(Completion("chatcmpl-1", True, 0, "m").body("hi", "stop", USAGE))


async def test_the_gateway_s_own_400_and_404_are_logged_with_the_key_s_name(tmp_path: Path) -> None:
    async with ContextUpstream() as up, serving(config(up.url, tmp_path / "log")) as (url, _), \
            aiohttp.ClientSession() as s:
        answers = [await post(s, url, chat_body("m", stream=False), AUTH),
                   await post(s, url, chat_body("m", max_tokens=101), AUTH),  # over the whole context: the gateway's 400
                   await post(s, url, chat_body("nope"), AUTH),  # no upstream lists it: 404
                   await post(s, url, chat_body("m", max_tokens=0), AUTH)]  # a bad field: 400 before it is read
    assert [a.status for a in answers] == [200, 400, 404, 400]
    got = records(tmp_path / "log")
    assert [r.status for r in got] == [200, 400, 404, 400]
    assert [r.key for r in got] == ["alice"] * 4
    assert [r.ok for r in got] == [True, False, False, False]
    assert "in the completion alone" in (got[1].error or "") and "nope" in (got[2].error or "")
    assert all(r.end_ns is not None and r.send_ns is not None and r.end_ns >= r.send_ns for r in got)
    assert got[1].requested_output_tokens == 101 and got[2].requested_output_tokens == 8


async def test_the_gateway_s_own_failures_have_the_time_it_finished_answering(tmp_path: Path) -> None:
    """A 503 at a full queue, a 502 after the upstream's 500s, and a stream its client
    left: each logged with an end_ns, each still a failure; the summary's duration is the
    completed requests' (the one stream that finished), and export and the summary read
    the log."""
    adm = AdmissionConfig(mode="requests", max_requests_in_flight=1, queue_max=0)
    log = tmp_path / "log"
    async with FakeUpstream(long_chunks=300, gap_s=0.01) as up, serving(config(up.url, log, admission=adm)) as (url, gw), \
            aiohttp.ClientSession() as s:
        assert (await post(s, url, chat_body("ok"), AUTH)).status == 200
        async with s.post(url + "/v1/chat/completions", json=chat_body("long"), headers=AUTH) as resp:
            await resp.content.readany()  # (it holds the one slot)
            full = await post(s, url, chat_body("ok"), AUTH)
        for _ in range(400):  # bounded: 2 s (the gateway sees its client leave)
            if gw.admission.requests_in_flight == [0]:
                break
            await asyncio.sleep(0.005)
        failed = await post(s, url, chat_body("e500"), AUTH)
    assert (full.status, failed.status) == (503, 502)
    got = records(log)
    assert [r.status for r in got] == [200, 200, 503, 502]
    done, left, queue_full, upstream_failed = got
    assert done.ok and left.error_kind is ErrorKind.CANCELLED
    for r in (left, queue_full, upstream_failed):
        assert r.end_ns is not None and r.send_ns is not None and r.end_ns >= r.send_ns and not r.ok
    assert queue_full.error_kind is ErrorKind.HTTP_STATUS and upstream_failed.error_kind is ErrorKind.HTTP_STATUS
    summary = summarize(got)
    assert (summary.counts.completed, summary.counts.failed) == (1, 2)  # (the client that left: neither)
    assert done.end_ns is not None and done.send_ns is not None
    assert summary.duration_s == (done.end_ns - done.send_ns) / 1e9
    rows = requests_csv(got, "measured").splitlines()
    assert len(rows) == 5 and rows[0].split(",")[8] == "key" and all(",alice," in row for row in rows[1:])


def test_a_record_written_before_the_key_field_reads_back_without_one() -> None:
    old = RequestRecord(3, status=200, end_ns=5).to_json()
    del old["key"]
    assert RequestRecord.from_json(old).key is None
    assert RequestRecord.from_json(RequestRecord(3, key="alice").to_json()).key == "alice"
