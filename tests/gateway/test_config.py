"""The gateway's config file, as TOML or YAML: one checker reads both."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from inferlab._errors import UsageError
from inferlab.cli.main import main
from inferlab.gateway.config import METRICS_REFRESH_S, GatewayConfig, hash_key, load_config

TOML = """
[gateway]
router = "prefix-affinity"
access_log = "gw-log"

[admission]
mode = "requests"
max_requests_in_flight = 8
queue_timeout_s = 2.5

[cache]
enabled = false

[[upstreams]]
url = "http://10.0.0.5:8000/v1"
api_key_env = "ENGINE_KEY"
max_requests_in_flight = 2

[[keys]]
name = "team-a"
key = "sk-a"
rpm = 600
tpm_counts = "output"
"""

YAML = """
gateway:
  router: prefix-affinity
  access_log: gw-log
admission:
  mode: requests
  max_requests_in_flight: 8
  queue_timeout_s: 2.5
cache:
  enabled: false
upstreams:
  - url: http://10.0.0.5:8000/v1
    api_key_env: ENGINE_KEY
    max_requests_in_flight: 2
keys:
  - name: team-a
    key: sk-a
    rpm: 600
    tpm_counts: output
"""


def read(tmp_path: Path, name: str, text: str) -> GatewayConfig:
    path = tmp_path / name
    path.write_text(text)
    return load_config(["http://127.0.0.1:8001"], host="127.0.0.1", port=8080, path=str(path),
                       environ={"ENGINE_KEY": "secret"})


def test_a_yaml_config_reads_as_the_same_toml_does(tmp_path: Path) -> None:
    from_toml = read(tmp_path, "gw.toml", TOML)
    for name in ("gw.yaml", "gw.YML"):
        assert read(tmp_path, name, YAML) == from_toml
    cfg = read(tmp_path, "gw.yaml", YAML)
    assert cfg.router == "prefix-affinity" and cfg.admission.mode == "requests"
    assert cfg.admission.max_requests_in_flight == 8 and not cfg.cache.enabled
    up = cfg.upstreams[1]
    assert up.url == "http://10.0.0.5:8000" and up.api_key == "secret" and up.max_requests_in_flight == 2
    assert cfg.keys[0].sha256 == hash_key("sk-a") and cfg.keys[0].tpm_counts == "output"


@pytest.mark.parametrize(("text", "words"), [
    ("admission:\n  mode: tokens\n  max_token_in_flight: 5\n", "[admission]: unknown key 'max_token_in_flight'"),
    ("gatway:\n  router: round-robin\n", "the config file: unknown key 'gatway'"),
    ("admission:\n  max_tokens_in_flight: lots\n", "max_tokens_in_flight must be an integer"),
    ("admission:\n  mode: tokenz\n", "mode must be one of tokens, requests, off"),
    ("keys:\n  - name: a\n    sha256: 1234\n", "sha256 must be a non-empty string"),
    ("admission: [1, 2]\n", "[admission] must be a table"),
    # a limit the mode does not act on would be ignored: refused
    ("admission:\n  mode: tokens\n  max_requests_in_flight: 4\n", 'max_requests_in_flight: mode = "tokens" does not act on it'),
    ("admission:\n  mode: \"off\"\n  queue_max: 4\n", 'queue_max: mode = "off" does not act on it'),
    ("admission:\n  mode: requests\nupstreams:\n  - url: http://127.0.0.1:1\n    max_tokens_in_flight: 9\n",
     'max_tokens_in_flight: [admission] mode = "requests" does not act on it'),
    ("- gateway\n- admission\n", "must be a mapping of tables"),
    ("admission:\n  mode: [tokens\n", "not valid YAML"),
])
def test_a_yaml_config_is_checked_as_strictly_as_toml(tmp_path: Path, text: str, words: str) -> None:
    with pytest.raises(UsageError) as e:
        read(tmp_path, "gw.yaml", text)
    assert words in str(e.value)


def test_an_empty_yaml_file_is_no_settings_and_the_same_unknown_key_in_toml_is_refused_alike(tmp_path: Path) -> None:
    assert read(tmp_path, "empty.yml", "") == read(tmp_path, "empty.toml", "")
    with pytest.raises(UsageError) as e:
        read(tmp_path, "gw.toml", "[admission]\nmax_token_in_flight = 5\n")
    assert "[admission]: unknown key 'max_token_in_flight'" in str(e.value)


def test_without_pyyaml_a_yaml_config_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "yaml", None)  # (import yaml now raises ImportError)
    with pytest.raises(UsageError) as e:
        read(tmp_path, "gw.yaml", YAML)
    assert "pip install 'inferlab[yaml]'" in str(e.value)
    assert read(tmp_path, "gw.toml", TOML) is not None  # TOML needs nothing more


def test_the_cli_refuses_a_bad_yaml_config_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "gw.yaml"
    path.write_text("cache:\n  ttl: 5\n")
    r = CliRunner().invoke(main, ["gateway", "--upstream", "http://127.0.0.1:8001", "--config", str(path)])
    assert r.exit_code == 2 and "[cache]: unknown key 'ttl'" in r.output and "Traceback" not in r.output


@pytest.mark.parametrize(("toml", "yaml", "seconds"), [
    ("", "", METRICS_REFRESH_S),
    ("metrics_refresh_s = 0", "metrics_refresh_s: 0", 0.0),
    ("metrics_refresh_s = 0.5", "metrics_refresh_s: 0.5", 0.5),
    ("metrics_refresh_s = 5", "metrics_refresh_s: 5", 5.0),
])
def test_the_engines_metrics_refresh_reads_alike_from_toml_and_yaml(
    tmp_path: Path, toml: str, yaml: str, seconds: float,
) -> None:
    from_toml = read(tmp_path, "gw.toml", f"[gateway]\n{toml}\n")
    assert from_toml.metrics_refresh_s == seconds
    assert read(tmp_path, "gw.yaml", f"gateway:\n  {yaml}\n" if yaml else "") == from_toml


@pytest.mark.parametrize(("toml", "yaml"), [
    ("-1", "-1"),
    ("0.01", "0.01"),  # more often than the engines should be asked
    ("inf", ".inf"),
    ("nan", ".nan"),
    ('"2"', '"2"'),
    ("true", "true"),
])
def test_a_bad_metrics_refresh_is_refused_in_toml_and_yaml_alike(tmp_path: Path, toml: str, yaml: str) -> None:
    for name, text in (("gw.toml", f"[gateway]\nmetrics_refresh_s = {toml}\n"), ("gw.yaml", f"gateway:\n  metrics_refresh_s: {yaml}\n")):
        with pytest.raises(UsageError) as e:
            read(tmp_path, name, text)
        assert "[gateway] metrics_refresh_s must be 0 (off) or a number of seconds of at least 0.1" in str(e.value)


@pytest.mark.parametrize("lease", ["0", "0.1", "inf", "nan", '"10"', "true"])
def test_a_bad_redis_lease_is_refused(tmp_path: Path, lease: str) -> None:
    with pytest.raises(UsageError) as e:
        read(tmp_path, "gw.toml", f'[redis]\nurl = "redis://127.0.0.1:1/0"\nlease_s = {lease}\n')
    assert "[redis] lease_s must be a number of seconds of at least 0.5" in str(e.value)


def test_redis_shares_admission_unless_told_not_to(tmp_path: Path) -> None:
    on = read(tmp_path, "gw.toml", '[redis]\nurl = "redis://127.0.0.1:1/0"\n').redis
    leased = read(tmp_path, "gw.toml", '[redis]\nurl = "redis://127.0.0.1:1/0"\nlease_s = 2\n').redis
    off = read(tmp_path, "gw.toml", '[redis]\nurl = "redis://127.0.0.1:1/0"\nadmission = false\n').redis
    assert on is not None and on.admission and on.lease_s == 10.0
    assert leased is not None and leased.admission and leased.lease_s == 2.0
    assert off is not None and not off.admission


@pytest.mark.parametrize(("url", "said"), [
    ("http://127.0.0.1:6379", "must begin redis://"),  # was an internal error at start (redis-py's ValueError)
    ("redis:/oops", "must begin redis://"),
    ("redis://127.0.0.1:notaport/0", "not a Redis URL"),  # was an internal error at start
    ("redis://127.0.0.1:6379/abc", "the path is the database number"),  # redis-py took it as database 0
    ("unix://", "needs the socket's path"),
])
def test_a_redis_url_redis_py_would_fail_on_or_misread_is_refused_at_once(tmp_path: Path, url: str, said: str) -> None:
    with pytest.raises(UsageError) as e:
        read(tmp_path, "gw.toml", f'[redis]\nurl = "{url}"\n')
    assert said in str(e.value)
    r = CliRunner().invoke(main, ["gateway", "--upstream", "http://127.0.0.1:8001", "--config", str(tmp_path / "gw.toml")])
    assert r.exit_code == 2 and said in r.output and "internal error" not in r.output


@pytest.mark.parametrize("url", ["redis://127.0.0.1:6379", "redis://127.0.0.1:6379/", "redis://10.0.0.9:6379/3",
                                 "rediss://user:pw@redis.example:6380/0", "unix:///run/redis.sock"])
def test_a_redis_url_redis_py_takes_is_taken(tmp_path: Path, url: str) -> None:
    red = read(tmp_path, "gw.toml", f'[redis]\nurl = "{url}"\n').redis
    assert red is not None and red.url == url


@pytest.mark.parametrize(("toml", "yaml"), [("[redis]\n", "redis: {}\n"), ('[redis]\nprefix = "x:"\n', "redis:\n  prefix: x\n")])
def test_a_redis_table_without_a_url_is_refused_empty_or_not(tmp_path: Path, toml: str, yaml: str) -> None:
    """An empty [redis] was taken as no [redis] at all: each instance kept its limits,
    cache and budgets to itself, with no word of it."""
    for name, text in (("gw.toml", toml), ("gw.yaml", yaml)):
        with pytest.raises(UsageError, match=r"\[redis\] has no url"):
            read(tmp_path, name, text)


def test_a_redis_password_is_hidden_where_the_url_is_shown(tmp_path: Path) -> None:
    red = read(tmp_path, "gw.toml", '[redis]\nurl = "redis://default:s3cret@10.0.0.9:6379/0"\n').redis
    assert red is not None and red.shown == "redis://default:***@10.0.0.9:6379/0"


def test_a_cache_entry_count_is_refused_where_redis_holds_the_entries(tmp_path: Path) -> None:
    """Entries in Redis are bounded by its maxmemory; max_entries was accepted and ignored."""
    shared = '[redis]\nurl = "redis://127.0.0.1:1/0"\n[cache]\nmax_entries = 10\n'
    with pytest.raises(UsageError, match="max_entries"):
        read(tmp_path, "gw.toml", shared)
    kept = read(tmp_path, "gw.toml", shared.replace("[cache]\n", "[cache]\n").replace('0"\n', '0"\ncache = false\n', 1))
    assert kept.cache.max_entries == 10  # (each instance's own cache: a count it acts on)


@pytest.mark.parametrize("other", ["[redis]\nadmission = false", '[admission]\nmode = "off"'])
def test_a_lease_for_budgets_nothing_shares_is_refused(tmp_path: Path, other: str) -> None:
    table, line = other.split("\n")
    text = '[redis]\nurl = "redis://127.0.0.1:1/0"\nlease_s = 2\n'
    text = text.replace("[redis]\n", f"[redis]\n{line}\n") if table == "[redis]" else f"{other}\n{text}"
    with pytest.raises(UsageError) as e:
        read(tmp_path, "gw.toml", text)
    assert "lease_s" in str(e.value) and "nothing shares them" in str(e.value)


@pytest.mark.parametrize(("table", "key"), [("cache", "ttl_s"), ("admission", "queue_timeout_s"),
                                            ("admission", "starvation_s"), ("gateway", "upstream_timeout_s")])
@pytest.mark.parametrize("value", ["inf", "1e300", "0", "-1"])
def test_a_time_that_overflows_the_clock_or_is_not_positive_is_refused(tmp_path: Path, table: str, key: str, value: str) -> None:
    """[cache] ttl_s = inf was taken, then every cacheable answer was a 500 (OverflowError
    storing it) and the next identical request waited for ever; the admission times the
    same (an internal error at start). Each time is a positive number of seconds up to 1e6."""
    with pytest.raises(UsageError) as e:
        read(tmp_path, "gw.toml", f"[{table}]\n{key} = {value}\n")
    assert f"[{table}] {key} must be a positive number of seconds, at most 1e+06" in str(e.value)


@pytest.mark.parametrize(("url", "words"), [
    ("http://127.0.0.1:99999", "Port out of range"),
    ("http://127.0.0.1:abc", "could not be cast to integer"),
    ("http://[::1", "Invalid IPv6 URL"),
    ("http://127.0.0.1:0", "port 0 is no server's"),
    # (credentials in the URL showed in /health, /metrics and the log, which need no key)
    ("http://user:s3cret@127.0.0.1:8000", "a user or password in the URL is not taken"),
])
def test_an_upstream_url_that_is_no_server_or_carries_a_password_is_a_usage_error(url: str, words: str) -> None:
    """Each was an internal error, or (with a password) a gateway that served it to anyone."""
    import subprocess

    p = subprocess.run([sys.executable, "-m", "inferlab", "gateway", "--upstream", url, "--port", "0"],
                       capture_output=True, text=True, timeout=60)  # (bounded: a gateway that starts serves on)
    assert p.returncode == 2 and words in p.stderr and "s3cret" not in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


def test_waiters_for_an_identical_request_are_answered_even_when_storing_fails() -> None:
    """The leader's answer could not be stored (any error in ``put``): the waiters kept
    waiting for ever. They are answered, and the key has no leader left."""
    import asyncio

    from inferlab._clock import WallClock
    from inferlab.gateway.cache import ResponseCache
    from inferlab.gateway.config import CacheConfig

    async def go() -> None:
        cache = ResponseCache(CacheConfig(), WallClock())

        def broken(key: str, entry: object) -> None:
            raise OverflowError("cannot store")

        cache.put = broken  # type: ignore[method-assign,assignment]
        cache.lead("k")
        waiter = cache.pending("k")
        assert waiter is not None
        entry = object()
        with pytest.raises(OverflowError):
            cache.finish("k", entry)  # type: ignore[arg-type]
        assert await asyncio.wait_for(waiter, 1) is entry and cache.pending("k") is None

    asyncio.run(go())


def test_a_request_past_the_upstreams_context_gets_a_400_at_once_not_a_503_after_waiting() -> None:
    """max_tokens past the context the upstream lists in /v1/models, while admission is
    busy: the gateway waited for that much room behind the other requests and answered
    503 after queue_timeout_s (a retryable 5xx for a client's fault, holding room after
    starvation_s). It answers 400 at once now, and the others are served."""
    import asyncio

    import aiohttp
    from gateway_helpers import chat_body, post, serving

    from inferlab.gateway.config import AdmissionConfig, CacheConfig, UpstreamConfig
    from inferlab.sim.engine.engine import EngineConfig
    from inferlab.sim.server.app import ServerConfig
    from inferlab.sim.server.launch import EmbeddedServer

    with EmbeddedServer(ServerConfig(engine=EngineConfig(max_model_len=4096))) as sim:
        config = GatewayConfig(
            upstreams=(UpstreamConfig(sim.url),), cache=CacheConfig(enabled=False),
            admission=AdmissionConfig(max_tokens_in_flight=1000, queue_timeout_s=2.0, starvation_s=1.0),
        )

        async def go() -> None:
            async with serving(config) as (url, _), aiohttp.ClientSession() as s:
                model = EngineConfig().model
                busy = asyncio.gather(*(post(s, url, chat_body(model, max_tokens=300, ignore_eos=True)) for _ in range(2)))
                await asyncio.sleep(0.3)  # (the two hold about 640 of the 1,000 tokens)
                huge = await asyncio.wait_for(post(s, url, chat_body(model, max_tokens=10**12, stream=False)), 60)  # (a bound)
                assert huge.status == 400 and "maximum context length is 4096" in huge.body.decode(), huge.body
                assert huge.json()["error"]["param"] == "max_tokens"
                assert all(a.status == 200 for a in await busy)

        asyncio.run(go())


@pytest.mark.parametrize(("release", "served"), [(None, True), ("0.31", False)])
def test_a_max_tokens_of_the_whole_context_goes_to_the_upstream(release: str | None, served: bool) -> None:
    """max_tokens equal to the upstream's context: vLLM 0.32 (a current sim serve) lowers
    it to what the prompt leaves and answers, so the gateway passes it on (it refused it
    itself); an older release refuses it, in its own words. Past the context every
    release refuses: the gateway's 400, naming the field it came in."""
    import asyncio

    import aiohttp
    from gateway_helpers import chat_body, post, serving

    from inferlab.gateway.config import CacheConfig, UpstreamConfig
    from inferlab.sim.engine.engine import EngineConfig
    from inferlab.sim.server.app import ServerConfig
    from inferlab.sim.server.launch import EmbeddedServer

    with EmbeddedServer(ServerConfig(engine=EngineConfig(max_model_len=512, engine_version=release))) as sim:
        config = GatewayConfig(upstreams=(UpstreamConfig(sim.url),), cache=CacheConfig(enabled=False))

        async def go() -> None:
            async with serving(config) as (url, _), aiohttp.ClientSession() as s:
                model = EngineConfig().model
                whole = await post(s, url, chat_body(model, max_tokens=512, stream=False, ignore_eos=True))
                assert whole.status == (200 if served else 400), whole.body
                if served:
                    usage = whole.json()["usage"]
                    assert usage["completion_tokens"] == 512 - usage["prompt_tokens"]
                    assert whole.json()["choices"][0]["finish_reason"] == "length"
                else:
                    assert "However, you requested" in whole.json()["error"]["message"]  # (the upstream's words)
                body = {**chat_body(model, stream=False), "max_completion_tokens": 513}
                past = await post(s, url, body)
                assert past.status == 400 and past.json()["error"]["param"] == "max_completion_tokens", past.body

        asyncio.run(go())


def test_the_setup_a_run_records_holds_only_the_budgets_the_mode_acts_on(tmp_path: Path) -> None:
    # /inferlab/gateway (a run's resolved.gateway) said max_requests_in_flight = 64 for
    # a gateway admitting by tokens, and 65,536 tokens for one counting requests: caps
    # that never held, recorded as if they did
    from inferlab.results.provenance import describe_gateway

    setups = {mode: read(tmp_path, "gw.toml", f'[admission]\nmode = "{mode}"\n').setup()["admission"]
              for mode in ("tokens", "requests", "off")}
    assert "max_requests_in_flight" not in setups["tokens"] and setups["tokens"]["max_tokens_in_flight"] == 65536
    assert "max_tokens_in_flight" not in setups["requests"] and setups["requests"]["max_requests_in_flight"] == 64
    assert setups["off"] == {"mode": "off", "tokenizer": "estimate"}
    # an upstream's own budget is said beside the default, not hidden behind it
    own = read(tmp_path, "gw.toml", '[[upstreams]]\nurl = "http://127.0.0.1:8002"\nmax_tokens_in_flight = 32768\n')
    assert "(65,536 tokens per upstream, 32,768 on 127.0.0.1:8002, prompts counted by estimate)" in str(
        describe_gateway(own.setup()))
    alone = load_config([], host="127.0.0.1", port=8080, path=str(tmp_path / "gw.toml"))
    assert "(32,768 tokens on 127.0.0.1:8002, prompts" in str(describe_gateway(alone.setup()))
