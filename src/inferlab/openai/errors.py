"""The OpenAI error body, both ways: ``APIError`` and ``error_body`` for a server that
answers with one, ``error_message`` and ``one_line`` for a client that reads one.

The body is ``{"error": {"message", "type", "param", "code"}}``, ``type`` being the
OpenAI SDK's exception name (``BadRequestError``, ``NotFoundError``, ``RateLimitError``,
``InternalServerError``), which the SDK maps to its own exception classes.
"""

from __future__ import annotations

import json
import re
from typing import Any

from inferlab._errors import InferlabError

#: How much of an unrecognised error object ``error_message`` keeps (characters).
MAX_ERROR_CHARS = 300


def error_body(status: int, message: str, error_type: str, param: str | None = None) -> dict[str, Any]:
    """The JSON object of an error answer with HTTP ``status``; ``param`` names the
    request field at fault, if one is."""
    return {"error": {"message": message, "type": error_type, "param": param, "code": status}}


class APIError(InferlabError):
    """A request the API refuses: raised inside a server's handlers and answered, at one
    boundary, with HTTP ``status`` and ``body()``. ``message`` is what the client reads;
    ``param`` names the request field at fault, if one is."""

    def __init__(
        self, status: int, message: str, error_type: str = "BadRequestError", param: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_type = error_type
        self.param = param

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, self.error_type, self.param)


class SGLangAPIError(APIError):
    """A request SGLang's OpenAI server refuses: its body (``ErrorResponse`` in
    python/sglang/srt/entrypoints/openai/protocol.py) holds the same fields as OpenAI's,
    but at the top level beside ``"object": "error"``, not under ``"error"``.
    ``stream_type``: where not None, a streamed request gets the refusal inside its
    stream (HTTP 200, then ``{"error": body}`` with this ``type``, then ``[DONE]``)."""

    def __init__(self, status: int, message: str, error_type: str = "BadRequestError", param: str | None = None,
                 *, stream_type: str | None = None) -> None:
        super().__init__(status, message, error_type, param)
        self.stream_type = stream_type

    def body(self) -> dict[str, Any]:
        return {"object": "error", **error_body(self.status, self.message, self.error_type, self.param)["error"]}


def error_message(obj: object) -> str:
    """The human message of a parsed error body or stream error event: OpenAI's
    ``error.message``, or what other servers use (``detail``, ``msg``, a bare string).
    An object without one comes back as its JSON, cut to ``MAX_ERROR_CHARS``."""
    if isinstance(obj, dict):
        err = obj.get("error", obj)
        if isinstance(err, dict):
            msg = err.get("message") or err.get("detail") or err.get("msg")
            if msg:
                return str(msg)
        elif isinstance(err, str):
            return err
        for key in ("message", "detail"):
            if obj.get(key):
                return str(obj[key])
    return json.dumps(obj)[:MAX_ERROR_CHARS]


_TAG = re.compile(r"<(script|style)\b.*?</\1>|<[^>]+>", re.S | re.I)


def one_line(text: str, limit: int = 200) -> str:
    """An error body that is not JSON (an HTML page from a proxy, plain text) as one line
    of at most ``limit`` characters: tags dropped, whitespace folded, ``…`` where cut."""
    flat = " ".join(_TAG.sub(" ", text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"
