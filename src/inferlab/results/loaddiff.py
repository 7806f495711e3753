"""What differs between two runs' load and workload, read from their ``config.json``:
``compare`` and ``report`` say it before any verdict, since a change between runs that
asked different things of the server is not the server's alone.

Compared: the model, the API and streaming, the load (closed or open loop, its users or
rate, arrivals, cap), the number of requests, duration and warm-up, and the workload
(prompt and output lengths, exact output, a fixed prompt, a dataset or trace, shared
prefixes, sessions) and the extra request fields (sampling). Left out, as what
legitimately differs between runs of one workload: seeds and prompt salts, output
folders, timeouts, credentials and headers, the client's own settings (workers, HTTP
stack, preflight, tokenizer), SLOs (goodput is not compared), and the server itself (its
URL, its engine flags: what a comparison is for). A setting is compared only where both
runs record its part of the config (``sim run`` records no ``stream``).

The server's settings are compared apart (``engine_differences``), to be shown beside
the runs rather than warned of: inferlab gateway in front of the server (there or not,
its setup), the engine config a ``bench --engine`` run started its server from, the
simulated engine's flags, and the settings a measured server states.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Difference:
    """One setting whose value differs: ``setting`` (where in config.json), ``label``
    (in words), the baseline's value ``a`` and the other run's ``b``, as recorded;
    ``words``, where given, the whole of ``text``."""

    setting: str
    label: str
    a: Any
    b: Any
    words: str | None = None  # (the whole text, where the values need more words than "A vs B")

    @property
    def text(self) -> str:
        return self.words or f"{self.label} {_show(self.a)} vs {_show(self.b)}"

    def to_json(self) -> dict[str, Any]:
        return {"setting": self.setting, "label": self.label, "a": self.a, "b": self.b}


def _model(config: Mapping[str, Any]) -> Any:
    if config.get("command") == "sim run":
        return (config.get("engine") or {}).get("model")
    return (config.get("resolved") or {}).get("model") or config.get("model")


def _load(config: Mapping[str, Any]) -> Any:
    schedule = (config.get("load") or {}).get("schedule")
    return schedule_text(schedule) if isinstance(schedule, Mapping) else None


def _at(path: str) -> Callable[[Mapping[str, Any]], Any]:
    def read(config: Mapping[str, Any]) -> Any:
        value: Any = config
        for part in path.split("."):
            value = value.get(part) if isinstance(value, Mapping) else None
        return value

    return read


#: (setting, words, the part of config.json both runs must record, how to read it).
_SETTINGS: tuple[tuple[str, str, str, Callable[[Mapping[str, Any]], Any]], ...] = (
    ("model", "model", "", _model),
    ("api", "API", "api", _at("api")),
    ("stream", "streaming", "stream", _at("stream")),
    ("load.schedule", "load", "load", _load),
    ("load.num_requests", "requests (-n)", "load", _at("load.num_requests")),
    ("load.duration_s", "duration s (--duration)", "load", _at("load.duration_s")),
    ("load.warmup", "warm-up requests", "load", _at("load.warmup")),
    ("workload.input_tokens", "prompt lengths (--input-tokens)", "workload", _at("workload.input_tokens")),
    ("workload.output_tokens", "output lengths, max tokens (--output-tokens)", "workload", _at("workload.output_tokens")),
    ("workload.exact_output", "exact output lengths", "workload", _at("workload.exact_output")),
    ("workload.prompt", "prompt (--prompt)", "workload", _at("workload.prompt")),
    ("workload.dataset", "dataset", "workload", _at("workload.dataset")),
    ("workload.trace", "trace", "workload", _at("workload.trace")),
    ("workload.prefix_groups", "prefix groups", "workload", _at("workload.prefix_groups")),
    ("workload.prefix_tokens", "prefix tokens", "workload", _at("workload.prefix_tokens")),
    ("workload.suffix_tokens", "suffix tokens", "workload", _at("workload.suffix_tokens")),
    ("workload.prefix_popularity", "prefix popularity", "workload", _at("workload.prefix_popularity")),
    ("workload.sessions", "sessions", "workload", _at("workload.sessions")),
    ("workload.turns", "turns", "workload", _at("workload.turns")),
    ("workload.think_time_s", "think time s", "workload", _at("workload.think_time_s")),
    ("workload.system_tokens", "system prompt tokens", "workload", _at("workload.system_tokens")),
    ("workload.context_window_tokens", "context window tokens", "workload", _at("workload.context_window_tokens")),
    ("extra_body", "extra request fields (--extra-body, --temperature)", "extra_body", _at("extra_body")),
)


def load_differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[Difference]:
    """The load and workload settings of two runs' configs (``config.json`` as dicts) that
    differ, in a fixed order; empty when they asked the same of the server."""
    out = []
    for setting, label, part, read in _SETTINGS:
        if part and (part not in a or part not in b):
            continue
        va, vb = read(a), read(b)
        if part == "" and (va is None or vb is None):
            continue  # (a folder of records alone does not say)
        if _norm(va) != _norm(vb):
            out.append(Difference(setting, label, va, vb))
    return out


#: ``engine_config`` keys that say where and how long, not how the engine runs.
_NOT_ENGINE = frozenset({"host", "port", "ready_timeout_s", "model"})


def engine_differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[Difference]:
    """The server settings of two runs' configs that differ, key by key: ``engine_config``
    (what ``bench --engine`` started its server from), the simulated engine's flags
    (``results.provenance.simulated_engine``: ``sim run``'s, ``sim serve``'s answer) and
    ``resolved.server_software.settings`` (what a measured server states). Each only
    where both runs record it; its address, port and start-up wait, and the model
    (``load_differences`` says it), are left out. Empty when they ran alike."""
    from inferlab.results.provenance import simulated_engine

    def stated(config: Mapping[str, Any]) -> Any:
        return _at("resolved.server_software.settings")(config)

    out = gateway_differences(a, b)
    for part, label, read in (("engine_config", "engine config", _at("engine_config")),
                              ("engine", "simulated engine", simulated_engine),
                              ("resolved.server_software.settings", "stated by the server", stated)):
        va, vb = read(a), read(b)
        if not isinstance(va, Mapping) or not isinstance(vb, Mapping):
            continue
        for key in dict.fromkeys([*va, *vb]):
            if key not in _NOT_ENGINE and _norm(va.get(key)) != _norm(vb.get(key)):
                out.append(Difference(f"{part}.{key}", f"{key} ({label})", va.get(key), vb.get(key)))
    return out


#: The setting of a run that went through inferlab gateway beside one that did not.
GATEWAY = "resolved.gateway"


def gateway_differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[Difference]:
    """Whether the runs went through inferlab gateway (``resolved.gateway``, its setup as
    it answered), and where both did, its setup's settings that differ: the number of
    upstreams (not their addresses), router, admission, cache, client keys, Redis. Only
    where both runs record whether a gateway answered (``bench`` against a server)."""
    from inferlab.results.provenance import describe_gateway

    ra, rb = a.get("resolved"), b.get("resolved")
    if not isinstance(ra, Mapping) or not isinstance(rb, Mapping) or "gateway" not in ra or "gateway" not in rb:
        return []
    ga, gb = ra["gateway"], rb["gateway"]
    if not isinstance(ga, Mapping) or not isinstance(gb, Mapping):
        if isinstance(ga, Mapping) == isinstance(gb, Mapping):
            return []
        said = [f"inferlab gateway ({describe_gateway(g)})" if isinstance(g, Mapping) else "no gateway" for g in (ga, gb)]
        return [Difference(GATEWAY, "inferlab gateway", said[0], said[1], words=f"{said[0]} vs {said[1]}")]
    sa, sb = _gateway_settings(ga), _gateway_settings(gb)
    return [Difference(f"{GATEWAY}.{key}", f"{key} (inferlab gateway)", sa.get(key), sb.get(key))
            for key in dict.fromkeys([*sa, *sb]) if _norm(sa.get(key)) != _norm(sb.get(key))]


def _gateway_settings(setup: Mapping[str, Any]) -> dict[str, Any]:
    """A gateway's setup, flat (``admission.queue_max``), as compared: its upstreams
    counted, not named (a rerun on other ports is the same setup)."""
    ups = setup.get("upstreams")
    out: dict[str, Any] = {"upstreams": len(ups) if isinstance(ups, list) else None}
    for key, value in setup.items():
        if key in ("upstreams", "max_model_len"):
            continue
        if isinstance(value, Mapping):
            out.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            out[key] = value
    return out


def load_text(config: Mapping[str, Any]) -> str | None:
    """What a run asked of the server, in words, from its ``config.json``: the load and
    what bounded it, the prompts and answers, the API and streaming ('closed loop of 4
    users, 200 requests; prompts 1,000 tokens, answers 256 tokens (exact); chat API,
    streamed'). None for a config that records no load."""
    load = config.get("load")
    if not isinstance(load, Mapping) or not isinstance(load.get("schedule"), Mapping):
        return None
    n, secs, warm = load.get("num_requests"), load.get("duration_s"), load.get("warmup")
    bounds = [f"{n:,} request{'' if n == 1 else 's'}" if isinstance(n, int) else "", f"{_show(secs)} s" if secs else ""]
    head = schedule_text(load["schedule"])
    if any(bounds):
        head += ", " + " or ".join(b for b in bounds if b)
    if warm:
        head += f" (+{warm} warm-up)"
    w = config.get("workload")
    w = w if isinstance(w, Mapping) else {}
    return "; ".join(p for p in (head, f"{_prompts_text(w)}, {_answers_text(w)}", _api_text(config)) if p)


def _prompts_text(w: Mapping[str, Any]) -> str:
    if isinstance(trace := w.get("trace"), (str, Mapping)):
        text = f"the requests of trace {_trace_text(trace)}"
    elif isinstance(dataset := w.get("dataset"), (str, Mapping)):
        text = f"prompts from {_dataset_text(dataset)}"
    elif w.get("prefix_tokens"):
        groups = w.get("prefix_groups") or 1
        text = (f"prompts of a shared {_tokens(w['prefix_tokens'])}-token prefix ({groups} group{'' if groups == 1 else 's'}, "
                f"{w.get('prefix_popularity') or 'uniform'}) + {_tokens(w.get('suffix_tokens'))} tokens")
    elif w.get("input_tokens"):
        text = f"prompts {_tokens(w['input_tokens'])} tokens"
    else:
        text = "one prompt every time" + ("" if w.get("prompt") else " (the default)")
    if w.get("sessions"):
        text += f", {w['sessions']} sessions of {w.get('turns')} turns"
        if w.get("think_time_s"):
            text += f" ({_show(w['think_time_s'])} s think time)"
        if w.get("context_window_tokens"):
            text += f", context trimmed to {_tokens(w['context_window_tokens'])} tokens"
    return text


def _file_name(path: Any) -> str:
    return str(path).replace("\\", "/").rsplit("/", 1)[-1]


def _trace_text(trace: str | Mapping[str, Any]) -> str:
    """A trace as config.json records it (its file, speed-up and window), in words:
    'azure.csv (10x faster, 0-600 s of it)'."""
    if isinstance(trace, str):
        return _file_name(trace)
    said = []
    if (speedup := trace.get("speedup")) not in (None, 1, 1.0):
        said.append(f"{_show(speedup)}x faster")
    start, end = trace.get("start_s"), trace.get("end_s")
    if start or end is not None:
        said.append(f"{_show(start or 0)}-{_show(end) if end is not None else 'its end'} s of it")
    return _file_name(trace.get("path")) + (f" ({', '.join(said)})" if said else "")


def _dataset_text(dataset: str | Mapping[str, Any]) -> str:
    """A dataset as config.json records it (its file and length limits), in words:
    'sharegpt.json (prompts of at most 2,000 tokens)'."""
    if isinstance(dataset, str):
        return _file_name(dataset)
    lo, hi = dataset.get("min_input_tokens"), dataset.get("max_input_tokens")
    limits = [f"at least {_tokens(lo)}" if lo else "", f"at most {_tokens(hi)}" if hi else ""]
    said = " and ".join(x for x in limits if x)
    return _file_name(dataset.get("path")) + (f" (prompts of {said} tokens)" if said else "")


def _tokens(v: Any) -> str:
    """A token count as the summary writes counts (2,000; config.json records a length
    spec's text, '1000'), any other length spec as given."""
    if isinstance(v, str) and v.isdigit():
        v = int(v)
    return f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else _show(v)


def _answers_text(w: Mapping[str, Any]) -> str:
    out, exact = w.get("output_tokens"), " (exact)" if w.get("exact_output") else " at most"
    if out:
        return f"answers {_tokens(out)} tokens{exact}"
    if w.get("trace"):
        return f"answers of the trace's lengths{exact}"
    if w.get("dataset"):
        return f"answers of the dataset's lengths{exact} where its rows state them, else as long as the model makes them"
    return "answers as long as the model makes them"


def _api_text(config: Mapping[str, Any]) -> str:
    parts = [f"{config['api']} API"] if config.get("api") else []
    if "stream" in config:  # (sim run records none: it has no HTTP)
        parts.append("streamed" if config.get("stream") else "not streamed")
    return ", ".join(parts)


def schedule_text(s: Mapping[str, Any]) -> str:
    """A load schedule in words: 'closed loop of 4 users', 'open loop at 8 req/s (poisson)'."""
    kind = s.get("kind")
    if kind == "ClosedLoop":
        users = s.get("concurrency")
        return f"closed loop of {users} user{'' if users == 1 else 's'}"
    cap = f", at most {s['max_concurrency']} in flight" if s.get("max_concurrency") else ""
    if kind == "OpenLoop":
        rate = s.get("rate_rps")
        arrival = s.get("arrival") or "poisson"
        shape = f"{arrival}, burstiness {_show(s.get('burstiness'))}" if arrival == "gamma" else arrival
        return f"open loop at {_show(rate)} req/s ({shape}){cap}"
    if kind == "Replay":
        return f"the trace's own times{cap}"
    return json.dumps(dict(s), sort_keys=True, default=str)


def _norm(v: Any) -> Any:
    """Values as compared: a number as a float (4 and 4.0 are one setting)."""
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return v
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, Mapping):
        return {k: _norm(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_norm(x) for x in v]
    return v


def _show(v: Any) -> str:
    if v is None:
        return "none"
    if isinstance(v, float):
        return "inf" if math.isinf(v) else f"{v:g}"
    if isinstance(v, Mapping):
        return json.dumps({k: x for k, x in v.items() if x is not None}, default=str)
    if isinstance(v, str) and v == "":
        return '""'
    return str(v)
