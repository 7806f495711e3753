"""aiohttp's server logger, less the tracebacks of the client's mistakes: shared by the
simulated server and the gateway (both aiohttp servers answering a malformed request
with a 400)."""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.log import server_logger


class ClientFaultLogger(logging.Logger):
    """aiohttp's server logger, less the tracebacks of the client's mistakes.

    aiohttp logs a request it cannot parse (bad framing, a bad Content-Length, a broken
    chunk or content encoding) with a traceback at ERROR, as it would a bug. Those are
    the client's fault and answered with a 400: they get one WARNING line here, as
    uvicorn (vLLM's server) gives them. Everything else passes through unchanged."""

    def __init__(self, inner: logging.Logger) -> None:
        super().__init__(inner.name)
        self.parent = inner  # records go to aiohttp's logger: its level, its handlers

    def exception(self, msg: object, *args: object, exc_info: Any = True, **kwargs: Any) -> None:
        if _client_fault(exc_info):
            self.warning("%s: %s", str(msg) % args, _one_line(exc_info))
        else:
            super().exception(msg, *args, exc_info=exc_info, **kwargs)

    def debug(self, msg: object, *args: object, exc_info: Any = None, **kwargs: Any) -> None:
        # (aiohttp logs a first request that is not HTTP at all at DEBUG, traceback included)
        if _client_fault(exc_info):
            super().debug("%s: %s", str(msg) % args, _one_line(exc_info))
        else:
            super().debug(msg, *args, exc_info=exc_info, **kwargs)


def _client_fault(exc: object) -> bool:
    return isinstance(exc, (HttpProcessingError, web.RequestPayloadError))


def _one_line(exc: BaseException) -> str:
    cause = exc.__cause__ or exc
    return f"{type(cause).__name__}: {' '.join(str(cause).split())}"


def quiet_server_logger() -> ClientFaultLogger:
    """aiohttp's own server logger, wrapped."""
    return ClientFaultLogger(server_logger)
