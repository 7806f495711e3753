"""Goodput search: the highest request rate at which a share of requests meets the SLOs.

Bracketing (doubling up from the start rate while it passes, or halving down while it
fails), then bisection in log space until the passing and failing rates are within
``step`` of each other, then a check that the rate exactly ``step`` above the answer
fails (repeated from there if it passes). Every probe is a run; the caller records it.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from inferlab.results.metrics import SLO, request_metrics
from inferlab.results.records import RequestRecord


@dataclass(frozen=True)
class Probe:
    """One run at ``rate_rps``: the share of measured requests that completed within
    every SLO, whether that share reached the target (``meets``) and the run's
    directory. ``stopped``: the run was interrupted; ``error``: it could not run at all
    (the engine does not hold the model): either ends the search."""

    rate_rps: float
    share: float | None
    meets: bool
    dir: str | None = None
    stopped: bool = False
    error: str | None = None
    # requests in flight on average (completed per second × median E2E, in seconds):
    # at or below ``ALONE_IN_FLIGHT`` they barely overlapped, and no lower rate gives them less company
    in_flight: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"rate": self.rate_rps, "share": self.share, "meets": self.meets, "dir": self.dir}


@dataclass(frozen=True)
class SearchResult:
    """``max_rate``: the highest rate probed that met the SLOs (None: none did);
    ``fails_at``: the rate ``step`` above it, probed, that did not (None: not reached);
    ``note``: why the search ended otherwise."""

    max_rate: float | None
    fails_at: float | None
    probes: tuple[Probe, ...]
    note: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "max_rate": self.max_rate, "fails_at": self.fails_at, "note": self.note,
            "probes": [p.to_json() for p in self.probes],
        }


def slo_share(records: list[RequestRecord], slo: SLO) -> float | None:
    """The share of measured (non-warm-up) requests that completed meeting every limit
    of ``slo``; a failed request counts as missing them. None without requests."""
    measured = [r for r in records if not r.warmup]
    if not measured:
        return None
    good = sum(1 for r in measured if r.ok and slo.met_by(request_metrics(r)))
    return good / len(measured)


#: Stop bracketing after this many doublings or halvings from the start rate.
MAX_BRACKET_STEPS = 16
#: A probe that missed with requests this few in flight on average: they barely
#: overlapped, so a lower rate would not help; the halving stops there (over HTTP each
#: halving doubles a probe's wall time: sixteen of them took days).
ALONE_IN_FLIGHT = 1.1


async def find_max_rate(
    probe: Callable[[float], Awaitable[Probe]],
    start_rps: float,
    *,
    step: float = 1.1,
    max_probes: int = 40,
) -> SearchResult:
    """Search with ``probe`` (one run at a rate) from ``start_rps``; see the module. The
    search ends early, with a ``note``, when a probe is interrupted or cannot run (its
    error), when no rate down to ``start_rps / 2**16`` meets the SLOs or a probe that
    missed had its requests barely overlapping (``ALONE_IN_FLIGHT``), when none up to
    ``start_rps * 2**16`` fails, or after ``max_probes`` runs."""
    if not start_rps > 0 or math.isinf(start_rps):
        raise ValueError("the start rate must be a positive number")
    if not step > 1:
        raise ValueError("the step must be above 1")
    probes: list[Probe] = []

    class _End(Exception):
        pass

    async def passes(rate: float) -> bool:
        if len(probes) >= max_probes:
            raise _End(f"stopped after {max_probes} probes")
        p = await probe(rate)
        probes.append(p)
        if p.stopped:
            raise _End("interrupted")
        if p.error is not None:
            raise _End(p.error)
        return p.meets

    lo: float | None = None
    hi: float | None = None
    try:
        if await passes(start_rps):
            lo = start_rps
            for _ in range(MAX_BRACKET_STEPS):
                if not await passes(lo * 2):
                    hi = lo * 2
                    break
                lo *= 2
            else:
                return SearchResult(lo, None, tuple(probes), f"every rate up to {lo:g} req/s met the SLOs")
        else:
            hi = start_rps
            for _ in range(MAX_BRACKET_STEPS):
                last = probes[-1]
                if last.in_flight is not None and last.in_flight <= ALONE_IN_FLIGHT:
                    return SearchResult(None, hi, tuple(probes), (
                        f"at {hi:g} req/s the requests barely overlapped ({last.in_flight:.2f} in flight on average) "
                        "and still missed them, so no lower rate meets them: out of this engine's reach at any load"))
                if await passes(hi / 2):
                    lo = hi / 2
                    break
                hi /= 2
            else:
                return SearchResult(None, hi, tuple(probes), f"no rate down to {hi:g} req/s met the SLOs")
        assert lo is not None and hi is not None
        while hi > lo * step * (1 + 1e-9):
            mid = math.sqrt(lo * hi)
            if await passes(mid):
                lo = mid
            else:
                hi = mid
        while not math.isclose(hi, lo * step, rel_tol=1e-9):
            # the answer is only as good as the probe just above it: run it exactly
            if await passes(lo * step):
                lo *= step
            else:
                hi = lo * step
        return SearchResult(lo, hi, tuple(probes))
    except _End as e:
        return SearchResult(lo, None, tuple(probes), str(e))
