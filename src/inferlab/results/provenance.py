"""Where a run's numbers come from: measured on a server, or predicted by inferlab's
simulator. One rule, read from what every reader has (a run's ``config.json``):

- ``sim run`` (and every run in virtual time: a simulated sweep point, a what-if):
  the simulator in virtual time;
- a run over HTTP whose ``url`` is null: the embedded simulated server that ``bench``
  or ``profile`` started without ``--url``;
- a run over HTTP whose server answered ``/inferlab/engine`` with the gateway's answer
  (``gateway_answer``): ``inferlab gateway`` at that URL, every upstream of which is
  ``inferlab sim serve`` (the gateway answers only when each of them does);
- a run over HTTP whose server answered ``/inferlab/engine`` (recorded as
  ``resolved.engine``): ``inferlab sim serve`` at that URL (also an engine config of
  kind ``sim``);
- any other run: a server, measured.

The first four are *simulated*: every number they hold is a prediction of the
simulator, and whatever shows one says "(prediction)" beside it. Only virtual-time runs
carry error bands (``summary.json``'s ``prediction``); over HTTP the real-time server
adds its own lateness, and nothing validated measures that.

Whatever is behind it, ``inferlab gateway`` answers ``GATEWAY_ROUTE`` with its own
setup (router, admission, cache: ``gateway.config.GatewayConfig.setup``); a run records
it (``resolved.gateway``) and says the gateway was there, with that setup in words,
in front of the software its upstreams said they are (the gateway asks each one, as
``bench`` asks a server: ``describe_behind_gateway``), else the engine its model cards
name (``ServerInfo.gateway``).

A run through the gateway has no engine to rerun in virtual time (``simulated_engine``
is None): its cache, admission and routing over several upstreams are part of what ran,
and a what-if on one bare engine would be another setup.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

VIRTUAL = "virtual time"
EMBEDDED = "embedded"
GATEWAY = "gateway to sim serve"
SIM_SERVE = "sim serve"
SERVER = "server"
#: Where ``sim serve`` says which engine it simulates, and ``inferlab gateway`` that
#: every upstream is such a server (not an OpenAI route).
ENGINE_ROUTE = "/inferlab/engine"
#: Where ``inferlab gateway`` says it is one, and its setup, whatever its upstreams are.
GATEWAY_ROUTE = "/inferlab/gateway"
#: The one key of the gateway's answer at ``ENGINE_ROUTE`` (``gateway_answer``).
GATEWAY_KEY = "inferlab_gateway"
#: The word beside every simulated number.
PREDICTION = "(prediction)"


@dataclass(frozen=True)
class ServerInfo:
    """``summary.json``'s ``server``. ``kind``: ``VIRTUAL``, ``EMBEDDED``, ``GATEWAY``,
    ``SIM_SERVE`` or ``SERVER``; ``url``: the API root it ran against (None in virtual
    time and for the embedded server, whose port was thrown away); ``engine_family``: the
    simulated engine's (behind a gateway: its upstreams', when they all share one; None
    for any other server); ``software``: what a measured server said it is, in words
    ("vLLM 0.11.0": ``client.serverid``; None when it named nothing inferlab knows, and
    for simulated servers); ``gateway``: the setup of ``inferlab gateway`` in front of
    the engine, in words (``describe_gateway``; None where no gateway said it was there)."""

    simulated: bool
    kind: str
    url: str | None
    engine_family: str | None
    software: str | None = None
    gateway: str | None = None

    @property
    def where(self) -> str:
        """The server in words: 'the embedded simulated server', 'inferlab sim serve at URL'."""
        if self.kind == VIRTUAL:
            return "the simulator (virtual time)"
        if self.kind == EMBEDDED:
            return "the embedded simulated server"
        setup = f" ({self.gateway})" if self.gateway else ""
        if self.kind == GATEWAY:
            return "inferlab gateway" + (f" at {self.url}" if self.url else "") + f" in front of inferlab sim serve{setup}"
        if self.kind == SIM_SERVE:
            return "inferlab sim serve" + (f" at {self.url}" if self.url else "")
        if self.gateway:
            return (f"inferlab gateway at {self.url or 'an unknown address'} in front of "
                    f"{self.software or 'a server that did not say what it is'}{setup}")
        where = self.url or "an unknown server"
        return f"{where} ({self.software})" if self.software else where

    @property
    def label(self) -> str:
        """``where``, with "(prediction)" when simulated."""
        return f"{self.where} {PREDICTION}" if self.simulated else self.where

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        for key in ("software", "gateway"):  # (only a measured server that named itself, a gateway that said it is one)
            if d[key] is None:
                del d[key]
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ServerInfo:
        family, software, gateway = d.get("engine_family"), d.get("software"), d.get("gateway")
        return cls(bool(d["simulated"]), str(d["kind"]), d.get("url"), None if family is None else str(family),
                   software if isinstance(software, str) else None, gateway if isinstance(gateway, str) else None)


def describe_software(software: object) -> str | None:
    """``config.json``'s ``resolved.server_software`` (what a measured server said it
    is: ``client.serverid``) in words: "vLLM 0.11.0", "llama.cpp" (release not said);
    None when nothing was recognised."""
    if not isinstance(software, Mapping) or not isinstance(software.get("name"), str):
        return None
    version = software.get("version")
    return f"{software['name']} {version}" if isinstance(version, str) and version else str(software["name"])


def describe_behind_gateway(setup: object) -> str | None:
    """The software behind ``inferlab gateway``, from its setup (``resolved.gateway``:
    each upstream's ``software``, as the gateway identified it): "vLLM 0.11.0" where
    every upstream said the same; where they differ, each by name: "vLLM 0.11.0
    (10.0.0.5:8000), llama.cpp b6000 (10.0.0.6:8000)" (one that answered and named
    nothing inferlab knows: "an unidentified server"; one that did not answer, its
    ``answered`` false: "an upstream that did not answer"); None where none named
    itself, or the gateway said nothing of them (before it did)."""
    ups = setup.get("upstreams") if isinstance(setup, Mapping) else None
    if not isinstance(ups, list) or not ups or not all(isinstance(u, Mapping) and "software" in u for u in ups):
        return None
    said = [describe_software(u["software"]) for u in ups]
    if not any(said):
        return None
    if len(set(said)) == 1:
        return said[0]
    return ", ".join(f"{s or _unnamed(u)} ({u.get('name', '?')})" for s, u in zip(said, ups, strict=True))


def _unnamed(upstream: Mapping[str, Any]) -> str:
    """An upstream of the gateway's setup that named no software, in words."""
    return "an upstream that did not answer" if upstream.get("answered") is False else "an unidentified server"


def _units(n: object, noun: str) -> str:
    """A count of ``noun`` in words: "1 request", "3,500 tokens"."""
    return f"{_num(n)} {noun}{'' if n == 1 else 's'}"


def admission_limit(setup: Mapping[str, Any]) -> str | None:
    """A gateway setup's admission budget in words, an upstream's own cap beside it:
    "65,536 tokens per upstream, 32,768 on 10.0.0.5:8000"; "32,768 tokens on
    10.0.0.5:8000" where every upstream has its own; None in mode "off"."""
    adm = setup.get("admission")
    mode = adm.get("mode") if isinstance(adm, Mapping) else None
    key, noun = {"tokens": ("max_tokens_in_flight", "token"), "requests": ("max_requests_in_flight", "request")}.get(
        str(mode), ("", ""))
    if not key or not isinstance(adm, Mapping):
        return None
    ups = [u for u in setup.get("upstreams") or () if isinstance(u, Mapping)]
    own = [f"{_num(u[key])} on {u.get('name', '?')}" for u in ups if key in u]
    if own and len(own) == len(ups):  # (no upstream takes the default: its number would mislead)
        first = ups[0]
        return ", ".join([f"{_units(first[key], noun)} on {first.get('name', '?')}", *own[1:]])
    return ", ".join([f"{_units(adm.get(key), noun)} per upstream", *own])


def describe_gateway(setup: object) -> str | None:
    """What ``inferlab gateway`` said of its setup at ``GATEWAY_ROUTE`` (``config.json``'s
    ``resolved.gateway``) in words: "1 upstream, least-outstanding routing, admission by
    tokens (3,500 per upstream, prompts counted by upstream), cache on"; None where no
    gateway answered."""
    if not isinstance(setup, Mapping):
        return None
    ups = setup.get("upstreams")
    n = len(ups) if isinstance(ups, list) else 0
    long = setup.get("long_prompt_tokens")
    apart = f" (prompts of {_num(long)}+ tokens apart)" if long else ""
    parts = [f"{n} upstream{'' if n == 1 else 's'}", f"{setup.get('router', '?')} routing{apart}"]
    adm = setup.get("admission")
    if isinstance(adm, Mapping):
        mode = adm.get("mode")
        limit = admission_limit(setup)
        parts.append(f"admission by {mode} ({limit}, prompts counted by {adm.get('tokenizer', '?')})"
                     if limit else f"admission {mode}")
    cache = setup.get("cache")
    if isinstance(cache, Mapping):
        parts.append("cache on" if cache.get("enabled") else "cache off")
    if setup.get("redis"):
        parts.append("state shared through Redis")
    return ", ".join(parts)


def _num(v: object) -> str:
    return f"{v:,}" if isinstance(v, int) else str(v)


def gateway_answer(engines: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """What ``inferlab gateway`` answers at ``ENGINE_ROUTE`` when every upstream answered
    it: ``{"inferlab_gateway": {"upstreams": N, "engines": [each upstream's answer, in
    the configured order]}}``. Not an engine's flags: nothing reruns it."""
    return {GATEWAY_KEY: {"upstreams": len(engines), "engines": [dict(e) for e in engines]}}


def http_server_info(url: str | None, engine: Mapping[str, Any] | None, software: str | None = None,
                     gateway: str | None = None) -> ServerInfo:
    """A server reached over HTTP: ``url`` None for the embedded simulated server;
    ``engine`` what it answered at ``/inferlab/engine`` (None: it did not, so it is not
    inferlab's simulator); ``software`` what it said it is, in words; ``gateway`` the
    setup of inferlab gateway in front, in words (``describe_gateway``)."""
    if url is None:
        return ServerInfo(True, EMBEDDED, None, _family(engine))
    return _served(url, engine, software, gateway)


def server_info(config: Mapping[str, Any]) -> ServerInfo:
    """The rule above, for a run's ``config.json`` (as a dict). A config with no ``url``
    key at all (a folder of records alone) is taken for a measured run."""
    if config.get("command") == "sim run":
        return ServerInfo(True, VIRTUAL, None, _family(config.get("engine")))
    resolved = config.get("resolved")
    resolved = resolved if isinstance(resolved, Mapping) else {}
    engine = resolved.get("engine")
    engine = engine if isinstance(engine, Mapping) else None
    if "url" in config and config["url"] is None:
        return http_server_info(None, engine)
    url = resolved.get("url") or config.get("url")
    # (behind the gateway, what it said of its upstreams: its own URL names only their cards)
    software = describe_behind_gateway(resolved.get("gateway")) or describe_software(resolved.get("server_software"))
    return _served(None if url is None else str(url), engine, software, describe_gateway(resolved.get("gateway")))


def simulated_engine(config: Mapping[str, Any]) -> dict[str, Any] | None:
    """The simulated engine a run ran on (its resolved flags): ``sim run``'s ``engine``,
    or what the simulated server reported (``resolved.engine``); None for any other
    server, and through the gateway (its setup is not one engine's)."""
    engine = config.get("engine") if config.get("command") == "sim run" else (config.get("resolved") or {}).get("engine")
    return dict(engine) if isinstance(engine, Mapping) and _behind_gateway(engine) is None else None


def _served(url: str | None, engine: Mapping[str, Any] | None, software: str | None = None,
            gateway: str | None = None) -> ServerInfo:
    """A server at ``url`` that answered ``engine`` at ``ENGINE_ROUTE`` (None: it did
    not), said it is ``software``, and is inferlab gateway of setup ``gateway``."""
    if engine is None:
        return ServerInfo(False, SERVER, url, None, software, gateway)
    behind = _behind_gateway(engine) is not None
    return ServerInfo(True, GATEWAY if behind else SIM_SERVE, url, _family(engine), None, gateway if behind else None)


def _behind_gateway(engine: Mapping[str, Any]) -> list[Any] | None:
    """The upstreams' answers if ``engine`` is the gateway's answer, else None."""
    if GATEWAY_KEY not in engine:
        return None
    gateway = engine[GATEWAY_KEY]
    engines = gateway.get("engines") if isinstance(gateway, Mapping) else None
    return list(engines) if isinstance(engines, list) else []


def engine_family_of(engine: Any) -> str | None:
    """The family of a run's engine (``simulated_engine``'s, or a profile's), behind the
    gateway its upstreams' where they all share one; None where not known."""
    return _family(engine)


def _family(engine: Any) -> str | None:
    """The engine's family; behind a gateway, its upstreams' when they all share one."""
    if not isinstance(engine, Mapping):
        return None
    upstreams = _behind_gateway(engine)
    if upstreams is not None:
        families = {_family(e) for e in upstreams}
        return families.pop() if len(families) == 1 else None
    family = engine.get("engine_family")
    return None if family is None else str(family)
