"""Server-Sent Events, the framing of OpenAI streams: an incremental parser and the
encoder that is its inverse.

``SSEParser`` reads the subset OpenAI-compatible servers use. Feed it bytes as they
arrive, in any split; it returns the ``data`` payload of every event completed so far.
It follows the SSE spec's line rules: ``\\n``, ``\\r\\n`` or ``\\r`` end a line, a blank
line ends an event, ``:`` starts a comment (keep-alive), ``data:`` may or may not be
followed by one space, several ``data`` lines join with ``\\n``. Fields other than
``data`` (``event``, ``id``, ``retry``) are ignored.
"""

from __future__ import annotations

import json
from typing import Any

#: The data of the event that ends an OpenAI stream (it is not JSON).
DONE = "[DONE]"


def encode_event(data: str) -> bytes:
    """One event carrying ``data`` as UTF-8: a ``data: `` line per line of ``data``, then
    the blank line that ends the event. ``SSEParser`` gives ``data`` back, however the
    bytes are split. ``ValueError`` if ``data`` holds a ``\\r``: SSE reads it as a line
    end, so no event can carry it."""
    if "\r" in data:
        raise ValueError("SSE data cannot carry a carriage return")
    if "\n" in data:
        return "".join(f"data: {line}\n" for line in data.split("\n")).encode() + b"\n"
    return b"data: " + data.encode() + b"\n\n"


def encode_json(obj: Any) -> bytes:
    """``obj`` as one event of compact JSON (no spaces after ``,`` and ``:``, non-ASCII
    escaped), as OpenAI-compatible servers stream chunks. ``TypeError`` if ``obj`` is
    not JSON-serialisable."""
    # json.dumps escapes every line break, so the text is always one data line.
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


#: The event that ends an OpenAI stream: ``data: [DONE]``.
DONE_EVENT = encode_event(DONE)


class SSEParser:
    """Bytes in, completed events' ``data`` out; one parser per stream. After a ``feed``,
    ``plain`` says whether its bytes were exactly its events as ``encode_event`` writes
    them (whole events, each one ``data: `` line of valid UTF-8, ``\n`` endings, nothing
    else, nothing left over): a relay may then pass the bytes on as they came. With
    ``keep_comments``, each comment line read (``:`` and what follows, without its line
    end) is appended to ``comments`` (a relay passes keep-alives on)."""

    def __init__(self, keep_comments: bool = False) -> None:
        self._buffer = b""
        self._data: list[str] = []
        self._pending_cr = False
        self.plain = False
        self.comments: list[bytes] | None = [] if keep_comments else None

    @property
    def idle(self) -> bool:
        """Nothing is held from earlier reads: the next read starts an event."""
        return not self._buffer and not self._data and not self._pending_cr

    def feed(self, chunk: bytes) -> list[str]:
        """Consume ``chunk``; return the data of each event it completed, in order."""
        if not self._buffer and not self._data and not self._pending_cr and chunk.endswith(b"\n\n"):
            # The common read: whole events of one ``data: `` line each, ``\n`` endings
            # (one per read from a server streaming token by token). Anything else in
            # it (a comment, a CR, another field, a blank line too many) takes the
            # general path below, from this read's start.
            whole: list[str] = []
            try:
                if chunk.startswith(b"data: ") and chunk.find(b"\n") == len(chunk) - 2 and chunk.find(b"\r") < 0:
                    whole.append(chunk[6:-2].decode("utf-8"))  # (one event: most reads)
                    self.plain = True
                    return whole
                for part in chunk[:-2].split(b"\n\n"):
                    if part[:6] != b"data: " or b"\n" in part or b"\r" in part:
                        break
                    whole.append(part[6:].decode("utf-8"))
                else:
                    self.plain = True
                    return whole
            except UnicodeDecodeError:  # (the general path reads it, with replacement characters)
                pass
        self.plain = False
        if self._pending_cr and chunk.startswith(b"\n"):
            chunk = chunk[1:]  # the \n of a \r\n that was split across reads
        self._pending_cr = False
        buf = self._buffer + chunk
        events: list[str] = []
        start = 0
        n = len(buf)
        cr = buf.find(b"\r")  # the next \r at or after ``start`` (-1: none left)
        while start < n:
            nl = buf.find(b"\n", start)
            if 0 <= cr < start:
                cr = buf.find(b"\r", start)
            if nl < 0 and cr < 0:
                break
            if cr >= 0 and (nl < 0 or cr < nl):
                end = cr
                if cr + 1 < n:
                    step = 2 if buf[cr + 1 : cr + 2] == b"\n" else 1
                else:
                    step = 1
                    self._pending_cr = True
            else:
                end, step = nl, 1
            self._line(buf[start:end], events)
            start = end + step
        self._buffer = buf[start:]
        return events

    def close(self) -> list[str]:
        """End of stream: an event left without its blank line is dispatched too."""
        events: list[str] = []
        if self._buffer:
            self._line(self._buffer, events)
            self._buffer = b""
        self._line(b"", events)
        return events

    def _line(self, raw: bytes, events: list[str]) -> None:
        if not raw:
            if self._data:
                events.append("\n".join(self._data))
                self._data = []
            return
        if raw.startswith(b":"):
            if self.comments is not None:
                self.comments.append(raw)
            return
        name, sep, value = raw.partition(b":")
        if not sep:
            value = b""
        elif value.startswith(b" "):
            value = value[1:]
        if name == b"data":
            self._data.append(value.decode("utf-8", errors="replace"))
