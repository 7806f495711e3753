"""Records for the results tests: times given in ms from the run's start."""

from __future__ import annotations

from inferlab.results.records import RequestRecord

MS = 1_000_000


def rec(index: int, send_ms: float, content_ms: list[float], end_ms: float, out: int | None, inp: int = 10, **kw: object) -> RequestRecord:
    """A completed request (``out`` output tokens, ``None``: no usage) sent at
    ``send_ms``, with a content chunk at each of ``content_ms`` and its end at ``end_ms``."""
    return RequestRecord(
        index=index,
        send_ns=int(send_ms * MS),
        ttfb_ns=int(content_ms[0] * MS) if content_ms else None,
        content_ns=[int(t * MS) for t in content_ms],
        end_ns=int(end_ms * MS),
        input_tokens=inp,
        output_tokens=out,
        usage_source="server" if out is not None else "none",
        **kw,  # type: ignore[arg-type]
    )
