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

    @classmethod
    def of(cls, url: str, error: BaseException) -> ServerUnreachableError:
        """"cannot reach URL: why", with what to do where the server's certificate did not
        verify against the system's CAs (a private CA, a self-signed server)."""
        return cls(f"cannot reach {url}: {error}{_TLS_HINT if _certificate_failed(error) else ''}")


#: What to do when a server's TLS certificate does not verify (every client stack takes
#: the system's CAs through OpenSSL, which reads SSL_CERT_FILE).
_TLS_HINT = (" (a server whose certificate a private CA signed, or a self-signed one: point SSL_CERT_FILE "
             "at that CA's certificate, PEM, as curl's --cacert)")


def _certificate_failed(error: BaseException | None) -> bool:
    """Whether ``error``, or one it came from, is a failed TLS certificate check."""
    import ssl

    seen = 0
    while error is not None and seen < 8:
        if isinstance(error, ssl.SSLCertVerificationError):
            return True
        error = error.__cause__ or error.__context__ or getattr(error, "certificate_error", None)
        seen += 1
    return False


class RunFailedError(InferlabError):
    """The run finished but produced nothing usable (e.g. every request failed): exit 1.

    ``summary`` holds the run's summary (``inferlab.results.summary.Summary``, already
    written to disk if asked for); ``result`` the whole result
    (``inferlab.load.run.RunResult``) when the run got that far."""

    def __init__(self, message: str, summary: Any = None, *, result: Any = None) -> None:
        super().__init__(message)
        self.summary = summary
        self.result = result
