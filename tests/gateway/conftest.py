"""The gateway's tests also relay from the client's misbehaving server
(``tests/client/faultserver.py``): one fault server for both, on the path here."""

from __future__ import annotations

import sys
from pathlib import Path

_CLIENT_TESTS = str(Path(__file__).resolve().parents[1] / "client")
if _CLIENT_TESTS not in sys.path:
    sys.path.append(_CLIENT_TESTS)
