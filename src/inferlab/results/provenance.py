"""Where a run's numbers come from: measured on a server, or predicted by inferlab's
simulator. One rule, read from what every reader has (a run's ``config.json``):

- ``sim run`` (and every run in virtual time: a simulated sweep point, a what-if):
  the simulator in virtual time;
- a run over HTTP whose ``url`` is null: the embedded simulated server that ``bench``
  or ``profile`` started without ``--url``;
- a run over HTTP whose server answered ``/inferlab/engine`` (recorded as
  ``resolved.engine``): ``inferlab sim serve`` at that URL (also an engine config of
  kind ``sim``);
- any other run: a server, measured.

The first three are *simulated*: every number they hold is a prediction of the
simulator, and whatever shows one says "(prediction)" beside it. Only virtual-time runs
carry error bands (``summary.json``'s ``prediction``); over HTTP the real-time server
adds its own lateness, and nothing validated measures that.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

VIRTUAL = "virtual time"
EMBEDDED = "embedded"
SIM_SERVE = "sim serve"
SERVER = "server"
#: The word beside every simulated number.
PREDICTION = "(prediction)"


@dataclass(frozen=True)
class ServerInfo:
    """``summary.json``'s ``server``. ``kind``: ``VIRTUAL``, ``EMBEDDED``, ``SIM_SERVE``
    or ``SERVER``; ``url``: the API root it ran against (None in virtual time and for
    the embedded server, whose port was thrown away); ``engine_family``: the simulated
    engine's (None for any other server)."""

    simulated: bool
    kind: str
    url: str | None
    engine_family: str | None

    @property
    def where(self) -> str:
        """The server in words: 'the embedded simulated server', 'inferlab sim serve at URL'."""
        if self.kind == VIRTUAL:
            return "the simulator (virtual time)"
        if self.kind == EMBEDDED:
            return "the embedded simulated server"
        if self.kind == SIM_SERVE:
            return "inferlab sim serve" + (f" at {self.url}" if self.url else "")
        return self.url or "an unknown server"

    @property
    def label(self) -> str:
        """``where``, with "(prediction)" when simulated."""
        return f"{self.where} {PREDICTION}" if self.simulated else self.where

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ServerInfo:
        family = d.get("engine_family")
        return cls(bool(d["simulated"]), str(d["kind"]), d.get("url"), None if family is None else str(family))


def http_server_info(url: str | None, engine: Mapping[str, Any] | None) -> ServerInfo:
    """A server reached over HTTP: ``url`` None for the embedded simulated server;
    ``engine`` what it answered at ``/inferlab/engine`` (None: it did not, so it is not
    inferlab's simulator)."""
    family = _family(engine)
    if url is None:
        return ServerInfo(True, EMBEDDED, None, family)
    if engine is not None:
        return ServerInfo(True, SIM_SERVE, url, family)
    return ServerInfo(False, SERVER, url, None)


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
    url = None if url is None else str(url)
    if engine is not None:
        return ServerInfo(True, SIM_SERVE, url, _family(engine))
    return ServerInfo(False, SERVER, url, None)


def simulated_engine(config: Mapping[str, Any]) -> dict[str, Any] | None:
    """The simulated engine a run ran on (its resolved flags): ``sim run``'s ``engine``,
    or what the simulated server reported (``resolved.engine``); None for any other
    server."""
    engine = config.get("engine") if config.get("command") == "sim run" else (config.get("resolved") or {}).get("engine")
    return dict(engine) if isinstance(engine, Mapping) else None


def _family(engine: Any) -> str | None:
    family = engine.get("engine_family") if isinstance(engine, Mapping) else None
    return None if family is None else str(family)
