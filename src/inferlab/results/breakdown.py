"""Where a request's time went: client send lag, gateway queue, server queue, prefill, decode, and the
rest (network, HTTP, streaming), from the best source a run has.

Per request, from the server's own timeline (the simulated server's
``inferlab_timeline``: when it received the request, first scheduled it, emitted the
first token and finished, in ms since receiving it; a virtual-time run's records carry
the engine's own, received at the send, so there its parts are exact and add up to each
request's E2E, nothing left for a network); else, for the run as a whole, from the
server's ``/metrics`` histograms (vLLM's queue, prefill and decode time: means only).
The client's queue (its send against the intended time) is always its own measurement.
Pure: records and telemetry in, a typed breakdown out.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from inferlab.results.metrics import queue_delay_ms, request_metrics
from inferlab.results.records import RequestRecord
from inferlab.results.telemetry import ServerMetrics

PER_REQUEST = "the server's timeline, per request"
VIRTUAL = "the simulated engine's timeline, per request (virtual time: exact; a prediction)"
AGGREGATE = "the server's /metrics histograms (means over the run; the rest is E2E's mean less the parts)"
#: Added to the source where the gateway's queue comes from inferlab gateway's /metrics.
GATEWAY_MEAN = ("; the gateway queue: the mean wait of the requests inferlab gateway admitted (its /metrics, "
                "gateway-wide over the run), taken out of the rest")


@dataclass(frozen=True)
class Part:
    """One part of the latency over the requests, ms (percentiles: per-request sources only)."""

    mean: float
    p50: float | None = None
    p90: float | None = None

    @classmethod
    def of(cls, values: Sequence[float]) -> Part | None:
        if not values:
            return None
        q = statistics.quantiles(values, n=10, method="inclusive") if len(values) > 1 else [values[0]] * 9
        return cls(statistics.fmean(values), statistics.median(values), q[8])


@dataclass(frozen=True)
class RequestParts:
    """One request's latency in parts, ms: ``gateway_queue`` (None: no gateway) +
    ``server_queue`` + ``prefill`` + ``decode`` + ``other`` is its E2E (``other`` at
    least 0); ``client_queue`` came before its send."""

    client_queue: float
    server_queue: float
    prefill: float
    decode: float
    other: float
    gateway_queue: float | None = None


def request_parts(r: RequestRecord) -> RequestParts | None:
    """The parts of one completed request from its ``server_timeline``; None without one."""
    tl = r.server_timeline or {}
    sched, first, fin = tl.get("scheduled_ms"), tl.get("first_token_ms"), tl.get("finished_ms")
    e2e = request_metrics(r).e2e_ms
    if sched is None or first is None or fin is None or e2e is None:
        return None
    # through a gateway (sim run --admission) the times count from the gateway's receipt
    waited = tl.get("gateway_queue_ms")
    return RequestParts(
        queue_delay_ms(r) or 0.0, float(sched) - float(waited or 0.0), float(first) - float(sched),
        float(fin) - float(first), max(0.0, e2e - float(fin)), None if waited is None else float(waited),
    )


@dataclass(frozen=True)
class LatencyBreakdown:
    """The parts of E2E: ``client_queue_ms`` (send − intended send),
    ``gateway_queue_ms`` (a gateway's admission queue: received → sent on to the engine;
    None without a gateway), ``server_queue_ms`` (the engine received it → first
    scheduled: the front end and the engine's queue), ``prefill_ms``
    (first scheduled → first token), ``decode_ms`` (first token → last), ``other_ms``
    (E2E less the server's part: network, HTTP, streaming); ``source`` says where they
    come from, ``requests`` how many requests they cover."""

    source: str
    requests: int
    client_queue_ms: Part | None
    server_queue_ms: Part | None
    prefill_ms: Part | None
    decode_ms: Part | None
    other_ms: Part | None
    gateway_queue_ms: Part | None = None

    def to_json(self) -> dict[str, Any]:
        def part(p: Part | None) -> dict[str, float | None] | None:
            return None if p is None else {"mean": p.mean, "p50": p.p50, "p90": p.p90}

        gateway = {} if self.gateway_queue_ms is None else {"gateway_queue_ms": part(self.gateway_queue_ms)}
        return {
            "source": self.source, "requests": self.requests, "client_queue_ms": part(self.client_queue_ms),
            **gateway, "server_queue_ms": part(self.server_queue_ms),
            "prefill_ms": part(self.prefill_ms), "decode_ms": part(self.decode_ms), "other_ms": part(self.other_ms),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> LatencyBreakdown:
        def part(p: Mapping[str, Any] | None) -> Part | None:
            return None if p is None else Part(float(p["mean"]), p.get("p50"), p.get("p90"))

        return cls(
            str(d["source"]), int(d["requests"]), part(d.get("client_queue_ms")), part(d.get("server_queue_ms")),
            part(d.get("prefill_ms")), part(d.get("decode_ms")), part(d.get("other_ms")),
            part(d.get("gateway_queue_ms")),
        )


def latency_breakdown(
    done: Sequence[RequestRecord], telemetry: ServerMetrics | None = None, *, virtual: bool = False,
    gateway_wait_ms: float | None = None,
) -> LatencyBreakdown | None:
    """The breakdown of the completed measured requests ``done``; None when neither the
    server's timeline nor its histograms are there. ``virtual``: the records are a
    virtual-time run's (``sim run``), their timeline the simulated engine's own.
    ``gateway_wait_ms``: the mean wait in inferlab gateway's queue (its /metrics), where
    the run went through it: the engine's timeline counts from the engine's receipt,
    after that wait, so without it the wait would be in the rest."""
    parts = [p for p in map(request_parts, done) if p is not None]
    if parts:
        gateway = Part.of([p.gateway_queue for p in parts if p.gateway_queue is not None])
        other = Part.of([p.other for p in parts])
        source = VIRTUAL if virtual else PER_REQUEST
        if gateway is None and gateway_wait_ms is not None and other is not None:
            gateway, other = Part(gateway_wait_ms), Part(max(0.0, other.mean - gateway_wait_ms))
            source += GATEWAY_MEAN
        return LatencyBreakdown(
            source, len(parts), Part.of([p.client_queue for p in parts]),
            Part.of([p.server_queue for p in parts]), Part.of([p.prefill for p in parts]),
            Part.of([p.decode for p in parts]), other, gateway,
        )
    if telemetry is None or not telemetry.available:
        return None
    h = telemetry.histograms
    means = {k: h[k].mean_ms for k in ("queue_ms", "prefill_ms", "decode_ms") if k in h and h[k].count}
    if len(means) < 3:
        return None
    e2es = [m for m in (request_metrics(r).e2e_ms for r in done) if m is not None]
    if not e2es:
        return None
    rest = statistics.fmean(e2es) - sum(means.values()) - (gateway_wait_ms or 0.0)
    client_q = [queue_delay_ms(r) or 0.0 for r in done]
    return LatencyBreakdown(
        AGGREGATE + (GATEWAY_MEAN if gateway_wait_ms is not None else ""), len(e2es), Part.of(client_q),
        Part(means["queue_ms"]), Part(means["prefill_ms"]), Part(means["decode_ms"]), Part(max(0.0, rest)),
        None if gateway_wait_ms is None else Part(gateway_wait_ms),
    )
