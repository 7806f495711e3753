"""What two runs actually sent, where their configs say they asked the same: how exact
their prompt lengths were (``summary.json``'s ``input_length_source``), and the prompt
and answer tokens of their requests as the server counted them. ``compare`` warns of a
difference as it warns of different settings (``results.loaddiff``): one trace benched
straight at an engine, with exact lengths (its ``/tokenize``), and through a server
without that route, with lengths calibrated from usage, sent 6 % fewer prompt tokens
from the same config.

Tokens are compared request by request, over the requests both runs completed, and only
for two runs of one draw of the workload: each request asked for the lengths the other
run's did up to one constant (the chat template's tokens, which a request's asked length
leaves out, differ between servers); or, where the records do not say what a request
asked for (``sim run``), both runs had the same seed. Their totals must differ by more
than ``TOLERANCE``. Runs of different draws (another seed, repeats) are not compared by
their tokens: the lengths they drew differ by design, and a failed share changes which
of them completed (their length sources are compared all the same).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from inferlab.results.loaddiff import Difference
from inferlab.results.records import RequestRecord

if TYPE_CHECKING:
    from inferlab.results.sources import Run

#: A relative difference in tokens sent at or below this is not said.
TOLERANCE = 0.02

#: (record field, the field of what the request asked for, words)
_TOKENS = (("input_tokens", "requested_input_tokens", "prompt tokens as sent"),
           ("output_tokens", "requested_output_tokens", "answer tokens"))


def sent_differences(a: Sequence[Run], b: Sequence[Run], *, tokens: bool = True) -> list[Difference]:
    """How the runs of side ``b`` sent otherwise than those of side ``a``. ``tokens``
    False: the length sources alone (the configs differ in workload, which explains the
    tokens)."""
    out = []
    source_a, source_b = _length_source(a), _length_source(b)
    if source_a and source_b and source_a != source_b:
        out.append(Difference("input_length_source", "prompt lengths", source_a, source_b))
    if tokens and len(a) == len(b) == 1:
        for field, requested, words in _TOKENS:
            out += _tokens(a[0], b[0], field, requested, words)
    return out


def _length_source(side: Sequence[Run]) -> str | None:
    """The runs' ``input_length_source`` where they share one (None: not recorded)."""
    sources = {r.summary.get("input_length_source") for r in side}
    source = sources.pop() if len(sources) == 1 else None
    return source if isinstance(source, str) else None


def _tokens(a: Run, b: Run, field: str, requested: str, words: str) -> list[Difference]:
    """``field``'s total over the requests both runs completed, where they differ by
    more than ``TOLERANCE`` and the runs are of one draw."""
    da, db = _done(a.records, field), _done(b.records, field)
    common = sorted(set(da) & set(db))
    asked = {_minus(getattr(da[i], requested), getattr(db[i], requested)) for i in common}
    if not common or (len(asked) != 1 if asked != {None} else not _same_seed(a, b)):
        return []
    ta, tb = (sum(int(getattr(d[i], field)) for i in common) for d in (da, db))
    if ta == tb or (ta and abs(tb / ta - 1) <= TOLERANCE):
        return []
    n = len(common)
    change = f", {(tb / ta - 1) * 100:+.1f}%" if ta else ""
    text = f"{words} {ta / n:,.1f} vs {tb / n:,.1f} a request ({ta:,} vs {tb:,} in all over the {n:,} requests both completed{change})"
    return [Difference(f"sent.{field}", words, {"mean": ta / n, "total": ta, "requests": n},
                       {"mean": tb / n, "total": tb, "requests": n}, text)]


def _done(records: Sequence[RequestRecord], field: str) -> dict[int, RequestRecord]:
    """The completed requests that have ``field``, by index."""
    return {r.index: r for r in records if r.ok and isinstance(getattr(r, field), int)}


def _minus(x: object, y: object) -> int | None:
    """``x - y`` for two whole numbers; None where either is not one (not recorded)."""
    return x - y if isinstance(x, int) and isinstance(y, int) else None


def _same_seed(a: Run, b: Run) -> bool:
    seeds = [(r.config.get("load") or {}).get("seed") for r in (a, b)]
    return seeds[0] is not None and seeds[0] == seeds[1]
