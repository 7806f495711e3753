"""Formatting a sweep from its index (``sweep.json``'s dict): one line per finished
point, and the final table. Formatting only: every number comes from the index."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from inferlab.report.console import print_uncut
from inferlab.sim.engine.bands import shown_pct

#: (column, headline key, digits) of the sweep's tables.
COLUMNS = (
    ("out tok/s", "output_tok_s", 0),
    ("req/s", "req_s", 2),
    ("TTFT p50", "ttft_p50_ms", 1),
    ("TTFT p99", "ttft_p99_ms", 1),
    ("TPOT p50", "tpot_p50_ms", 2),
    ("TPOT p99", "tpot_p99_ms", 2),
    ("E2E p50", "e2e_p50_ms", 0),
)

_SHORT = {"concurrency": "c", "input_tokens": "in", "output_tokens": "out", "tensor_parallel_size": "tp",
          "max_num_batched_tokens": "mnbt", "max_num_seqs": "seqs", "quantization": "q", "capacity_scheduler_policy": "policy"}


def params_text(params: dict[str, Any]) -> str:
    """``c=16 in=512 gpu=H100``."""
    return " ".join(f"{_SHORT.get(k, k)}={_value(v)}" for k, v in params.items())


def point_line(entry: dict[str, Any]) -> str:
    """One finished point as a line: its values, status and headline (times in ms)."""
    head = entry.get("headline") or {}
    rep = f" rep {entry['repeat']}" if entry.get("repeat") else ""
    parts = [f"{params_text(entry['params'])}{rep}", entry["status"]]
    if head:
        parts.append(
            f"{_fmt(head.get('output_tok_s'), 0)} tok/s · {_fmt(head.get('req_s'), 2)} req/s · "
            f"TTFT p50/p99 {_fmt(head.get('ttft_p50_ms'), 1)}/{_fmt(head.get('ttft_p99_ms'), 1)} ms · "
            f"TPOT {_fmt(head.get('tpot_p50_ms'), 2)}/{_fmt(head.get('tpot_p99_ms'), 2)} ms"
        )
        if head.get("slo_share") is not None:
            parts.append(f"SLO met by {head['slo_share']:.0%}")
        if head.get("failed"):
            parts.append(f"{head['failed']} failed")
        if entry.get("prediction"):
            parts.append(f"prediction: {bands_short(entry['prediction'])}")
    if entry.get("reason"):
        parts.append(str(entry["reason"]))
    return "  ".join(parts)


def render_sweep(out: Console, index: dict[str, Any], title: str) -> None:
    """The final table (one row per load and group: the mean over repeats ± the 95 %
    interval's half-width when repeats > 1), then why each load axis stopped and what
    a goodput search found."""
    repeated = index.get("repeats", 1) > 1
    rows: list[tuple[dict[str, Any], str, dict[str, Any]]] = []
    if repeated:
        rows = [(a["params"], f"{a['repeats']} runs", a["headline"]) for a in index["aggregates"]]
    else:
        rows = [(p["params"], p["status"], p.get("headline") or {}) for p in index["points"]
                if p["status"] in ("done", "failed", "stopped")]
    names = list(rows[0][0]) if rows else []
    # a goodput search's probes: the share of requests that met the SLOs, and whether
    # that reached the target (a probe's status is "done" either way)
    probes = {str(pr.get("dir")): pr for g in (index.get("goodput_search") or {}).get("groups") or []
              for pr in g.get("probes") or [] if isinstance(pr, dict)}
    dirs = [] if repeated else [str(p.get("dir")) for p in index["points"] if p["status"] in ("done", "failed", "stopped")]
    t = Table(title=title + (" (mean ± 95 % CI half-width)" if repeated else ""), title_justify="left")
    # (no column wraps or is cut: the headers take two lines, and a table still wider
    # than the console is printed at its own width, below)
    for n in names:
        t.add_column(_SHORT.get(n, n), justify="right", no_wrap=True)
    t.add_column("status" if not repeated else "repeats", no_wrap=True)
    if probes:
        t.add_column("SLOs\nmet by", justify="right", no_wrap=True)
    for name, _key, _d in COLUMNS:
        t.add_column((name + ("" if name.startswith(("out", "req")) else " ms")).replace(" ", "\n", 1), justify="right", no_wrap=True)
    for i, (params, status, head) in enumerate(rows):
        cells = [_value(params.get(n)) for n in names] + [status]
        if probes:
            pr = probes.get(dirs[i]) if i < len(dirs) else None
            share = None if pr is None else pr.get("share")
            cells.append("—" if not isinstance(share, int | float) else f"{share * 100:.0f} % {'yes' if pr and pr.get('meets') else 'no'}")
        for _name, key, d in COLUMNS:
            v = head.get(key)
            if repeated:
                cells.append(_ci(v, d))
            else:
                cells.append(_fmt(v, d))
        t.add_row(*cells)
    print_uncut(out, t)
    for g in index.get("groups", []):
        label = params_text(g["params"]) or "load axis"
        s = g.get("stopped")
        if s is not None:
            knee = "no point before it" if s.get("knee") is None else f"{_short(g['load_axis'])}={_value(s['knee'])}"
            out.print(f"{label}: stopped at {_short(g['load_axis'])}={_value(s['at'])}: {str(s['reason']).rstrip('.')}; knee: {knee}",
                      soft_wrap=True)
        elif g.get("goodput") is not None:
            out.print(f"{label}: {goodput_text(g['goodput'])}", soft_wrap=True)
        elif not index.get("complete"):
            out.print(f"{label}: interrupted")
        else:
            out.print(f"{label}: {unstopped_text(index)}")
    if repeated:
        same = [params_text(a["params"]) or "every point" for a in index["aggregates"] if _repeats_identical(a)]
        if same:
            out.print(f"repeats identical ({', '.join(same)}): the simulated workload draws nothing from the seed "
                      "(fixed lengths, a closed loop), so each ± is 0 by construction, not a measure of a server's "
                      "run-to-run noise (lengths drawn, --input-tokens uniform:LO:HI, or --rate, make repeats differ)",
                      soft_wrap=True)
    skipped = sum(1 for p in index["points"] if p["status"] == "skipped")
    if skipped:
        out.print(f"{skipped} planned point(s) not run (past a stop, or after an interruption)")
    lines = band_lines(index)
    if lines:
        out.print("error bands (every number above is a prediction; the simulator's validation error for its engine "
                  "family in the point's load regime, docs/validation.md):", soft_wrap=True)
        for line in lines:
            out.print(f"  {line}", soft_wrap=True, highlight=False)


def _repeats_identical(aggregate: dict[str, Any]) -> bool:
    """Every headline metric of a point's repeats had one value (its interval is a point)."""
    values = [v for v in (aggregate.get("headline") or {}).values() if isinstance(v, dict) and v.get("n", 0) > 1]
    return bool(values) and all(v.get("ci95_low") == v.get("ci95_high") for v in values)


#: (label, the headline keys it covers): a band per metric class, as the table shows them
_BAND_GROUPS = (
    ("TTFT", ("ttft_p50_ms", "ttft_p99_ms")),
    ("TPOT", ("tpot_p50_ms", "tpot_p99_ms")),
    ("E2E", ("e2e_p50_ms", "e2e_p99_ms")),
    ("out tok/s and req/s", ("output_tok_s", "req_s")),
)


def _band(pred: dict[str, Any], key: str) -> dict[str, Any] | None:
    band = (pred.get("error_bands") or {}).get(key)
    return band if isinstance(band, dict) else None


def _group_bands(pred: dict[str, Any], label: str, keys: tuple[str, ...]) -> list[tuple[str, dict[str, Any] | None]]:
    """A metric class's bands under their labels: one for the group where its columns
    share it (throughputs; bands from a file without per-statistic ones), else one per
    column ('TTFT p50', 'TTFT p99': validation measured each statistic apart)."""
    bands = [_band(pred, k) for k in keys]
    if all(b == bands[0] for b in bands):
        return [(label, bands[0])]
    return [(f"{label} {k.split('_')[-2]}", b) for k, b in zip(keys, bands, strict=True)]


def bands_short(pred: dict[str, Any]) -> str:
    """A point's bands in a few words: 'TTFT ±23/9 % (p50/p99), TPOT ±11 %, … (vllm,
    closed loop)': one figure where a class's columns share a band, else each column's."""
    words = []
    for label, keys in _BAND_GROUPS:
        label = label.split(" and ")[0]
        bands = _group_bands(pred, label, keys)
        if len(bands) == 1:
            band = bands[0][1]
            words.append(f"{label} " + (band_pct(band) if band else "not validated"))
            continue
        pcts = "/".join(shown_pct(b["pct"]) if b else "–" for _, b in bands)
        stats = "/".join(name.rsplit(" ", 1)[1] for name, _ in bands)
        words.append(f"{label} ±{pcts} % ({stats})")
    return ", ".join(words) + f" ({pred.get('engine_family')}, {pred.get('regime')})"


def band_lines(index: dict[str, Any]) -> list[str]:
    """One line per engine family and load regime among the simulated points: which points
    (all, or their values) and each metric class's band in full; none for a measured sweep."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    ran = [p for p in index.get("points") or [] if p.get("headline")]
    for p in ran:
        pred = p.get("prediction")
        if isinstance(pred, dict):
            groups.setdefault((str(pred.get("engine_family")), str(pred.get("regime"))), []).append(p)
    lines = []
    for (family, regime), points in groups.items():
        which = "every point" if len(points) == len(ran) else ", ".join(
            dict.fromkeys(params_text(p["params"]) for p in points))
        lines.append(f"{family}, {regime} ({which}): " + "; ".join(bands_full(points[0]["prediction"])))
    return lines


def bands_full(pred: dict[str, Any], why: str | None = None) -> list[str]:
    """Each metric class's band in full ('TTFT p50 ±8 % on the medians of 131 held-out
    vLLM V1 closed loop rows'), one per column where validation measured them apart;
    ``why`` for one never validated (default: 'not validated for FAMILY (REGIME)')."""
    why = why or f"not validated for {pred.get('engine_family')} ({pred.get('regime')})"
    return [f"{name} " + (band["text"] if band else why)
            for label, keys in _BAND_GROUPS for name, band in _group_bands(pred, label, keys)]


def band_pct(band: dict[str, Any]) -> str:
    """A band as a number beside a value: '±8 %'."""
    return f"±{shown_pct(band['pct'])} %"


def slo_text(slo: Any) -> str:
    """A tune's (or run's) SLOs as stated: 'TTFT ≤ 400 ms, TPOT ≤ 26 ms'; 'none stated'."""
    limits = [f"{label} ≤ {slo[key]:g} ms" for key, label in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("e2e_ms", "E2E"))
              if isinstance(slo, dict) and isinstance(slo.get(key), int | float)]
    return ", ".join(limits) or "none stated"


def tune_text(tune: dict[str, Any]) -> str:
    """What a tune chose by: its objective, the SLOs each request is held to, and its
    best trial and why."""
    objective = tune.get("objective")
    what = ("goodput: requests/s completed within every SLO" if objective == "goodput" else
            f"output tokens/s of trials where at least {_pct(tune.get('slo_share'))} of requests met the SLOs (others score 0)"
            if objective == "throughput" else str(objective))
    best = tune.get("best")
    chosen = ("no trial ran to the end" if not isinstance(best, dict) else
              f"trial {best.get('trial')} ({best.get('why') or 'the highest score'})")
    return f"objective {what}; SLOs, per request: {slo_text(tune.get('slo'))}; the best: {chosen}"


def met_text(point: dict[str, Any]) -> str:
    """Whether a tune's trial met the SLOs: 'all 150 requests', '143 of 150 (7 missed)'
    (failed ones among the missed); a trial stopped early: '120 before it stopped'."""
    met, total = point.get("met_slo"), (point.get("headline") or {}).get("total")
    if not isinstance(met, int) or not isinstance(total, int) or total <= 0:
        return "—"
    if point.get("status") != "done":
        return f"{met} before it {point.get('status')}"
    return f"all {total} requests" if met >= total else f"{met} of {total} ({total - met} missed)"


def _pct(share: Any) -> str:
    return f"{share * 100:g} %" if isinstance(share, int | float) else "?"


def goodput_text(g: dict[str, Any]) -> str:
    probes = len(g.get("probes", []))
    if g.get("max_rate") is None and not any(p.get("dir") for p in g.get("probes", [])):
        return f"could not run: {g.get('note')}"
    if g.get("max_rate") is None:
        return f"no rate met the SLOs ({g.get('note')}; {probes} probes)"
    text = f"max rate meeting the SLOs {g['max_rate']:.3g} req/s"
    if g.get("fails_at") is not None:
        text += f"; {g['fails_at']:.3g} req/s does not"
    if g.get("note"):
        text += f" ({g['note']})"
    return text + f"; {probes} probes"


def _short(axis: str) -> str:
    return _SHORT.get(axis, axis)


def _value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "—" if v is None else str(v)


def _fmt(v: float | None, digits: int) -> str:
    return "—" if v is None else f"{v:,.{digits}f}"


def _ci(v: dict[str, Any] | None, digits: int) -> str:
    if not v:
        return "—"
    if v.get("ci95_high") is None:
        return _fmt(v["mean"], digits)
    return f"{v['mean']:,.{digits}f} ± {(v['ci95_high'] - v['ci95_low']) / 2:,.{digits}f}"


def unstopped_text(index: dict[str, Any]) -> str:
    """What a complete sweep's group that no stop ended says of its load axis."""
    if "saturation" in index and index["saturation"] is None:
        return "every load run; saturation not looked for (--no-saturation-stop)"
    return "did not saturate (raise the top of the load axis to find the knee)"
