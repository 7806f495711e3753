"""The event loop the client runs on: uvloop's where it is installed (the ``fast`` extra;
bench/client_cpu.py measures it cheaper per streamed chunk), else asyncio's own.
``loop_name`` says which one a running loop is, for the run's record."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def _uvloop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)``, on uvloop's loop where uvloop is installed."""
    with asyncio.Runner(loop_factory=_uvloop_factory()) as runner:
        return runner.run(main)


def loop_name() -> str:
    """``uvloop`` or ``asyncio``: the loop running now (call from inside it)."""
    return "uvloop" if type(asyncio.get_running_loop()).__module__.startswith("uvloop") else "asyncio"
