"""``bench/wire_capture.py``: the loopback capture that splits the client's TTFT error into
what the server took to put the first token on the wire and what the client added after
it arrived. A real ``sim serve``, real packets, a real ``bench`` run; skipped where this
process may not open a packet socket (it needs root or CAP_NET_RAW)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from inferlab.sim.server.launch import ChildServer

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
import wire_capture  # noqa: E402

pytestmark = pytest.mark.skipif(wire_capture.available() is not None, reason=str(wire_capture.available()))


def run_captured(
    tmp_path: Path, concurrency: int, n: int, output_tokens: int = 8
) -> tuple[list[dict[str, object]], dict[str, object]]:
    with ChildServer() as server:
        port = urlsplit(server.url).port
        assert port is not None
        with wire_capture.Capture(port, tmp_path / "packets.pickle", None):
            p = subprocess.run(
                [sys.executable, "-m", "inferlab", "bench", "--url", server.url, "-c", str(concurrency),
                 "-n", str(n), "--input-tokens", "64", "--output-tokens", str(output_tokens), "--out", str(tmp_path / "run")],
                capture_output=True, text=True, timeout=120, check=False,
            )  # fmt: skip
            assert p.returncode == 0, p.stderr
    records = [json.loads(x) for x in (tmp_path / "run" / "requests.jsonl").read_text().splitlines() if x]
    return records, wire_capture.match(tmp_path / "packets.pickle", records)


@pytest.mark.parametrize("concurrency", [1, 8])
def test_every_request_is_joined_to_its_packets_and_the_client_stamps_after_they_came(
    tmp_path: Path, concurrency: int
) -> None:
    """At one stream every request looks alike to the server (the same timeline, request
    after request): the join must still pair each record with its own packets."""
    records, got = run_captured(tmp_path, concurrency, 12)
    assert got["joined"] == got["records"] == len(records) == 12
    delays = got["delay_ms"]
    assert isinstance(delays, list) and len(delays) == 12
    # the client cannot have read a token before its packet arrived (the start's
    # placement errs toward a later client, by its smallest write: never earlier)
    assert min(delays) >= 0
    # and what it adds is a small part of what it measured (TTFT here: tens of ms)
    ttfts = sorted((r["content_ns"][0] - r["send_ns"]) / 1e6 for r in records)  # type: ignore[index,operator]
    assert max(delays) < ttfts[0] / 4


def test_packets_of_other_requests_are_not_taken_for_the_runs(tmp_path: Path) -> None:
    """A capture of another workload's requests (other server timelines) joins none of
    this run's records."""
    records, _ = run_captured(tmp_path / "a", 2, 4)
    run_captured(tmp_path / "b", 2, 4, output_tokens=9)
    with pytest.raises(RuntimeError, match="no record"):
        wire_capture.match(tmp_path / "b" / "packets.pickle", records)
