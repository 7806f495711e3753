"""``bench/wire_capture.py``: the loopback capture that splits the client's TTFT error into
what the server took to put the first token on the wire and what the client added after
it arrived. A real ``sim serve``, real packets, a real ``bench`` run; skipped where this
process may not open a packet socket (it needs root)."""

from __future__ import annotations

import json
import pickle
import socket
import statistics
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
    return records, match(tmp_path / "packets.pickle", records)


def match(path: Path, records: list[dict[str, object]]) -> dict[str, object]:
    """``wire_capture.match``; the test skipped where the host set the clock during the
    capture (a CI machine did, once: every join after the step failed), which ``match``
    refuses and ``test_a_capture_during_which_the_clock_was_set_is_refused`` checks."""
    try:
        return wire_capture.match(path, records)
    except RuntimeError as e:
        if "wall clock moved" in str(e):
            pytest.skip(str(e))
        raise


@pytest.mark.parametrize(("concurrency", "n"), [(1, 80), (8, 12)])
def test_every_request_is_joined_to_its_packets_and_the_client_stamps_after_they_came(
    tmp_path: Path, concurrency: int, n: int
) -> None:
    """At one stream every request looks alike to the server (the same timeline, request
    after request, many of them): the join must still pair each record with its own
    packets, not its neighbour's (their gaps would then differ by a whole request)."""
    records, got = run_captured(tmp_path, concurrency, n, output_tokens=8 if concurrency > 1 else 2)
    # (what the join saw, should it fail, in full: one clean-clone run joined 14 of 80 at
    # one stream, and a CI run 42 of 80, 11 of 12 and 0 of 4 in the next test; not
    # reproduced in 68 runs since, 51 of them beside two to four busy loops)
    seen = {k: got[k] for k in ("joined", "records", "responses", "packets", "offset_spread_ms", "unjoined")}
    assert got["joined"] == got["records"] == len(records) == n, json.dumps(seen)
    ttfts = sorted((r["content_ns"][0] - r["send_ns"]) / 1e6 for r in records)  # type: ignore[index,operator]
    # each record's request packet follows its send stamp by about a write (µs): the
    # typical one within 1 ms, and none by a whole request, as one paired with its
    # neighbour's request would be; a client a busy machine keeps off the CPU between
    # its stamp and its write adds that wait (1.2 ms seen beside two busy loops)
    spread = got["offset_spread_ms"]
    assert isinstance(spread, dict) and spread["p50"] < 1.0 and spread["max"] < ttfts[0]
    delays = got["delay_ms"]
    assert isinstance(delays, list) and len(delays) == n
    # the client cannot have read a token before its packet arrived (the start's
    # placement errs toward a later client, by its smallest write: never earlier)
    assert min(delays) >= 0
    # and what it adds is a small part of what it measured (TTFT here: tens of ms), for
    # the typical request: one whose client a busy machine kept off the CPU for a slice
    # adds that slice, and the capture measures it rightly (beside two busy loops: two of
    # 80 at 4.2 and 4.3 ms, the other 78 under 0.3 ms, against a shortest TTFT of 16.9 ms)
    assert statistics.median(delays) < ttfts[0] / 4


def test_packets_of_other_requests_are_not_taken_for_the_runs(tmp_path: Path) -> None:
    """A capture of another workload's requests (other server timelines) joins none of
    this run's records."""
    records, _ = run_captured(tmp_path / "a", 2, 4)
    run_captured(tmp_path / "b", 2, 4, output_tokens=9)
    with pytest.raises(RuntimeError, match="no record"):
        match(tmp_path / "b" / "packets.pickle", records)


def test_a_capture_during_which_the_clock_was_set_is_refused(tmp_path: Path) -> None:
    """Packets are stamped on the wall clock and put on the records' monotonic clock by the
    lead the capture measured as it read them: a capture whose lead moved past a few µs
    (the time set mid-run) is refused before any join, one within that goes on."""
    cap = {"port": 1, "packets": [], "kernel_seen": 0, "kernel_dropped": 0, "truncated": 0}
    for moved, error in ((40_000, "wall clock moved 40.0 µs"), (1_000, "no record has")):
        cap["clock"] = [(0, 7_000), (10_000_000, 7_000 + moved), (20_000_000, 7_000 + moved)]
        (tmp_path / "p.pickle").write_bytes(pickle.dumps(cap))
        with pytest.raises(RuntimeError, match=error):
            wire_capture.match(tmp_path / "p.pickle", [])


def test_the_capture_keeps_each_received_tcp_packet_of_its_port_once(tmp_path: Path) -> None:
    """Loopback shows every packet twice (sent, received) and carries other traffic: the
    capture keeps the received copy of its port's TCP packets only, and a datagram too
    short to be TCP does not stop it."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    with wire_capture.Capture(port, tmp_path / "p.pickle", None):
        client = socket.create_connection(("127.0.0.1", port))
        peer, _ = listener.accept()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            udp.sendto(b"", ("127.0.0.1", 9))
            udp.sendto(b"x" * 40, ("127.0.0.1", port))
        for i in range(20):
            client.sendall(b"ping %d" % i)
            assert peer.recv(100) == b"ping %d" % i
            peer.sendall(b"pong %d" % i)
            assert client.recv(100) == b"pong %d" % i
        client.close()
        peer.close()
    listener.close()
    with open(tmp_path / "p.pickle", "rb") as f:
        cap = pickle.load(f)
    payloads = sorted(pkt[4] for pkt in cap["packets"])
    assert payloads == sorted([b"ping %d" % i for i in range(20)] + [b"pong %d" % i for i in range(20)])
    assert cap["kernel_dropped"] == 0 and cap["truncated"] == 0
    # the lead was measured, and its measurements agree (a noisy one would make match
    # refuse every capture, and the join tests skip)
    leads = [lead for _, lead in cap["clock"]]
    assert leads and max(leads) - min(leads) < wire_capture._CLOCK_MOVED_NS, leads


def test_the_kernel_passes_the_capture_nothing_of_other_traffic(tmp_path: Path) -> None:
    """UDP to the port and TCP between other ports never reach the capture at all (the
    socket filter, not the parsing after it, keeps them out)."""
    listener = socket.create_server(("127.0.0.1", 0))
    other = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    with wire_capture.Capture(port, tmp_path / "p.pickle", None):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            udp.sendto(b"x" * 40, ("127.0.0.1", port))
        client = socket.create_connection(other.getsockname())
        peer, _ = other.accept()
        client.sendall(b"hello")
        assert peer.recv(100) == b"hello"
        client.close()
        peer.close()
    listener.close()
    other.close()
    with open(tmp_path / "p.pickle", "rb") as f:
        cap = pickle.load(f)
    assert cap["kernel_seen"] == 0 and cap["packets"] == []


def side(*packets: tuple[int, int, bytes]) -> wire_capture._Side:
    return wire_capture._Side(list(packets))


def test_a_byte_stream_is_rebuilt_in_sequence_order_across_the_wrap() -> None:
    top = 2**32
    s = side((top - 4, 10, b"HTTP"), (3, 30, b"11"), (0, 20, b"/1."))  # (seq, ns, payload)
    assert s.ordered() == [(10, b"HTTP"), (20, b"/1."), (30, b"11")]


def test_a_retransmission_is_read_once_and_early_bytes_wait_for_the_gap_before_them() -> None:
    # bytes 4-7 arrived (ns 5) before bytes 0-3 (ns 9): readable only at 9; a resend of
    # 2-5 adds nothing
    s = side((100, 9, b"abcd"), (104, 5, b"efgh"), (102, 12, b"cdef"), (108, 14, b"ij"))
    assert s.ordered() == [(9, b"abcd"), (9, b"efgh"), (14, b"ij")]


def test_a_missing_packet_is_an_error_not_a_shorter_stream() -> None:
    with pytest.raises(ValueError, match="gap"):
        side((0, 1, b"ab"), (4, 2, b"ef")).ordered()


def test_pieces_resent_across_earlier_ones_add_only_their_holes() -> None:
    # had: 0-1 "ab" (ns 3) and 4-5 "ef" (ns 4); then 0-7 "abcdefgh" (ns 6) fills 2-3 and
    # 6-7; a duplicate of "ef" and a piece inside "abcdefgh" add nothing
    s = side((0, 3, b"ab"), (4, 4, b"ef"), (0, 6, b"abcdefgh"), (4, 7, b"ef"), (1, 8, b"bcd"))
    assert s.ordered() == [(3, b"ab"), (6, b"cd"), (6, b"ef"), (6, b"gh")]
