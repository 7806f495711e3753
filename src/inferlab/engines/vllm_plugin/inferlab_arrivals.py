"""Runs inside vLLM's engine core, never in inferlab: vLLM's own scheduler, unchanged,
that logs when each request reached it counted in engine steps.

vLLM's logs say when a step ran (``--enable-logging-iteration-details``: one
``Iteration(N)`` line per step that scheduled tokens) but not which step first saw a
request: the API server logs "Added request" when it hands one to the engine core, a
process that may be mid-step. The engine core adds requests to the scheduler between
steps; this subclass notes them and, at the next step that schedules tokens, logs

    Arrivals before Iteration(N): ID:PROMPT_TOKENS:MAX_TOKENS ...

with N counted as the ``Iteration(N)`` lines count (steps with no tokens left out).

Used with ``--scheduler-cls inferlab_arrivals.ArrivalLoggingScheduler`` and this folder
on the server's ``PYTHONPATH`` (``inferlab.engines.vllm_steps``). Written for vLLM
0.32's V1 scheduler (synchronous on its CPU build: each step is scheduled after the
previous one ended and after the requests that came in meanwhile were added).
"""

from __future__ import annotations

from typing import Any

# (vLLM is installed in its own environment, not inferlab's: untyped here)
from vllm.logger import init_logger  # type: ignore[import-not-found]
from vllm.v1.core.sched.scheduler import Scheduler  # type: ignore[import-not-found]

logger = init_logger("vllm.inferlab_arrivals")


class ArrivalLoggingScheduler(Scheduler):  # type: ignore[misc]  # (vLLM's class is untyped here)
    """vLLM's ``Scheduler``; logs the requests added before each step with tokens."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._inferlab_iteration = 0
        self._inferlab_added: list[str] = []

    def add_request(self, request: Any) -> None:
        if request.request_id not in self.requests:  # (not a streaming update)
            self._inferlab_added.append(f"{request.request_id}:{request.num_prompt_tokens}:{request.max_tokens}")
        super().add_request(request)

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        out = super().schedule(*args, **kwargs)
        if out.total_num_scheduled_tokens:
            if self._inferlab_added:
                logger.info("Arrivals before Iteration(%d): %s", self._inferlab_iteration, " ".join(self._inferlab_added))
                self._inferlab_added = []
            self._inferlab_iteration += 1
        return out
