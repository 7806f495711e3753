"""When a response's bytes reached the client's socket: loopback packets with the kernel's
receive timestamps, for measuring what the client itself adds to TTFT.

``client_scale.py``'s ``ttft`` part compares the client's TTFT with the simulator's own
timeline; that difference holds the server's lateness too (``sim serve`` is one Python
process writing every stream's chunk in turn). With the packets, it splits in two: from
the simulator's stamp to the first token's packet arriving on loopback (the server's
side: what any client on this machine would see), and from that arrival to the
client's own stamp (what the client adds: its measurement error proper).

How: a capture process (``python bench/wire_capture.py capture --port P --out F``; it
needs root, or CAP_NET_RAW, for an ``AF_PACKET`` socket) reads every TCP packet to and
from port P on ``lo`` (a socket filter drops the rest in the kernel) with its receive
time (``SO_TIMESTAMPNS``, the wall clock) and keeps those with a payload. Afterwards,
``match`` rebuilds each connection's two byte streams, parses the responses with
httptools and inferlab's own reader (the first event with generated content, and the
``inferlab_timeline`` of the last), pairs each with the request before it on its
connection, and joins them to the run's records by the server's timeline (scheduled,
first-token and finished times, to 0.1 µs). The records' times count from the run's
start on the monotonic clock; that start is placed on the packets' clock by the
requests: each record's send stamp is taken just before its request is written, so the
smallest gap between a request's packet and its record's send stamp is the offset (to
within that smallest write, a few µs; it errs toward a larger client delay).

Loopback only; the capture stops on SIGTERM or SIGINT and reports the packets the
kernel dropped (none may be, or ``match`` refuses).
"""

from __future__ import annotations

import argparse
import bisect
import ctypes
import json
import pickle
import signal
import socket
import statistics
import struct
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ETH_P_ALL = 0x0003
SO_TIMESTAMPNS = 35
SO_ATTACH_FILTER = 26
SO_RCVBUFFORCE = 33
SOL_PACKET = 263
PACKET_STATISTICS = 6
PACKET_HOST = 0  # (on lo every packet is seen twice: sent, then received; the second)


def available() -> str | None:
    """None if this process may capture on loopback, else why not."""
    if sys.platform != "linux":
        return "packet capture needs Linux"
    try:
        socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL)).close()
    except (PermissionError, OSError) as e:
        return f"no AF_PACKET socket ({e.strerror or e}); run as root or with CAP_NET_RAW"
    return None


def _filter(port: int) -> bytes:
    """Classic BPF: received (not outgoing) IPv4 TCP packets with ``port`` at either end
    (IP header of 20 bytes, as loopback's are)."""
    ld_pkttype = (0x20, 0, 0, 0xFFFFF004)  # ld #pkttype (SKF_AD_OFF + SKF_AD_PKTTYPE)
    prog = [
        ld_pkttype,
        (0x15, 0, 8, PACKET_HOST),  # jeq #HOST, next, drop
        (0x28, 0, 0, 12),  # ldh [12]: ethertype
        (0x15, 0, 6, 0x0800),  # jeq #IPv4
        (0x30, 0, 0, 23),  # ldb [23]: protocol
        (0x15, 0, 4, 6),  # jeq #TCP
        (0x28, 0, 0, 34),  # ldh [34]: source port
        (0x15, 2, 0, port),  # jeq #port -> accept
        (0x28, 0, 0, 36),  # ldh [36]: destination port
        (0x15, 0, 1, port),  # jeq #port -> accept, else drop
        (0x06, 0, 0, 0x40000),  # accept
        (0x06, 0, 0, 0),  # drop
    ]
    return b"".join(struct.pack("HBBI", *ins) for ins in prog)


def capture(port: int, out: Path) -> int:
    """Capture until SIGTERM/SIGINT, then write ``out``: the packets and the kernel's
    counts (a pickle of a dict)."""
    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append(1))
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    code = _filter(port)
    buf = ctypes.create_string_buffer(code)
    fprog = struct.pack("HL", len(code) // 8, ctypes.addressof(buf))
    s.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)
    s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    try:
        s.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 256 << 20)
    except OSError:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 20)
    s.bind(("lo", 0))
    s.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8)  # (reading resets the counts)
    s.settimeout(0.2)
    print("capturing", flush=True)
    packets: list[tuple[int, int, int, int, bytes]] = []  # (ns, sport, dport, seq, payload)
    while not stop:
        try:
            data, anc, _, _ = s.recvmsg(1 << 17, 64)
        except TimeoutError:
            continue
        except InterruptedError:
            continue
        ihl = (data[14] & 15) * 4
        tcp = 14 + ihl
        off = tcp + (data[tcp + 12] >> 4) * 4
        if off >= len(data):
            continue  # (no payload: an ACK, SYN or FIN)
        sport, dport, seq = struct.unpack_from("!HHI", data, tcp)
        ns = 0
        for _, kind, raw in anc:
            if kind == SO_TIMESTAMPNS:
                sec, nsec = struct.unpack("qq", raw[:16])
                ns = sec * 1_000_000_000 + nsec
        packets.append((ns, sport, dport, seq, data[off:]))
    seen, dropped = struct.unpack("II", s.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8))
    with open(out, "wb") as f:
        pickle.dump(
            {"port": port, "packets": packets, "kernel_seen": seen, "kernel_dropped": dropped}, f
        )
    return 0


class Capture:
    """The capture process for ``port``, pinned to ``cpus`` (``taskset``), as a context:
    started and ready on entry; on exit stopped, its packets in ``path``."""

    def __init__(self, port: int, path: Path, cpus: set[int] | None) -> None:
        self.port, self.path, self.cpus = port, path, cpus
        self.proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> Capture:
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "capture",
            "--port",
            str(self.port),
            "--out",
            str(self.path),
        ]
        if self.cpus is not None:
            cmd = ["taskset", "-c", ",".join(map(str, sorted(self.cpus))), *cmd]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, process_group=0)
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "capturing":
            self.proc.kill()
            raise RuntimeError("the packet capture did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@dataclass
class _Response:
    request_ns: int | None  # the packet that carried its request's first bytes
    first_ns: int | None = None  # the packet that completed its first event with content
    timeline: dict[str, Any] | None = None


@dataclass
class _Side:
    packets: list[tuple[int, int, bytes]] = field(default_factory=list)  # (seq, ns, payload)

    def ordered(self) -> list[tuple[int, bytes]]:
        """(ns, payload) in sequence order, each byte once (a retransmission's overlap
        dropped); ``ValueError`` at a gap (a packet the capture missed)."""
        out = []
        nxt: int | None = None
        for seq, ns, payload in sorted(self.packets, key=lambda p: (p[0], p[1])):
            if nxt is not None:
                skip = (nxt - seq) % (1 << 32)
                if skip >= len(payload) and skip < (1 << 31):
                    continue
                if skip >= 1 << 31:
                    raise ValueError("a gap in a captured byte stream")
                payload = payload[skip:]
                seq = nxt
            out.append((ns, payload))
            nxt = (seq + len(payload)) % (1 << 32)
        return out


def _responses(client: list[tuple[int, bytes]], server: list[tuple[int, bytes]]) -> list[_Response]:
    """One connection's responses, in order, each with its request's packet time."""
    import httptools

    from inferlab.openai.response import ResponseReader
    from inferlab.openai.sse import SSEParser

    starts = [ns for ns, payload in client if payload.startswith((b"POST ", b"GET "))]
    out: list[_Response] = []

    class Proto:
        now = 0
        reader: ResponseReader | None = None
        sse: SSEParser | None = None

        def on_message_begin(self) -> None:
            i = len(out)
            out.append(_Response(starts[i] if i < len(starts) else None))
            self.reader, self.sse = ResponseReader(), SSEParser()

        def on_body(self, body: bytes) -> None:
            assert self.sse is not None and self.reader is not None
            for event in self.sse.feed(body):
                try:
                    arrivals = self.reader.event(event)
                except ValueError:
                    continue
                if arrivals and out[-1].first_ns is None:
                    out[-1].first_ns = self.now
            if self.reader.timeline is not None:
                out[-1].timeline = self.reader.timeline

    proto = Proto()
    parser = httptools.HttpResponseParser(proto)
    for ns, payload in server:
        proto.now = ns
        parser.feed_data(payload)
    return out


_KEY = ("scheduled_ms", "first_token_ms", "finished_ms")
#: How far after its send stamp a request's packet may be and still be its own
_WINDOW_NS = 1_000_000
#: Responses with one server timeline looked at per record (requests alike, in a row)
_MAX_ALIKE = 64


def match(path: Path, records: list[dict[str, Any]]) -> dict[str, Any]:
    """The client's own delay per request (ms): its first-content stamp minus the arrival
    of that content's packet, for every record joined to a captured response; with what
    the join found (counts, the offset's spread)."""
    with open(path, "rb") as f:
        cap = pickle.load(f)
    if cap["kernel_dropped"]:
        raise RuntimeError(
            f"the kernel dropped {cap['kernel_dropped']:,} of {cap['kernel_seen']:,} captured packets"
        )
    port = cap["port"]
    conns: dict[int, tuple[_Side, _Side]] = defaultdict(lambda: (_Side(), _Side()))
    for ns, sport, dport, seq, payload in cap["packets"]:
        if dport == port:
            conns[sport][0].packets.append((seq, ns, payload))
        elif sport == port:
            conns[dport][1].packets.append((seq, ns, payload))
    by_key: dict[tuple[Any, ...], list[tuple[int, int]]] = defaultdict(list)  # (request, first)
    responses = 0
    for to_server, to_client in conns.values():
        for r in _responses(to_server.ordered(), to_client.ordered()):
            if r.timeline is None or r.first_ns is None or r.request_ns is None:
                continue
            by_key[tuple(r.timeline.get(k) for k in _KEY)].append((r.request_ns, r.first_ns))
            responses += 1
    wanted = [
        rec
        for rec in records
        if rec.get("server_timeline") and rec.get("content_ns") and rec.get("send_ns") is not None
    ]
    # The run's start on the packets' clock: a request's packet follows its record's send
    # stamp by the time its write took, so the right pairs' gaps (packet - stamp) bunch
    # within a few µs while wrong ones (the same server timeline twice: requests alike)
    # scatter; the start is the smallest gap of the densest millisecond of gaps.
    gaps = sorted(
        request - rec["send_ns"]
        for rec in wanted
        for request, _ in by_key.get(tuple(rec["server_timeline"].get(k) for k in _KEY), [])[
            :_MAX_ALIKE
        ]
    )
    if not gaps:
        raise RuntimeError("no record has a captured response with its server timeline")
    best = max(range(len(gaps)), key=lambda i: bisect.bisect_right(gaps, gaps[i] + _WINDOW_NS) - i)
    t0 = gaps[best]
    pairs = []
    used: set[tuple[int, int]] = set()
    for rec in wanted:
        alike = by_key.get(tuple(rec["server_timeline"].get(k) for k in _KEY), [])
        near = [
            (request - t0 - rec["send_ns"], (request, first))
            for request, first in alike
            if (request, first) not in used and 0 <= request - t0 - rec["send_ns"] <= _WINDOW_NS
        ]
        if near:
            request, first = min(near)[1]
            used.add((request, first))
            pairs.append((request - rec["send_ns"], rec["content_ns"][0], first, rec))
    if not pairs:
        raise RuntimeError("no record joined a captured response")
    offsets = sorted(p[0] for p in pairs)
    delays = [(c + t0 - first) / 1e6 for _, c, first, _ in pairs]
    # the rest of the error against the simulator's timeline: from its first-token stamp
    # (ms since it received the request) to the packet's arrival (ms since the send)
    before = [
        (first - t0 - rec["send_ns"]) / 1e6 - float(rec["server_timeline"]["first_token_ms"])
        for _, _, first, rec in pairs
        if rec["server_timeline"].get("first_token_ms") is not None
    ]
    return {
        "joined": len(pairs),
        "records": sum(1 for r in records if r.get("content_ns")),
        "responses": responses,
        "packets": len(cap["packets"]),
        "offset_spread_ms": {
            "p50": (offsets[len(offsets) // 2] - t0) / 1e6,
            "max": (offsets[-1] - t0) / 1e6,
        },
        "delay_ms": delays,
        "server_side_ms": before,
    }


def quantile(xs: list[float], q: float) -> float:
    """As the summary's percentiles (linear between neighbours; q in 0..1)."""
    from inferlab.results.metrics import percentile

    return percentile(sorted(xs), 100 * q)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="mode", required=True)
    c = sub.add_parser("capture", help="capture one port's packets on lo until SIGTERM")
    c.add_argument("--port", type=int, required=True)
    c.add_argument("--out", type=Path, required=True)
    m = sub.add_parser("match", help="join a capture to a run directory's requests.jsonl")
    m.add_argument("capture", type=Path)
    m.add_argument("run", type=Path)
    args = ap.parse_args(argv)
    if args.mode == "capture":
        return capture(args.port, args.out)
    records = [
        json.loads(line) for line in (args.run / "requests.jsonl").read_text().splitlines() if line
    ]
    got = match(args.capture, records)
    d, before = got.pop("delay_ms"), got.pop("server_side_ms")
    print(json.dumps(got))
    if before:
        print(
            f"server's side ms (its first-token stamp to the packet): p50 {quantile(before, 0.5):.3f} "
            f"p99 {quantile(before, 0.99):.3f}"
        )
    print(
        f"client delay ms: p50 {quantile(d, 0.5):.3f} p99 {quantile(d, 0.99):.3f} max {max(d):.3f} "
        f"min {min(d):.3f} mean {statistics.fmean(d):.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    sys.exit(main())
