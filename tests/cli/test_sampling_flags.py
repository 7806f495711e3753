"""``bench --temperature`` and ``--extra-body`` (vLLM's names): sent with every request to
a real server on loopback, recorded in config.json, and refused where a field would
change what the run measures without its records knowing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from inferlab.cli.main import main
from inferlab.sim.engine.engine import EngineConfig
from inferlab.sim.server.app import ServerConfig
from inferlab.sim.server.launch import EmbeddedServer


@pytest.fixture(scope="module")
def sim() -> Iterator[EmbeddedServer]:
    with EmbeddedServer(ServerConfig(EngineConfig())) as server:
        yield server


def bench(url: str, *args: str) -> tuple[int, str]:
    """Exit code and the last line of stderr."""
    res = CliRunner().invoke(main, ["bench", "--url", url, "-n", "3", "-c", "1", "--input-tokens", "30", "--output-tokens", "4", *args])
    err = res.stderr.strip().splitlines()
    return res.exit_code, err[-1] if err else ""


def test_the_fields_are_sent_and_recorded(sim: EmbeddedServer, tmp_path: Path) -> None:
    out = tmp_path / "run"
    code, err = bench(sim.url, "--temperature", "0.7", "--extra-body", '{"top_p": 0.9, "seed": 3}', "-o", str(out))
    assert code == 0, err
    config = json.loads((out / "config.json").read_text())
    assert config["extra_body"] == {"top_p": 0.9, "seed": 3, "temperature": 0.7}
    summary = json.loads((out / "summary.json").read_text())
    # exact output lengths still hold with sampling on
    assert summary["counts"]["completed"] == 3 and summary["output_tokens"] == 3 * 4


@pytest.mark.parametrize(("body", "needle"), [
    ('{"top_p": 2}', "top_p"),  # the simulated server refuses it as vLLM does
    ('{"seed": "x"}', "seed"),
])
def test_a_field_the_server_refuses_stops_the_run_at_the_probe(sim: EmbeddedServer, body: str, needle: str) -> None:
    code, err = bench(sim.url, "--extra-body", body)
    assert code == 1
    assert "refused the probe request" in err and needle in err and "--extra-body" in err


def test_without_the_probe_every_request_records_the_servers_refusal(sim: EmbeddedServer, tmp_path: Path) -> None:
    out = tmp_path / "run"
    code, _ = bench(sim.url, "--no-preflight", "--temperature", "0", "--extra-body", '{"top_p": 2}', "-o", str(out))
    assert code == 1  # every request failed
    records = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert len(records) == 3 and all(r["status"] == 400 and "top_p" in r["error"] for r in records)


@pytest.mark.parametrize(("args", "needle"), [
    (["--extra-body", '{"max_tokens": 5}'], "'max_tokens' is set by --output-tokens"),
    (["--extra-body", '{"stream": false, "n": 2}'], "'stream' is set by --stream/--no-stream; 'n' is set by"),
    (["--extra-body", "[1]"], "must be a JSON object, not list"),
    (["--extra-body", "top_p=1"], "not JSON"),
    (["--extra-body", "@/nonexistent/body.json"], "No such file"),
    (["--temperature", "-1"], "-1"),
    (["--temperature", "1", "--extra-body", '{"temperature": 0}'], "both given"),
])
def test_what_would_go_unrecorded_is_refused(sim: EmbeddedServer, args: list[str], needle: str) -> None:
    code, err = bench(sim.url, *args)
    assert code == 2 and needle in err, err


def test_extra_body_from_a_file(sim: EmbeddedServer, tmp_path: Path) -> None:
    body = tmp_path / "body.json"
    body.write_text(json.dumps({"top_k": 5}))
    out = tmp_path / "run"
    code, err = bench(sim.url, "--extra-body", f"@{body}", "-o", str(out))
    assert code == 0, err
    assert json.loads((out / "config.json").read_text())["extra_body"] == {"top_k": 5}
