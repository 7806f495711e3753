"""Fill ``bench/data``'s ``distribution`` column from the statistics each row's notes quote.

A source that reports a mean usually reports the median and a tail beside it (vLLM's
``benchmark_serving`` prints mean, median and p99 of TTFT, TPOT and ITL); the rows kept
the headline statistic in the metric columns and quoted the rest in their notes. This
script reads those quotes, in the few forms the notes use, into the ``distribution``
column (``ttft_ms median=107.96 p99=269.46; tpot_ms ...``, in ms), so that validation
compares the shape of each run's latencies as well as its headline
(``bench/validate_sim.py``, "distributions"). Every value is the notes' own; the only
arithmetic is seconds to milliseconds where a quote is in seconds.

    python bench/distribution_cells.py          # rewrite the column in every file
    python bench/distribution_cells.py --check  # exit 1 if a file's column differs

Rows that run no requests of their own (static batches, offline runs) get none; neither
does ITL where the notes say the stream came in multi-token chunks. A cell already filled
(InferenceMAX's, written from its JSON by ``bench/inferencemax_rows.py``) must agree with
what the notes give.
"""

from __future__ import annotations

import csv
import io
import re
import sys
from pathlib import Path

from inferlab.sim.validation.scenario import LATENCY_COLUMNS, stat_order

DATA = Path(__file__).resolve().parent / "data"
COLUMN = "distribution"
METRICS = {"TTFT": "ttft_ms", "TPOT": "tpot_ms", "ITL": "itl_ms", "E2E": "e2e_latency_ms"}
NUM = r"(\d+(?:\.\d+)?)"


def _headline_stat(row: dict[str, str], metric: str) -> str:
    """The statistic the row's own column holds (what validation reads from metric_stat)."""
    from inferlab.sim.validation.calibration import _stat_for

    return _stat_for(metric, row.get("metric_stat", ""))


def read_notes(row: dict[str, str]) -> dict[str, dict[str, str]]:
    """``{metric: {stat: value in ms, as written}}`` from the row's notes."""
    notes = row.get("notes", "")
    found: dict[str, dict[str, str]] = {}

    def put(metric: str, stat: str, value: str) -> None:
        found.setdefault(metric, {})[stat] = value

    # 'median TTFT 60.38, p99 73.49; median TPOT 7.22; median ITL 7.23, p99 8.17' (and
    # 'median TTFT 58.6838 ms, p99 TTFT 117.731'): benchmark_serving's summary, transcribed
    for m in re.finditer(r"median (TTFT|TPOT|ITL|E2E) " + NUM + r"(?: ms)?(?:, p99(?: \1)? " + NUM + r")?( \(multi-token chunks\))?", notes):
        if m.group(4):
            continue  # gaps between multi-token chunks, not between tokens
        put(METRICS[m.group(1)], "median", m.group(2))
        if m.group(3):
            put(METRICS[m.group(1)], "p99", m.group(3))
    # 'TTFT mean/median/p99 16383.88/16164.27/19975.18 ms' (the summary quoted whole)
    for m in re.finditer(r"(TTFT|TPOT|ITL) mean/median/p99 " + NUM + "/" + NUM + "/" + NUM + " ms", notes):
        metric = METRICS[m.group(1)]
        put(metric, "mean", m.group(2))
        put(metric, "median", m.group(3))
        put(metric, "p99", m.group(4))
    # a page's table: 'Max Concurrency | Req/s | Output Tok/s | Mean TTFT (ms) | Median TTFT (ms) | P99 TTFT (ms)'
    if "| Mean TTFT (ms) | Median TTFT (ms) | P99 TTFT (ms)'" in notes:
        m = re.search(r"'\d+ \| [\d.]+ \| \d+ \| " + NUM + r" \| " + NUM + r" \| " + NUM + "'", notes)
        if m:
            put("ttft_ms", "mean", m.group(1))
            put("ttft_ms", "median", m.group(2))
            put("ttft_ms", "p99", m.group(3))
    # 'Medians: TTFT 43.50, TPOT 19.45, ITL 19.24[, E2E 10637 ms]'
    m = re.search(r"Medians: ((?:(?:TTFT|TPOT|ITL|E2E) [\d.]+(?:, )?)+)", notes)
    if m:
        for name, value in re.findall(r"(TTFT|TPOT|ITL|E2E) (\d+(?:\.\d+)?)", m.group(1)):
            put(METRICS[name], "median", value)
    # 'TTFT  p50 0.051s  p95 0.052s  p99 0.508s  mean 0.060s' / 'TOTAL p50 1.486s ...' /
    # 'per-req latency p50 1.741s ...' (seconds; TOTAL and per-request latency are E2E)
    for m in re.finditer(r"'(TTFT|TOTAL|per-req latency)\s+((?:(?:p\d{2}|mean) [\d.]+s\s*)+)'", notes):
        metric = "ttft_ms" if m.group(1) == "TTFT" else "e2e_latency_ms"
        for stat, seconds in re.findall(r"(p\d{2}|mean) ([\d.]+)s", m.group(2)):
            put(metric, "median" if stat == "p50" else stat, f"{float(seconds) * 1000:g}")
    # 'mean_ttft_ms 137.06 (median 109.60)': a result JSON quoted
    for m in re.finditer(r"mean_(ttft|tpot|itl)_ms " + NUM + r" \(median " + NUM + r"\)", notes):
        put(f"{m.group(1)}_ms", "mean", m.group(2))
        put(f"{m.group(1)}_ms", "median", m.group(3))
    # LMDeploy's profiler: 'per-token latency p75/p95/p99 = 21/22/25 ms' (its ITL)
    m = re.search(r"per-token latency p75/p95/p99 = " + NUM + "/" + NUM + "/" + NUM + " ms", notes, re.IGNORECASE)
    if m:
        for stat, value in zip(("p75", "p95", "p99"), m.groups(), strict=True):
            put("itl_ms", stat, value)
    # a lab's table of percentiles: 'TTFT p50/p95/p99 275.24/8213.88/8222.99 ms, TPOT p99
    # 12.42 ms, E2E p99 11032.65 ms'
    m = re.search(
        r"TTFT p50/p95/p99 " + NUM + "/" + NUM + "/" + NUM + " ms, TPOT p99 " + NUM + " ms, E2E p99 " + NUM + " ms", notes
    )
    if m:
        for stat, value in zip(("median", "p95", "p99"), m.groups()[:3], strict=True):
            put("ttft_ms", stat, value)
        put("tpot_ms", "p99", m.group(4))
        put("e2e_latency_ms", "p99", m.group(5))
    # 'mean E2E 7840.62 ms' beside a median headline
    m = re.search(r"mean E2E " + NUM + " ms", notes)
    if m:
        put("e2e_latency_ms", "mean", m.group(1))
    return found


def cell(row: dict[str, str]) -> str:
    """The row's ``distribution`` cell: what its notes quote, less what its own columns
    hold; empty for rows without per-request latencies."""
    from inferlab.sim.validation.calibration import _kind
    from inferlab.sim.validation.scenario import ScenarioError

    try:
        kind = _kind(row.get("scenario", ""), row.get("batch_or_concurrency", ""), row.get("request_rate_rps", ""))
    except ScenarioError:
        return ""  # (validation skips the row, saying why)
    if kind in ("static", "offline"):
        return ""
    groups = []
    for metric, stats in sorted(read_notes(row).items(), key=lambda kv: LATENCY_COLUMNS.index(kv[0])):
        own = _headline_stat(row, metric) if row.get(metric, "").strip() else None
        pairs = [f"{s}={v}" for s, v in sorted(stats.items(), key=lambda kv: stat_order(kv[0])) if s != own]
        if pairs:
            groups.append(" ".join([metric, *pairs]))
    return "; ".join(groups)


def rewrite(path: Path) -> tuple[str, list[str]]:
    """The file's text with the column filled, and the rows whose filled cell disagrees."""
    raw = path.read_text(encoding="utf-8")
    reader = csv.DictReader(io.StringIO(raw, newline=""))
    fields = list(reader.fieldnames or [])
    if COLUMN not in fields:
        fields.append(COLUMN)
    rows = list(reader)
    conflicts = []
    for row in rows:
        new = cell(row)
        old = (row.get(COLUMN) or "").strip()
        if old and new != old:
            conflicts.append(f"{path.name} row {row['row_id']}: {old!r} written, the notes give {new!r}")
        row[COLUMN] = old or new
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue(), conflicts


def main(argv: list[str]) -> int:
    check = argv == ["--check"]
    if argv and not check:
        print("usage: python bench/distribution_cells.py [--check]", file=sys.stderr)
        return 2
    status = 0
    for path in sorted(DATA.glob("*.csv")):
        text, conflicts = rewrite(path)
        for c in conflicts:
            print(c, file=sys.stderr)
            status = 1
        if text != path.read_text(encoding="utf-8"):
            if check:
                print(f"{path.name}: the distribution column is not what the notes give", file=sys.stderr)
                status = 1
            else:
                path.write_text(text, encoding="utf-8")
                print(f"wrote {path.name}")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
