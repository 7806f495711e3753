"""The gateway's configuration: frozen dataclasses, read once from flags and a TOML file
(or a YAML one with the same tables: ``gateway.yaml``, ``gateway.yml``).

The file (``inferlab gateway --config gateway.toml``) holds what flags do not: client
keys and their limits, admission, the cache. Every table and key is checked: an unknown
one is a ``UsageError``, never silently ignored. Client keys are kept as their SHA-256
digest only (the file may give the key itself, or its digest); upstream keys come from
the file or from an environment variable it names, and never leave the gateway.

```toml
[gateway]                      # all optional
max_body_bytes = 4194304
upstream_timeout_s = 600
access_log = "gateway-log"     # a run directory: config.json + requests.jsonl
router = "least-outstanding"   # or "prefix-affinity", "round-robin", "split-by-length" (inferlab.gateway.routing)
# long_prompt_tokens = 8192    # router "split-by-length" only (and then needed): a prompt this long is long,
# long_upstreams = ["http://10.0.0.6:8000"]   # and goes to these upstreams (some, not all), the others elsewhere
metrics_refresh_s = 2          # read each engine's /metrics this often, for routing; 0: never
http_client = "auto"           # to the upstreams: "httptools" (http:// only), "aiohttp"; auto: httptools where installed

[admission]
mode = "tokens"                # or "requests" (a request count per upstream), or "off"
max_tokens_in_flight = 65536   # per upstream (mode tokens)
max_requests_in_flight = 64    # per upstream (mode requests)
queue_max = 256
queue_timeout_s = 30
starvation_s = 5               # a waiter older than this goes first (size-aware queue)
default_max_tokens = 256       # reserved for a request that gives no max_tokens
tokenizer = "estimate"         # 4 characters a token; "builtin" (the simulator's); "upstream" (its /tokenize); or a tokenizer.json

[cache]
enabled = true
ttl_s = 300
max_entries = 1024
max_bytes = 67108864
shared_across_keys = false

[redis]                        # optional: limits, cache and admission shared by several instances
url = "redis://127.0.0.1:6379/0"
limits = true
cache = true
admission = true               # the upstreams' budgets counted across instances
lease_s = 10                   # a dead instance's share of them lapses after this

[[upstreams]]                  # added to --upstream
url = "http://10.0.0.5:8000"
api_key_env = "ENGINE_KEY"     # or api_key = "..."
max_tokens_in_flight = 32768   # overrides [admission]

[[keys]]
name = "team-a"                # what metrics and logs show; never the key
sha256 = "9f86d0…"             # or key = "sk-…" (hashed when read)
rpm = 600
tpm = 200000
tpm_counts = "total"           # or "input", "output"
```
"""

from __future__ import annotations

import hashlib
import importlib
import math
import os
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

from inferlab._clock import LONGEST_S
from inferlab._errors import UsageError
from inferlab.client.exchange import HTTP_CLIENTS, resolve_http_client
from inferlab.gateway.routing import ROUTERS, SPLIT, LongPool

AdmissionMode = Literal["tokens", "requests", "off"]

#: Seconds between two reads of each engine's ``/metrics`` (0: none), and the shortest
#: interval allowed (more often would load the engines for nothing).
METRICS_REFRESH_S = 2.0
METRICS_REFRESH_MIN_S = 0.1
#: The shortest lease of an instance's share of the shared admission budgets ([redis] lease_s).
LEASE_MIN_S = 0.5
TokenCount = Literal["total", "input", "output"]


def hash_key(key: str) -> str:
    """The hex SHA-256 digest a client key is stored and looked up as."""
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True)
class UpstreamConfig:
    """One engine behind the gateway. ``url`` is its root (``http://host:port``): the API
    is under ``/v1``, its health check at ``/health``. Limits of None take
    ``AdmissionConfig``'s."""

    url: str
    api_key: str | None = field(default=None, repr=False)
    max_tokens_in_flight: int | None = None
    max_requests_in_flight: int | None = None

    @property
    def name(self) -> str:
        """The label metrics and logs use: ``host:port``."""
        return urlsplit(self.url).netloc


@dataclass(frozen=True)
class KeyConfig:
    """A client key: its ``name`` (the label metrics and logs show), its SHA-256 digest,
    and its limits per sliding minute (None: none). ``tpm_counts`` says which tokens
    the TPM limit counts."""

    name: str
    sha256: str = field(repr=False)
    rpm: int | None = None
    tpm: int | None = None
    tpm_counts: TokenCount = "total"


#: The ``[admission]`` keys each mode acts on, beside ``mode`` and the gateway's
#: ``tokenizer`` (``sim run --admission`` takes these as flags, and refuses the others).
ADMISSION_KEYS: dict[str, tuple[str, ...]] = {
    "tokens": ("max_tokens_in_flight", "queue_max", "queue_timeout_s", "starvation_s", "default_max_tokens"),
    "requests": ("max_requests_in_flight", "queue_max", "queue_timeout_s"),
    "off": (),
}


@dataclass(frozen=True)
class AdmissionConfig:
    """How requests are let through to an upstream: by tokens in flight (estimated prompt
    plus ``max_tokens``, or ``default_max_tokens``), by a request count, or not at all;
    how many may wait, for how long, and after how long a waiter is served before
    smaller ones (``starvation_s``)."""

    mode: AdmissionMode = "tokens"
    max_tokens_in_flight: int = 65536
    max_requests_in_flight: int = 64
    queue_max: int = 256
    queue_timeout_s: float = 30.0
    starvation_s: float = 5.0
    default_max_tokens: int = 256
    tokenizer: str = "estimate"

    def acting(self) -> dict[str, Any]:
        """Its mode and the settings that act in it (``ADMISSION_KEYS``): what a run
        records, so no budget the mode ignores is recorded as if it held."""
        return {"mode": self.mode, **{k: getattr(self, k) for k in ADMISSION_KEYS[self.mode]}}


@dataclass(frozen=True)
class CacheConfig:
    """The response cache for deterministic requests (temperature 0 or a fixed seed)."""

    enabled: bool = True
    ttl_s: float = 300.0
    max_entries: int = 1024
    max_bytes: int = 64 * 1024 * 1024
    shared_across_keys: bool = False


@dataclass(frozen=True)
class RedisConfig:
    """State shared by several gateway instances (``inferlab.gateway.shared``): the
    per-key limits, the response cache and/or admission's budgets (each upstream's
    tokens or requests in flight, counted across instances; an instance's share lapses
    ``lease_s`` after it stops renewing it), in the Redis at ``url``."""

    url: str
    prefix: str = "inferlab:"
    limits: bool = True
    cache: bool = True
    admission: bool = True
    lease_s: float = 10.0

    @property
    def shown(self) -> str:
        """``url`` as messages show it: a password in it replaced by ``***``."""
        parts = urlsplit(self.url)
        if parts.password is None:
            return self.url
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
        return parts._replace(netloc=netloc).geturl()


@dataclass(frozen=True)
class GatewayConfig:
    """The whole gateway. No ``keys``: every request is let in (the CLI says so)."""

    upstreams: tuple[UpstreamConfig, ...]
    host: str = "127.0.0.1"
    port: int = 8080
    keys: tuple[KeyConfig, ...] = ()
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    max_body_bytes: int = 4 * 1024 * 1024
    upstream_timeout_s: float = 600.0
    access_log: str | None = None
    router: str = "least-outstanding"
    metrics_refresh_s: float = METRICS_REFRESH_S
    redis: RedisConfig | None = None
    # the HTTP stack to the upstreams: ``client.exchange.HTTP_CLIENTS``, resolved per
    # upstream (``auto``: httptools for http:// where it is installed, else aiohttp)
    http_client: str = "auto"
    # router "split-by-length" (and only it): a prompt of this many tokens or more is
    # long, and goes to the upstreams of these URLs (some of ``upstreams``, not all)
    long_prompt_tokens: int | None = None
    long_upstreams: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.upstreams:
            raise UsageError("the gateway needs at least one upstream (--upstream URL)")
        for u in self.upstreams:
            try:
                resolve_http_client(self.http_client, u.url)
            except ValueError as e:
                raise UsageError(f"http_client: {e}") from None
        names = [u.name for u in self.upstreams]
        if len(set(names)) != len(names):
            raise UsageError(f"an upstream is given twice: {', '.join(names)}")
        self.long_pool()  # (refuses a contradictory split)

    def setup(self) -> dict[str, Any]:
        """What the gateway answers at ``results.provenance.GATEWAY_ROUTE``, and a run
        through it records (``resolved.gateway``): its upstreams by name (``host:port``,
        as its metrics label them; with their own caps where set, and ``long_prompts`` for
        those ``split-by-length`` sends the long prompts to), its router, admission, cache,
        and whether state is shared through Redis. No URL, key or tokenizer path."""
        adm = self.admission
        return {
            "upstreams": [{"name": u.name, **({"max_tokens_in_flight": u.max_tokens_in_flight} if u.max_tokens_in_flight else {}),
                           **({"max_requests_in_flight": u.max_requests_in_flight} if u.max_requests_in_flight else {}),
                           **({"long_prompts": True} if u.url in self.long_upstreams else {})}
                          for u in self.upstreams],
            "router": self.router,
            **({"long_prompt_tokens": self.long_prompt_tokens} if self.long_prompt_tokens is not None else {}),
            "admission": {**adm.acting(),
                          "tokenizer": adm.tokenizer if adm.tokenizer in ("estimate", "builtin", "upstream") else "tokenizer.json"},
            "cache": {"enabled": self.cache.enabled, "ttl_s": self.cache.ttl_s},
            "keys": len(self.keys),
            "redis": self.redis is not None,
        }

    def long_pool(self) -> LongPool | None:
        """``split-by-length``'s pool (indices into ``upstreams``); None for another
        router. ``UsageError`` where the split settings and the router disagree: a
        setting of it with another router, it without both, a long upstream that is
        not one of ``upstreams`` or named twice, or every upstream long."""
        given = [k for k, v in (("long_prompt_tokens", self.long_prompt_tokens), ("long_upstreams", self.long_upstreams)) if v]
        if self.router != SPLIT:
            if given:
                raise UsageError(f"[gateway] {', '.join(given)}: only router = \"{SPLIT}\" acts on "
                                 f"{'it' if len(given) == 1 else 'them'} (router = \"{self.router}\"); drop it or set that router")
            return None
        if len(given) < 2:
            raise UsageError(f"[gateway] router = \"{SPLIT}\" needs long_prompt_tokens (a prompt this long is long) and "
                             "long_upstreams (the URLs of the upstreams that take long prompts)")
        urls = [u.url for u in self.upstreams]
        unknown = [u for u in self.long_upstreams if u not in urls]
        if unknown:
            raise UsageError(f"[gateway] long_upstreams: {unknown[0]} is not an upstream (upstreams: {', '.join(urls)})")
        if len(set(self.long_upstreams)) != len(self.long_upstreams):
            raise UsageError("[gateway] long_upstreams: an upstream is named twice")
        if len(self.long_upstreams) == len(urls):
            raise UsageError("[gateway] long_upstreams names every upstream: leave at least one for the short prompts")
        assert self.long_prompt_tokens is not None
        return LongPool(self.long_prompt_tokens, frozenset(urls.index(u) for u in self.long_upstreams))


def upstream_url(url: str) -> str:
    """An upstream's root URL from what a user gives (``http://h:p`` or ``http://h:p/v1``).
    ``UsageError`` for anything but an http(s) URL with a host."""
    try:
        parts = urlsplit(url.strip().rstrip("/"))
        port = parts.port  # (ValueError: out of range, or not a number)
        host = parts.hostname
    except ValueError as e:
        raise UsageError(f"upstream {url!r} is not an http(s) URL ({e})") from None
    if parts.scheme not in ("http", "https") or not host:
        raise UsageError(f"upstream {url!r} is not an http(s) URL")
    if port == 0:
        raise UsageError(f"upstream {url!r}: port 0 is no server's")
    if parts.username is not None or parts.password is not None:
        # (a URL's credentials would show in /health, /metrics and the logs, to anyone)
        raise UsageError(f"upstream {parts.scheme}://...@{host}: a user or password in the URL is not taken; "
                         "give the upstream's key as [[upstreams]] api_key_env (or api_key) in the config file")
    path = parts.path.removesuffix("/v1")
    if path or parts.query or parts.fragment:
        raise UsageError(f"upstream {url!r}: give the server's root (http://host:port), without a path")
    return f"{parts.scheme}://{parts.netloc}"


def load_config(
    upstreams: Sequence[str], *, host: str, port: int, path: str | None = None,
    environ: Mapping[str, str] = os.environ, http_client: str | None = None,
) -> GatewayConfig:
    """The configuration from ``--upstream`` URLs and the file at ``path`` (TOML, or
    YAML with the same tables: ``read_document``); ``http_client`` (a flag) goes over
    the file's.
    ``UsageError`` for an unreadable file, an unknown table or key, a value of the wrong
    type or range."""
    doc = read_document(path) if path is not None else {}
    _known(doc, {"gateway", "admission", "cache", "upstreams", "keys", "redis"}, "the config file")
    red = _table(doc, "redis")
    _known(red, set(RedisConfig.__dataclass_fields__), "[redis]")
    if "redis" in doc and "url" not in red:  # (an empty [redis] shared nothing, and said nothing)
        raise UsageError("[redis] has no url")
    gw = _table(doc, "gateway")
    _known(gw, {"max_body_bytes", "upstream_timeout_s", "access_log", "router", "metrics_refresh_s", "http_client",
                "long_prompt_tokens", "long_upstreams"}, "[gateway]")
    adm = _table(doc, "admission")
    _known(adm, set(AdmissionConfig.__dataclass_fields__), "[admission]")
    cache = _table(doc, "cache")
    _known(cache, set(CacheConfig.__dataclass_fields__), "[cache]")

    admission = AdmissionConfig(
        mode=_choice(adm, "mode", ("tokens", "requests", "off"), "tokens", "[admission]"),  # type: ignore[arg-type]
        max_tokens_in_flight=_int(adm, "max_tokens_in_flight", 65536, "[admission]"),
        max_requests_in_flight=_int(adm, "max_requests_in_flight", 64, "[admission]"),
        queue_max=_int(adm, "queue_max", 256, "[admission]", minimum=0),
        queue_timeout_s=_float(adm, "queue_timeout_s", 30.0, "[admission]"),
        starvation_s=_float(adm, "starvation_s", 5.0, "[admission]"),
        default_max_tokens=_int(adm, "default_max_tokens", 256, "[admission]"),
        tokenizer=_str(adm, "tokenizer", "estimate", "[admission]"),
    )
    acts = ADMISSION_KEYS[admission.mode]
    unused = sorted(k for k in adm if k not in ("mode", "tokenizer") and k not in acts)
    if unused:  # (a limit the mode does not act on would be accepted and ignored)
        raise UsageError(f"[admission] {', '.join(unused)}: mode = \"{admission.mode}\" does not act on "
                         f"{'it' if len(unused) == 1 else 'them'}" + (f" (it acts on {', '.join(acts)})" if acts else "")
                         + "; drop it or set another mode")
    ups = [UpstreamConfig(upstream_url(u)) for u in upstreams]
    for i, u in enumerate(_array(doc, "upstreams")):
        where = f"[[upstreams]] #{i + 1}"
        _known(u, {"url", "api_key", "api_key_env", "max_tokens_in_flight", "max_requests_in_flight"}, where)
        if odd := sorted(k for k in ("max_tokens_in_flight", "max_requests_in_flight") if k in u and k not in acts):
            raise UsageError(f"{where} {', '.join(odd)}: [admission] mode = \"{admission.mode}\" does not act on it; "
                             "drop it or set another mode")
        if "url" not in u:
            raise UsageError(f"{where} has no url")
        ups.append(UpstreamConfig(
            upstream_url(_str(u, "url", "", where)),
            api_key=_secret(u, where, "api_key", environ),
            max_tokens_in_flight=_int(u, "max_tokens_in_flight", None, where),
            max_requests_in_flight=_int(u, "max_requests_in_flight", None, where),
        ))
    keys = []
    for i, k in enumerate(_array(doc, "keys")):
        where = f"[[keys]] #{i + 1}"
        _known(k, {"name", "key", "sha256", "rpm", "tpm", "tpm_counts"}, where)
        if ("key" in k) == ("sha256" in k):
            raise UsageError(f"{where}: give either key or sha256")
        digest = hash_key(_str(k, "key", "", where)) if "key" in k else _str(k, "sha256", "", where).lower()
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise UsageError(f"{where}: sha256 must be 64 hex digits")
        keys.append(KeyConfig(
            name=_str(k, "name", f"key{i + 1}", where),
            sha256=digest,
            rpm=_int(k, "rpm", None, where),
            tpm=_int(k, "tpm", None, where),
            tpm_counts=_choice(k, "tpm_counts", ("total", "input", "output"), "total", where),  # type: ignore[arg-type]
        ))
    if len({k.name for k in keys}) != len(keys) or len({k.sha256 for k in keys}) != len(keys):
        raise UsageError("[[keys]]: every key needs a name and a key of its own")
    config = GatewayConfig(
        upstreams=tuple(ups),
        host=host,
        port=port,
        keys=tuple(keys),
        admission=admission,
        cache=CacheConfig(
            enabled=_bool(cache, "enabled", True, "[cache]"),
            ttl_s=_float(cache, "ttl_s", 300.0, "[cache]"),
            max_entries=_int(cache, "max_entries", 1024, "[cache]"),
            max_bytes=_int(cache, "max_bytes", 64 * 1024 * 1024, "[cache]"),
            shared_across_keys=_bool(cache, "shared_across_keys", False, "[cache]"),
        ),
        max_body_bytes=_int(gw, "max_body_bytes", 4 * 1024 * 1024, "[gateway]"),
        upstream_timeout_s=_float(gw, "upstream_timeout_s", 600.0, "[gateway]"),
        access_log=_str(gw, "access_log", None, "[gateway]"),
        router=_choice(gw, "router", ROUTERS, "least-outstanding", "[gateway]"),
        metrics_refresh_s=_interval(gw, "metrics_refresh_s", METRICS_REFRESH_S, METRICS_REFRESH_MIN_S, "[gateway]"),
        http_client=http_client or _choice(gw, "http_client", HTTP_CLIENTS, "auto", "[gateway]"),
        long_prompt_tokens=_int(gw, "long_prompt_tokens", None, "[gateway]"),
        long_upstreams=tuple(upstream_url(u) for u in _strings(gw, "long_upstreams", "[gateway]")),
        redis=RedisConfig(
            url=redis_url(_str(red, "url", None, "[redis]")),
            prefix=_str(red, "prefix", "inferlab:", "[redis]"),
            limits=_bool(red, "limits", True, "[redis]"),
            cache=_bool(red, "cache", True, "[redis]"),
            admission=_bool(red, "admission", True, "[redis]"),
            lease_s=_seconds(red, "lease_s", 10.0, LEASE_MIN_S, "[redis]"),
        ) if "redis" in doc else None,
    )
    if config.redis is not None and config.redis.cache and config.cache.enabled and "max_entries" in cache:
        # (entries then live in Redis alone, bounded by its maxmemory: a count here would be ignored)
        raise UsageError("[cache] max_entries: with [redis] cache = true the entries are kept in Redis, whose "
                         "maxmemory bounds them, not a count; leave it out, or set [redis] cache = false")
    if config.redis is not None and "lease_s" in red and (not config.redis.admission or config.admission.mode == "off"):
        why = "[redis] admission = false" if not config.redis.admission else '[admission] mode = "off"'
        raise UsageError(f"[redis] lease_s is the lease of an instance's share of the admission budgets, "
                         f"and nothing shares them ({why}): leave it out")
    return config


def redis_url(url: str) -> str:
    """``[redis] url`` as redis-py reads it: ``redis://`` or ``rediss://`` (a host, a
    port, a database number as the path), or ``unix://`` with a socket's path.
    ``UsageError`` for anything else: redis-py's own parser fails on a scheme or port
    only at start (an internal error), and takes a database path it cannot read as
    database 0."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (ValueError: out of range, or not a number)
    except ValueError as e:
        raise UsageError(f"[redis] url: not a Redis URL ({e})") from None
    if parts.scheme not in ("redis", "rediss", "unix") or not url.lower().startswith(f"{parts.scheme}://"):
        raise UsageError("[redis] url must begin redis://, rediss:// (TLS) or unix:// (redis://host:port/db)")
    if parts.scheme == "unix" and not parts.path:
        raise UsageError("[redis] url: unix:// needs the socket's path (unix:///run/redis.sock)")
    db = parts.path.strip("/") if parts.scheme != "unix" else ""
    if db and not db.isdigit():
        raise UsageError(f"[redis] url: the path is the database number (redis://host:port/0), got {parts.path!r}")
    return url


def read_document(path: str) -> dict[str, Any]:
    """The config file at ``path`` as tables: YAML for a name ending ``.yaml`` or
    ``.yml`` (``yaml.safe_load``; PyYAML is the ``yaml`` extra), else TOML. One checker
    reads both, so both refuse the same unknown keys and wrong values. ``UsageError``
    for a file that cannot be read or parsed."""
    if not path.lower().endswith((".yaml", ".yml")):
        try:
            with open(path, "rb") as f:
                return tomllib.load(f)
        except OSError as e:
            raise UsageError(f"--config {path}: {e.strerror or e}") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise UsageError(f"--config {path}: not valid TOML: {e}") from None
    try:
        yaml: Any = importlib.import_module("yaml")
    except ImportError:
        raise UsageError(f"--config {path}: a YAML config needs PyYAML: pip install 'inferlab[yaml]' (or write it as TOML)") from None
    try:
        with open(path, "rb") as f:
            doc = yaml.safe_load(f)
    except OSError as e:
        raise UsageError(f"--config {path}: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        raise UsageError(f"--config {path}: not valid YAML: {' '.join(str(e).split())}") from None
    if doc is None:  # (an empty file)
        return {}
    if not isinstance(doc, dict) or not all(isinstance(k, str) for k in doc):
        raise UsageError(f"--config {path}: the YAML document must be a mapping of tables (gateway:, admission:, ...)")
    return doc


# --- checked reads -----------------------------------------------------------------------


def _known(table: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise UsageError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(allowed))})")


def _table(doc: Mapping[str, Any], name: str) -> dict[str, Any]:
    value = doc.get(name, {})
    if not isinstance(value, dict):
        raise UsageError(f"[{name}] must be a table")
    return value


def _array(doc: Mapping[str, Any], name: str) -> list[dict[str, Any]]:
    value = doc.get(name, [])
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise UsageError(f"[[{name}]] must be an array of tables")
    return value


def _int(t: Mapping[str, Any], name: str, default: Any, where: str, minimum: int = 1) -> Any:
    v = t.get(name, default)
    if v is default:
        return v
    if type(v) is not int or v < minimum:
        raise UsageError(f"{where} {name} must be an integer of at least {minimum}, got {v!r}")
    return v


def _float(t: Mapping[str, Any], name: str, default: float, where: str) -> float:
    """A number of seconds, above 0 and at most ``LONGEST_S``."""
    v = t.get(name, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= LONGEST_S:
        raise UsageError(f"{where} {name} must be a positive number of seconds, at most {LONGEST_S:g}, got {v!r}")
    return float(v)


def _interval(t: Mapping[str, Any], name: str, default: float, minimum: float, where: str) -> float:
    """Seconds between two runs of something: 0 (never), or a finite number of at least ``minimum``."""
    v = t.get(name, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not (v == 0 or minimum <= v < math.inf):
        raise UsageError(f"{where} {name} must be 0 (off) or a number of seconds of at least {minimum:g}, got {v!r}")
    return float(v)


def _seconds(t: Mapping[str, Any], name: str, default: float, minimum: float, where: str) -> float:
    v = t.get(name, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not minimum <= v < math.inf:
        raise UsageError(f"{where} {name} must be a number of seconds of at least {minimum:g}, got {v!r}")
    return float(v)


def _bool(t: Mapping[str, Any], name: str, default: bool, where: str) -> bool:
    v = t.get(name, default)
    if not isinstance(v, bool):
        raise UsageError(f"{where} {name} must be true or false, got {v!r}")
    return v


def _str(t: Mapping[str, Any], name: str, default: Any, where: str) -> Any:
    v = t.get(name, default)
    if v is not default and (not isinstance(v, str) or not v):
        raise UsageError(f"{where} {name} must be a non-empty string")
    return v


def _strings(t: Mapping[str, Any], name: str, where: str) -> list[str]:
    v = t.get(name, [])
    if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
        raise UsageError(f"{where} {name} must be a list of non-empty strings, got {v!r}")
    return v


def _choice(t: Mapping[str, Any], name: str, options: tuple[str, ...], default: str, where: str) -> str:
    v = t.get(name, default)
    if v not in options:
        raise UsageError(f"{where} {name} must be one of {', '.join(options)}, got {v!r}")
    return str(v)


def _secret(t: Mapping[str, Any], where: str, name: str, environ: Mapping[str, str]) -> str | None:
    if name in t and f"{name}_env" in t:
        raise UsageError(f"{where}: give either {name} or {name}_env")
    if f"{name}_env" in t:
        var = _str(t, f"{name}_env", "", where)
        if var not in environ:
            raise UsageError(f"{where}: environment variable {var} is not set")
        return environ[var]
    value: str | None = _str(t, name, None, where)
    return value
