"""When a response's bytes reached the client's socket: loopback packets with the kernel's
receive timestamps, for measuring what the client itself adds to TTFT.

``client_scale.py``'s ``ttft`` part compares the client's TTFT with the simulator's own
timeline; that difference holds the server's lateness too (``sim serve`` is one Python
process writing every stream's chunk in turn). With the packets, it splits in two: the
client's own part, from the first token's packet arriving on loopback to the client's
stamp (what the client adds: its measurement error proper), and the rest, from the
request's send to that arrival less the simulator's own first-token time (the server's
lateness, and the request's way there: the client's write, loopback, the server's read).

How: a capture process (``python bench/wire_capture.py capture --port P --out F``; it
needs root: an ``AF_PACKET`` socket, and a receive buffer past ``rmem_max``) reads the
packets to and from port P that ``lo`` receives (a socket filter drops the rest in the
kernel, the copies loopback shows as sent among them) with the kernel's receive time
(``SO_TIMESTAMPNS``, the wall clock, put on the monotonic clock as it reads each) and
keeps those with a TCP payload, reading what is
still queued when told to stop; it exits 1 if the kernel dropped a packet or one was cut
short. Afterwards, ``match`` rebuilds each connection's two byte streams, parses the
responses with httptools and inferlab's own reader (the packet that completed the first
event with generated content, and the ``inferlab_timeline`` of the last), pairs each
with the request before it on its connection, and joins them to the run's records
(warm-ups left out, as the summary leaves them) by the server's timeline (scheduled,
first-token and finished times, to 0.1 µs). The records' times count from the run's
start on the monotonic clock; that start is placed on the packets' clock by the
requests: each record's send stamp is taken just before its request is written, so the
right (request packet - send stamp) gaps bunch within µs, one per record, and pairing a
record with another request alike to the server (one stream: every timeline the same)
bunches fewer records; the start is the smallest gap of the 100 µs holding the most
records (so the client's delay errs large by at most that write, µs). A stamp that still
comes before its packet by more than 20 µs means the join is wrong: ``match`` refuses,
as it refuses a capture during which the wall clock was set (its lead over the monotonic
clock, measured as packets come, 10 ms apart at most, moved by more than 5 µs).

Limits: loopback and plain HTTP only; the records must carry the simulated server's
timeline (the mock and real engines send none); and the capture must be of the run it is
matched with (another run of the same workload against a fresh server looks the same).
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
import time
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
        return f"no AF_PACKET socket ({e.strerror or e}); run as root"
    return None


def _filter(port: int) -> bytes:
    """Classic BPF: received (not outgoing) IPv4 TCP packets with ``port`` at either end
    (IP header of 20 bytes, as loopback's are). A jump skips ``jt``/``jf`` instructions
    after its own."""
    accept, drop = 10, 11
    prog = [
        (0x20, 0, 0, 0xFFFFF004),  # 0: ld #pkttype (SKF_AD_OFF + SKF_AD_PKTTYPE)
        (0x15, 0, drop - 2, PACKET_HOST),  # 1: jeq #HOST, else drop
        (0x28, 0, 0, 12),  # 2: ldh [12]: ethertype
        (0x15, 0, drop - 4, 0x0800),  # 3: jeq #IPv4, else drop
        (0x30, 0, 0, 23),  # 4: ldb [23]: protocol
        (0x15, 0, drop - 6, 6),  # 5: jeq #TCP, else drop
        (0x28, 0, 0, 34),  # 6: ldh [34]: source port
        (0x15, accept - 8, 0, port),  # 7: jeq #port -> accept
        (0x28, 0, 0, 36),  # 8: ldh [36]: destination port
        (0x15, accept - 10, drop - 10, port),  # 9: jeq #port -> accept, else drop
        (0x06, 0, 0, 0x40000),  # 10: accept
        (0x06, 0, 0, 0),  # 11: drop
    ]
    return b"".join(struct.pack("HBBI", *ins) for ins in prog)


class _WallToMonotonic:
    """The wall clock's lead over the monotonic clock, measured again for a packet read
    10 ms or more after the last measurement, on each idle read (every 200 ms) and at
    the end: the kernel stamps packets on the wall clock, the records are on the
    monotonic one. Each
    measurement is the best of a few bracketed reads (wall between two monotonic reads,
    the closest pair): a read preempted between its two calls, tens of µs here, would move
    every packet until the next. ``history`` keeps each measurement (monotonic ns, lead
    ns): a step of the wall clock during the capture (the host setting the time) moves
    the packets around it against the records, and ``match`` refuses such a capture."""

    def __init__(self) -> None:
        self._at = -(10**18)
        self.lead_ns = 0
        self.history: list[tuple[int, int]] = []

    def now(self, measure: bool = False) -> int:
        mono = time.monotonic_ns()
        if measure or mono - self._at > 10_000_000:
            best = None
            for _ in range(5):
                m1 = time.monotonic_ns()
                wall = time.time_ns()
                m2 = time.monotonic_ns()
                if best is None or m2 - m1 < best[0]:
                    best = (m2 - m1, wall - (m1 + m2) // 2)
            assert best is not None
            self._at, self.lead_ns = mono, best[1]
            self.history.append((mono, best[1]))
        return self.lead_ns


def _packet(
    data: bytes, anc: list[tuple[int, int, bytes]], lead_ns: int = 0
) -> tuple[int, int, int, int, bytes] | None:
    """(kernel ns, on the monotonic clock, source port, destination port, sequence number,
    payload) of one captured frame; None for one with no TCP payload (an ACK, SYN or FIN).
    The kernel stamps on the wall clock; ``lead_ns`` (``_WallToMonotonic``) puts it on
    the monotonic clock the records use."""
    if len(data) < 14 + 20 + 20 or data[12:14] != b"\x08\x00" or data[23] != 6:
        return None  # (the filter passes nothing else; checked all the same)
    tcp = 14 + (data[14] & 15) * 4
    off = tcp + (data[tcp + 12] >> 4) * 4
    if off >= len(data):
        return None
    sport, dport, seq = struct.unpack_from("!HHI", data, tcp)
    for _, kind, raw in anc:
        if kind == SO_TIMESTAMPNS:
            sec, nsec = struct.unpack("qq", raw[:16])
            return sec * 1_000_000_000 + nsec - lead_ns, sport, dport, seq, data[off:]
    raise RuntimeError("a captured packet came without the kernel's timestamp")


def capture(port: int, out: Path) -> int:
    """Capture until SIGTERM/SIGINT, then write ``out``: the packets and the kernel's
    counts (a pickle of a dict). Exit status 1 if a packet was lost (the kernel dropped
    it) or cut short (longer than the read)."""
    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append(1))
    # protocol 0 until bound: nothing is queued before the filter is in place
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
    code = _filter(port)
    buf = ctypes.create_string_buffer(code)
    fprog = struct.pack("HL", len(code) // 8, ctypes.addressof(buf))
    s.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)
    s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    try:
        s.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 256 << 20)
    except OSError:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 20)
    s.bind(("lo", ETH_P_ALL))  # (Python puts the protocol in network order itself)
    s.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8)  # (reading resets the counts)
    s.settimeout(0.2)
    print("capturing", flush=True)
    packets: list[tuple[int, int, int, int, bytes]] = []  # (ns, sport, dport, seq, payload)
    clocks = _WallToMonotonic()
    truncated = 0  # frames longer than the read (the filter passes up to 256 KiB)
    while not stop:
        try:
            data, anc, flags, _ = s.recvmsg(1 << 18, 64)
        except (TimeoutError, InterruptedError):
            clocks.now()  # (a step after the last packet read shows in the history too)
            continue
        truncated += bool(flags & socket.MSG_TRUNC)
        if (pkt := _packet(data, anc, clocks.now())) is not None:
            packets.append(pkt)
    seen, dropped = struct.unpack("II", s.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8))
    s.setblocking(False)
    while True:  # what is still queued (counted by the kernel, not dropped): read it too
        try:
            data, anc, flags, _ = s.recvmsg(1 << 18, 64)
        except BlockingIOError:
            break
        except InterruptedError:
            continue
        truncated += bool(flags & socket.MSG_TRUNC)
        if (pkt := _packet(data, anc, clocks.now())) is not None:
            packets.append(pkt)
    clocks.now(measure=True)  # (and one last: a step after the last packet shows)
    with open(out, "wb") as f:
        pickle.dump(
            {"port": port, "packets": packets, "kernel_seen": seen, "kernel_dropped": dropped,
             "truncated": truncated, "clock": clocks.history},
            f,
        )  # fmt: skip
    return 1 if dropped or truncated else 0


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
            rc = self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise RuntimeError("the packet capture did not stop") from None
        if rc != 0 and exc[0] is None:
            raise RuntimeError(
                f"the packet capture failed (exit {rc}): a packet was lost, or it crashed"
            )


@dataclass
class _Response:
    request_ns: int | None  # the packet that carried its request's first bytes
    first_ns: int | None = None  # the packet that completed its first event with content
    timeline: dict[str, Any] | None = None


@dataclass
class _Side:
    packets: list[tuple[int, int, bytes]] = field(default_factory=list)  # (seq, ns, payload)

    def ordered(self) -> list[tuple[int, bytes]]:
        """(ns, payload) in sequence order, each byte once, from the copy that came first
        (a retransmission adds only what was missing), counted from the first packet to
        arrive (sequence numbers wrap at 2**32); a piece's time is never before an
        earlier piece's (bytes that came early were readable only once the gap before
        them filled); ``ValueError`` at a gap (a packet the capture missed)."""
        if not self.packets:
            return []
        # (any packet within 2**30 of the first to arrive, either side, orders right)
        base = min(self.packets, key=lambda p: p[1])[0] - (1 << 30)
        starts: list[int] = []  # the bytes had so far: disjoint [start, end) ranges, sorted
        ends: list[int] = []
        pieces: list[tuple[int, int, bytes]] = []  # (offset, ns, bytes)
        for ns, seq, payload in sorted((ns, seq, payload) for seq, ns, payload in self.packets):
            lo = (seq - base) % (1 << 32)
            hi = lo + len(payload)
            at = lo
            i = max(0, bisect.bisect_right(starts, lo) - 1)
            while at < hi:  # the parts of [lo, hi) not had yet
                if i < len(starts) and starts[i] <= at:
                    at = max(at, ends[i])
                    i += 1
                    continue
                upto = min(hi, starts[i]) if i < len(starts) else hi
                if upto > at:
                    pieces.append((at, ns, payload[at - lo : upto - lo]))
                    starts.insert(i, at)
                    ends.insert(i, upto)
                    i += 1
                at = upto
        pieces.sort()
        out: list[tuple[int, bytes]] = []
        nxt, latest = pieces[0][0], 0
        for off, ns, piece in pieces:
            if off != nxt:
                raise ValueError("a gap in a captured byte stream")
            latest = max(latest, ns)
            out.append((latest, piece))
            nxt = off + len(piece)
        return out


def _responses(client: list[tuple[int, bytes]], server: list[tuple[int, bytes]]) -> list[_Response]:
    """One connection's responses, in order, each with its request's packet time."""
    import httptools

    from inferlab.openai.response import ResponseError, ResponseReader
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
                except ResponseError:  # (the client records it as failed: it joins nothing)
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
#: The width of the bunch of (request packet - send stamp) gaps that places the run's
#: start: about a write's time, so that another request alike sent within a ms does
#: not fall in it (the right gaps spread 1-10 µs at p50)
_WINDOW_NS = 100_000
#: Records weighed to place the run's start (evenly spaced in send order): at one
#: stream every record pairs with every request alike, n squared gaps
_PLACE_RECORDS = 300
#: How long after its send stamp a request's packet may come and still be its own: a
#: client starved of its core may stamp, then wait for the core to write (12 ms seen
#: with three busy loops beside it). A request alike that comes later is not taken for
#: it: its first token came after the record's stamp of its own
_JOIN_NS = 50_000_000
#: (request, record) pairs with one server timeline weighed to place the run's start
_MAX_PAIRS = 4_000_000
#: How far the wall clock's lead over the monotonic clock may move during a capture
#: (measurement noise: tens of ns here) before ``match`` refuses it: a packet's time on
#: the records' clock would be off by that much, past what the join tolerates
_CLOCK_MOVED_NS = 5_000
#: How far before its packet a stamp may seem to be (the start's placement errs the
#: other way, by a write: µs) before the join is called wrong
_EARLY_MS = 0.02


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
    leads = [lead for _, lead in cap.get("clock", [])]
    if leads and max(leads) - min(leads) > _CLOCK_MOVED_NS:
        raise RuntimeError(
            f"the wall clock moved {(max(leads) - min(leads)) / 1e3:,.1f} µs against the monotonic "
            "clock during the capture (the time was set): its packets cannot be put on the "
            "records' clock to the µs the join needs; capture again"
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
    wanted = sorted(
        (rec for rec in records
         if rec.get("server_timeline") and rec.get("content_ns") and rec.get("send_ns") is not None
         and not rec.get("warmup")),
        key=lambda rec: rec["send_ns"],
    )  # fmt: skip
    # The run's start on the packets' clock: a request's packet follows its record's send
    # stamp by the time its write took, so the right pairs' gaps (packet - stamp) bunch
    # within a few µs, one per record, while wrong ones (the same server timeline on
    # several requests: requests alike, one after another) pair a record with another's
    # request, for fewer records the further off. The start is the smallest gap of the
    # ``_WINDOW_NS`` of gaps that holds the most records (of a sample of them).
    gaps = []
    for i, rec in enumerate(wanted[:: max(1, len(wanted) // _PLACE_RECORDS)]):
        for request, _ in by_key.get(tuple(rec["server_timeline"].get(k) for k in _KEY), []):
            gaps.append((request - rec["send_ns"], i))
        if len(gaps) > _MAX_PAIRS:
            raise RuntimeError("too many requests alike to the server to place the run's start")
    if not gaps:
        raise RuntimeError("no record has a captured response with its server timeline")
    gaps.sort()
    inside: dict[int, int] = defaultdict(int)  # record -> its gaps in the window
    best, best_at, lo = -1, 0, 0
    for g, i in gaps:
        inside[i] += 1
        while gaps[lo][0] < g - _WINDOW_NS:
            j = gaps[lo][1]
            inside[j] -= 1
            if not inside[j]:
                del inside[j]
            lo += 1
        if len(inside) > best:
            best, best_at = len(inside), lo
    t0 = gaps[best_at][0]
    # Each record, in send order, takes the request alike nearest the start's gap (a
    # write may be faster than the sample's fastest: from 100 µs before it) whose first
    # token did not come after the record's stamp of it (a swap with a neighbour whose
    # write stalled would): one response each.
    pairs = []
    used: set[tuple[int, int]] = set()
    early_ns = _EARLY_MS * 1e6
    for rec in wanted:
        alike = by_key.get(tuple(rec["server_timeline"].get(k) for k in _KEY), [])
        near = [
            (abs(request - t0 - rec["send_ns"]), (request, first))
            for request, first in alike
            if (request, first) not in used
            and -_WINDOW_NS <= request - t0 - rec["send_ns"] <= _JOIN_NS
            and rec["content_ns"][0] + t0 - first >= -early_ns
        ]
        if near:
            request, first = min(near)[1]
            used.add((request, first))
            pairs.append((request - rec["send_ns"], rec["content_ns"][0], first, rec))
    if not pairs:
        raise RuntimeError("no record joined a captured response")
    joined = {id(rec) for _, _, _, rec in pairs}
    unjoined = []  # (index, responses alike, the gap nearest the start's, ms), a few
    for rec in wanted:
        if id(rec) not in joined and len(unjoined) < 5:
            alike = by_key.get(tuple(rec["server_timeline"].get(k) for k in _KEY), [])
            gap = min((abs(request - t0 - rec["send_ns"]) for request, _ in alike), default=None)
            unjoined.append((rec["index"], len(alike), None if gap is None else gap / 1e6))
    offsets = sorted(p[0] for p in pairs)
    t0 = offsets[0]  # (the fastest write of all the joined, not only of the sample)
    delays = [(c + t0 - first) / 1e6 for _, c, first, _ in pairs]
    if min(delays) < -_EARLY_MS:  # (a stamp before its bytes came: the join is wrong)
        raise RuntimeError(
            f"a record's first token was stamped {-min(delays):.3f} ms before its packet came"
        )
    # the rest of the error against the simulator's timeline: from its first-token stamp
    # (ms since it received the request) to the packet's arrival (ms since the send)
    before = [
        (first - t0 - rec["send_ns"]) / 1e6 - float(rec["server_timeline"]["first_token_ms"])
        for _, _, first, rec in pairs
        if rec["server_timeline"].get("first_token_ms") is not None
    ]
    return {
        "joined": len(pairs),
        "records": len(wanted),
        "responses": responses,
        "packets": len(cap["packets"]),
        "offset_spread_ms": {
            "p50": (offsets[len(offsets) // 2] - t0) / 1e6,
            "max": (offsets[-1] - t0) / 1e6,
        },
        "unjoined": unjoined,
        "delay_ms": delays,
        "rest_ms": before,
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
    if args.mode == "capture" and (why := available()) is not None:
        print(f"wire_capture: {why}", file=sys.stderr)
        return 2
    try:
        if args.mode == "capture":
            return capture(args.port, args.out)
        lines = (args.run / "requests.jsonl").read_text().splitlines()
        got = match(args.capture, [json.loads(line) for line in lines if line])
    except (OSError, ValueError, RuntimeError) as e:  # (a missing file, a gap, no join)
        print(f"wire_capture: {e}", file=sys.stderr)
        return 1
    d, rest = got.pop("delay_ms"), got.pop("rest_ms")
    print(json.dumps(got))
    print(
        f"client's own delay, ms (its first-token stamp less the packet's arrival): "
        f"p50 {quantile(d, 0.5):.3f} p99 {quantile(d, 0.99):.3f} max {max(d):.3f} "
        f"min {min(d):.3f} mean {statistics.fmean(d):.3f}"
    )
    if rest:
        print(
            f"the rest, ms (the arrival, from the send, less the simulator's TTFT): "
            f"p50 {quantile(rest, 0.5):.3f} p99 {quantile(rest, 0.99):.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    sys.exit(main())
