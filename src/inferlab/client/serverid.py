"""Which server software a run measured, and its release, as the server says them.

Each engine names itself in ``GET /v1/models`` (a model card's ``owned_by``: ``vllm``,
``sglang``, ``llamacpp``) and its release at a route of its own: vLLM's ``/version``
(``{"version": "0.11.0"}``), SGLang's ``/server_info`` (``/get_server_info`` before
0.5; its ``version`` key), llama.cpp's ``/props`` (``build_info``, ``b6000-1a2b3c4``).
A run records what it found (``config.json``'s ``resolved.server_software``), the
summary names it beside the URL, and ``sim calibrate`` takes the release from it for a
twin of that server.

Only those three are named: another server answers none of this, or answers it for
something else (``inferlab sim serve``'s ``/version`` is inferlab's own release, and
its cards are ``owned_by: inferlab-sim``), and is recorded as unknown (None). Best
effort: nothing here raises, and the probes give up after a few seconds in all.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from typing import Any

#: ``owned_by`` -> the software's name as the summary writes it
_OWNERS = {"vllm": "vLLM", "sglang": "SGLang", "llamacpp": "llama.cpp"}
#: the software's name -> the routes that give its release, in order, and the key
_RELEASE_ROUTES: dict[str, tuple[tuple[str, str], ...]] = {
    "vLLM": (("/version", "version"),),
    "SGLang": (("/server_info", "version"), ("/get_server_info", "version")),
    "llama.cpp": (("/props", "build_info"),),
}
#: ``inferlab`` engine families a software's releases are numbered for (``--engine-version``)
FAMILY_OF_SOFTWARE = {"vLLM": "vllm", "SGLang": "sglang"}
_TIMEOUT_S = 5.0


def software_name(owned_by: object) -> str | None:
    """The software a model card's ``owned_by`` names; None for any other."""
    return _OWNERS.get(owned_by) if isinstance(owned_by, str) else None


async def identify_server(base: str, headers: Mapping[str, str], *, settings: bool = True) -> dict[str, Any] | None:
    """What the server at API root ``base`` (``.../v1``) says it is: ``{"name":
    "vLLM", "version": "0.11.0", "source": "GET /version"}`` (``version`` and ``source``
    None where the release route did not answer), and ``settings``: the engine flags it
    states (``vllm_settings``, ``sglang_settings``, ``llamacpp_settings``; not read
    with ``settings`` False); None for a server that names none of the software above.
    Gives up after ``_TIMEOUT_S`` in all."""
    import aiohttp

    root = base.removesuffix("/")
    host = root.removesuffix("/v1")
    found: dict[str, Any] | None = None
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(_TIMEOUT_S), aiohttp.ClientSession() as session:
            cards = await _get(session, root + "/models", headers)
            data = cards.get("data") if isinstance(cards, dict) else None
            owners = {software_name(c.get("owned_by")) for c in data if isinstance(c, dict)} if isinstance(data, list) else set()
            owners.discard(None)
            if len(owners) != 1:  # (none recognised, or cards of two kinds: a router in front)
                return None
            name = str(owners.pop())
            found = {"name": name, "version": None, "source": None}
            answer: Any = None
            for route, key in _RELEASE_ROUTES[name]:
                answer = await _get(session, host + route, headers)
                version = answer.get(key) if isinstance(answer, dict) else None
                if isinstance(version, str) and version.strip():
                    found.update(version=version.strip(), source=f"GET {route}")
                    break
            flags: dict[str, Any] = {}
            if not settings:
                pass
            elif name == "vLLM":  # (after the release: a large /metrics page must not cost it)
                flags = vllm_settings(await _get(session, host + "/metrics", headers, text=True), data)
            elif name == "SGLang":  # (its server_info is its arguments, beside the release)
                flags = sglang_settings(answer, data)
            elif name == "llama.cpp":  # (its /props, beside the release)
                flags = llamacpp_settings(answer)
            if flags:
                found["settings"] = flags
    return found


#: vLLM's ``vllm:cache_config_info`` labels a twin takes -> (the engine flag's field, a reader)
_CACHE_LABELS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "block_size": ("block_size", int),
    # (the blocks the server had, however it sized them; an override only where it states one)
    "num_gpu_blocks": ("num_gpu_blocks", int),
    "num_gpu_blocks_override": ("num_gpu_blocks_override", int),
    "enable_prefix_caching": ("enable_prefix_caching", lambda v: {"true": True, "false": False}[v.lower()]),
    "cache_dtype": ("kv_cache_dtype", str),
}


def vllm_settings(metrics: str | None, cards: object) -> dict[str, Any]:
    """The engine flags a vLLM server says it runs with, by ``EngineConfig``'s field
    names: from ``/metrics``' ``vllm:cache_config_info`` labels its KV cache (block size,
    the number of blocks it allocated as ``num_gpu_blocks``, however sized, and
    ``num_gpu_blocks_override`` only where it states one, prefix caching, the cache's dtype), and from its
    one model card ``max_model_len``. Only what it states; a label it leaves out, writes
    otherwise (``None``) or states differently for two engine cores (data parallelism)
    is left out here."""
    from inferlab.results.telemetry import parse_prometheus

    out: dict[str, Any] = {}
    samples = parse_prometheus(metrics, only=("vllm:cache_config_info",)).get("vllm:cache_config_info") if metrics else None
    if samples:  # (one per engine core; with data parallelism several: a label they differ on is left out)
        for label, (field, read) in _CACHE_LABELS.items():
            values = {labels.get(label) for labels, _ in samples}
            if len(values) == 1:
                with contextlib.suppress(KeyError, ValueError, TypeError, AttributeError):
                    out[field] = read(values.pop())  # type: ignore[arg-type]
    length = _card_length(cards)
    if length is not None:
        out["max_model_len"] = length
    return out


def _card_length(cards: object) -> int | None:
    """The context length the server's one model card states (``max_model_len``)."""
    if isinstance(cards, list) and len(cards) == 1 and isinstance(cards[0], dict):
        return _count(cards[0], "max_model_len")
    return None


def _count(info: Mapping[str, Any], key: str) -> int | None:
    """``info[key]`` where it is a whole number of at least 1."""
    value = info.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def llamacpp_settings(props: object) -> dict[str, Any]:
    """The engine flags a llama-server says it runs with, by ``EngineConfig``'s field
    names, from its ``/props``: its parallel slots (``total_slots``, its ``-np``) are the
    sequence cap (``max_num_seqs``), and a slot's context
    (``default_generation_settings.n_ctx``: ``-c`` shared by the slots, or all of it with
    a unified KV cache) is the context a request has (``max_model_len``). Its KV cache as
    a whole is not stated: /props does not say whether the slots share it (calibrate
    simulates it as slots x context, the most it can be). Only what it states."""
    if not isinstance(props, dict):
        return {}
    out: dict[str, Any] = {}
    slots = _count(props, "total_slots")
    if slots is not None:
        out["max_num_seqs"] = slots
    generation = props.get("default_generation_settings")
    context = _count(generation, "n_ctx") if isinstance(generation, dict) else None
    if context is not None:
        out["max_model_len"] = context
    return out


def sglang_settings(info: object, cards: object) -> dict[str, Any]:
    """The engine flags an SGLang server says it runs with, by ``EngineConfig``'s field
    names, from its ``/server_info`` (``/get_server_info``): its server arguments as
    resolved at start-up, and its scheduler's KV pool.

    - ``tp_size`` is the tensor-parallel degree;
    - ``disable_radix_cache`` turns prefix caching off;
    - ``disable_overlap_schedule`` turns the overlap scheduler off (``overlap_schedule``);
    - ``disable_cuda_graph`` runs it eagerly (``enforce_eager``);
    - ``enable_mixed_chunk`` mixes decodes with a prefill chunk in a step (``mixed_batches``);
    - ``chunked_prefill_size`` is the batch budget the ``sglang`` family models
      (``max_num_batched_tokens``); -1 turns chunking off;
    - ``max_running_requests`` is the sequence cap (None there: SGLang derives it);
    - ``kv_cache_dtype`` is the cache's dtype;
    - ``max_total_num_tokens`` is the scheduler's token pool, a count of tokens
      (``kv_cache_tokens``, as a simulated run's config.json names its cache's), in pages
      of ``page_size`` tokens (``block_size``; 1 where it has none: releases before
      paging); no block count (vLLM's ``num_gpu_blocks``), which SGLang does not state;
    - ``context_length`` (else its one model card's ``max_model_len``) is the context.

    Nothing for a server of several schedulers (``dp_size`` or ``pp_size`` above 1): each
    has its own pool and queue, and the simulator runs one. Only what it states."""
    if not isinstance(info, dict) or (_count(info, "dp_size") or 1) > 1 or (_count(info, "pp_size") or 1) > 1:
        return {}
    out: dict[str, Any] = {}
    tp = _count(info, "tp_size")
    if tp is not None:
        out["tensor_parallel_size"] = tp
    for key, field, invert in (("disable_radix_cache", "enable_prefix_caching", True),
                               ("disable_overlap_schedule", "overlap_schedule", True),
                               ("disable_cuda_graph", "enforce_eager", False),
                               ("enable_mixed_chunk", "mixed_batches", False)):
        if isinstance(info.get(key), bool):
            out[field] = info[key] != invert
    chunk = info.get("chunked_prefill_size")
    if isinstance(chunk, int) and not isinstance(chunk, bool):
        out.update({"max_num_batched_tokens": chunk} if chunk > 0 else {"enable_chunked_prefill": False})
    seqs = _count(info, "max_running_requests")
    if seqs is not None:
        out["max_num_seqs"] = seqs
    if isinstance(info.get("kv_cache_dtype"), str):
        out["kv_cache_dtype"] = info["kv_cache_dtype"]
    tokens, page = _count(info, "max_total_num_tokens"), _count(info, "page_size") or 1
    if tokens is not None:
        out.update(block_size=page, kv_cache_tokens=tokens)
    length = _count(info, "context_length") or _card_length(cards)
    if length is not None:
        out["max_model_len"] = length
    return out


async def _get(session: Any, url: str, headers: Mapping[str, str], *, text: bool = False) -> Any:
    """``url``'s body when it answers 200, as JSON (``text``: as text), else None; never
    raises."""
    import aiohttp

    with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError, UnicodeDecodeError):
        async with session.get(url, headers=dict(headers)) as resp:
            if resp.status == 200:
                return await resp.text() if text else await resp.json(content_type=None)
    return None
