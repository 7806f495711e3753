"""Several simulated engines behind one router, in virtual time (``sim run --replicas N
--router POLICY``): the gateway's routing policies (``inferlab.gateway.routing``, the
same code) compared at cluster scale before they are deployed.

Each replica is a ``SimulatedServer`` over an engine of its own (its own KV and prefix
cache). The replicas run in parallel: each steps on its own timeline, and ``step``
returns the step that ends first, so a request sent while a replica is mid-step joins
that replica's next step, as on a real engine. The router sees, per replica, the tokens
(prompt plus output) and requests outstanding, and the prompt's first token ids and
length. ``split-by-length`` takes its long pool as the last replicas.
"""

from __future__ import annotations

import itertools

from inferlab._errors import InferlabError
from inferlab.gateway.routing import LongPool, ids_prefix, make_router
from inferlab.load.policy import Answer, Send
from inferlab.load.virtual import Interrupted, SimulatedServer
from inferlab.results.records import RequestRecord


class Replicas:
    """``servers`` behind the router called ``router`` (``ValueError`` for an unknown
    name, or split settings it does not take: ``make_router``). ``split-by-length``:
    prompts of ``long_prompt_tokens`` or more go to the last ``long_replicas``. Stands
    where one ``SimulatedServer`` would for ``drive`` and ``serve``."""

    def __init__(
        self, servers: list[SimulatedServer], router: str, long_prompt_tokens: int | None = None, long_replicas: int = 1,
    ) -> None:
        self.servers = servers
        n = len(servers)
        self.tokens = [0] * n
        self.requests = [0] * n
        pool = (None if long_prompt_tokens is None
                else LongPool(long_prompt_tokens, frozenset(range(n - long_replicas, n))))
        self.router = make_router(router, self.tokens, self.requests, long_pool=pool)
        self.sent = [0] * n  # requests each replica took
        self._held: dict[int, tuple[int, int]] = {}  # send index → (replica, tokens)
        # each replica's step under way: (end, when its tokens were seen, finished, answers)
        self._pending: list[tuple[float, float, list[int], list[Answer] | None] | None] = [None] * n
        self._free_s = [0.0] * n  # when each replica's current step ends

    @property
    def done(self) -> list[RequestRecord]:
        return list(itertools.chain.from_iterable(s.done for s in self.servers))

    def add(self, send: Send, at_s: float | None = None, replica: int | None = None) -> float | None:
        """Send ``send`` to the replica the router picks, or to ``replica`` (a gateway's
        admission chose it, with this router: ``inferlab.load.admitted``), arriving at
        ``at_s`` if not when it was sent (``SimulatedServer.add``)."""
        ids = self.servers[0].prompt_ids(send.spec)
        i = self.router(range(len(self.servers)), ids_prefix(ids), len(ids)) if replica is None else replica
        self.sent[i] += 1
        end_s = self.servers[i].add(send, at_s)
        if end_s is None:
            held = len(ids) + (send.spec.max_tokens or 0)
            self._held[send.index] = (i, held)
            self.tokens[i] += held
            self.requests[i] += 1
        return end_s

    def has_work(self) -> bool:
        return any(p is not None for p in self._pending) or any(s.has_work() for s in self.servers)

    def step(self, now_s: float) -> tuple[float, float, list[int], list[Answer] | None]:
        for i, server in enumerate(self.servers):
            if self._pending[i] is None and server.has_work():
                start_s = max(self._free_s[i], now_s)
                started = server.step(start_s)
                self._pending[i] = started
                self._free_s[i] = started[0]
        i = min((k for k, p in enumerate(self._pending) if p is not None), key=lambda k: self._free_s[k])
        result = self._pending[i]
        assert result is not None
        self._pending[i] = None
        for index in result[2]:
            replica, held = self._held.pop(index)
            self.tokens[replica] -= held
            self.requests[replica] -= 1
        return result

    def interrupted(self, cause: InferlabError | None = None) -> Interrupted:
        for s in self.servers:
            s.interrupted(cause)
        return Interrupted(sorted(self.done, key=lambda r: r.index), cause)
