"""inferlab's exception tree. Third-party errors are mapped to these at one boundary.

A failed *request* is never an exception: it is a record with an error kind
(``inferlab.results.records.ErrorKind``). These exceptions are for the run as a whole.
"""

from __future__ import annotations

from typing import Any


class InferlabError(Exception):
    """Base class of every error inferlab raises on purpose."""


class UsageError(InferlabError):
    """The user asked for something that cannot be done (bad flag, bad file): CLI exit 2."""


class ConfigError(UsageError, ValueError):
    """Settings that cannot work together (engine flags vLLM would refuse at start-up, a
    model that does not fit its GPU): a usage error (exit 2), and a ``ValueError`` to
    library callers that check settings by catching that."""


class ServerUnreachableError(InferlabError):
    """The target server could not be reached at all before the run: CLI exit 1."""


class RunFailedError(InferlabError):
    """The run finished but produced nothing usable (e.g. every request failed): exit 1.

    ``summary`` holds the run's summary (``inferlab.results.summary.Summary``, already
    written to disk if asked for); ``result`` the whole result
    (``inferlab.load.run.RunResult``) when the run got that far."""

    def __init__(self, message: str, summary: Any = None, *, result: Any = None) -> None:
        super().__init__(message)
        self.summary = summary
        self.result = result
