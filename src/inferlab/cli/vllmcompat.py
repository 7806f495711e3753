"""``vllm bench serve``'s command line as ``inferlab bench`` runs it: its ``--backend``,
``--endpoint``, ``--dataset-name random``, ``--random-range-ratio``,
``--random-prefix-len`` and ``--percentile-metrics`` taken where they name something
bench does, refused with the reason where not, and vLLM's defaults (its default
backend's API, its random dataset's lengths) on a line that is vLLM's.

A line is vLLM's when it uses a flag name only ``vllm bench serve`` has (``--num-prompts``,
``--request-rate``, ``--backend``, ...: ``VLLM_NAMES``). vLLM's defaults are those of
vLLM 0.32 (``vllm/benchmarks/serve.py`` and ``datasets/datasets.py``, ``add_cli_args``).
Whatever is mapped is said on stderr.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click

from inferlab._errors import UsageError
from inferlab.workload.lengths import parse_length

#: vLLM's ``--backend`` values bench runs, and the API each sends (vLLM's ASYNC_REQUEST_FUNCS).
BACKEND_APIS = {"vllm": "completions", "openai": "completions", "openai-chat": "chat"}
#: vLLM's ``--endpoint`` paths bench sends to, and their API.
ENDPOINT_APIS = {"/v1/completions": "completions", "/v1/chat/completions": "chat"}
#: vLLM 0.32's defaults: ``--backend``, ``--random-input-len``, ``--random-output-len``.
DEFAULT_BACKEND = "openai"
RANDOM_INPUT_TOKENS = 1024
RANDOM_OUTPUT_TOKENS = 128
#: The metric names ``--percentile-metrics`` takes (vLLM's).
PERCENTILE_METRICS = ("ttft", "tpot", "itl", "e2el", "client_queue_time", "e2el_including_client_queue")

#: Flag names only ``vllm bench serve``'s command line uses (its names for bench's own
#: options, and its options bench has no other name for): one of them makes the line vLLM's.
#: (``--save-result``, ``--goodput``, ``--metric-percentiles`` are bench's own too.)
VLLM_NAMES = frozenset({
    "--backend", "--endpoint", "--dataset-name", "--percentile-metrics", "--base-url", "--request-rate",
    "--num-prompts", "--num-warmups", "--random-input-len", "--random-output-len", "--ignore-eos",
    "--random-range-ratio", "--random-prefix-len",
})

#: Backends vLLM has that bench does not run, and why.
_NOT_RUN = "inferlab measures text generation on the OpenAI completions and chat APIs (--backend vllm, openai or openai-chat)"

#: Workload flags that choose prompts other than vLLM's random dataset.
_OTHER_WORKLOADS = {"dataset": "--dataset", "trace": "--trace", "prompt": "--prompt",
                    "prefix_tokens": "--prefix-tokens", "sessions": "--sessions"}


def _choice(allowed: tuple[str, ...], why: str) -> Callable[[click.Context, click.Parameter, str | None], str | None]:
    def check(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
        if value is not None and value not in allowed:
            raise click.BadParameter(f"{value!r}: {why}")
        return value
    return check


def _metrics(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    names = tuple(dict.fromkeys(v.strip() for v in value.split(",") if v.strip()))
    bad = [n for n in names if n not in PERCENTILE_METRICS]
    if bad or not names:
        raise click.BadParameter(f"{value!r}: expected some of {', '.join(PERCENTILE_METRICS)} separated by commas")
    return names


def _ratio(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    if value is not None and not 0 <= value < 1:
        raise click.BadParameter(f"{value:g}: vLLM takes a ratio from 0 up to (not including) 1")
    return value


def vllm_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """bench's ``--backend``, ``--endpoint``, ``--dataset-name``, ``--random-range-ratio``,
    ``--random-prefix-len`` and ``--percentile-metrics``."""
    opts = [
        click.option("--backend", callback=_choice(tuple(BACKEND_APIS), _NOT_RUN), help="vllm bench serve's: vllm or openai (--api completions), openai-chat (--api chat); other backends are refused."),
        click.option("--endpoint", callback=_choice(tuple(ENDPOINT_APIS), "inferlab sends to /v1/completions or /v1/chat/completions (--api)"), help="vllm bench serve's: /v1/completions or /v1/chat/completions, the API of --backend."),
        click.option("--dataset-name", callback=_choice(("random",), "inferlab has no dataset names but random: --dataset FILE for ShareGPT/JSONL/CSV, --input-tokens empirical:sharegpt for ShareGPT's lengths, --prefix-tokens N --suffix-tokens M for shared prefixes (vLLM's prefix_repetition)"), help=f"vllm bench serve's: random only (its default): synthetic prompts of --random-input-len tokens (default {RANDOM_INPUT_TOKENS}) and --random-output-len (default {RANDOM_OUTPUT_TOKENS}), as vLLM's."),
        click.option("--random-range-ratio", type=float, callback=_ratio, metavar="R", help="vllm bench serve's: R from 0 up to 1; each request's prompt length is drawn from floor(L x (1 - R)) to ceil(L x (1 + R)), L being --random-input-len less the tokenizer's special tokens (taken off with --tokenizer only), and its output length likewise around --random-output-len (at least 1): --input-tokens/--output-tokens uniform:LO:HI, said on stderr. Not SGLang's --random-range-ratio, which draws from len x R to len (give that range as uniform:LO:HI)."),
        click.option("--random-prefix-len", type=click.IntRange(min=0), metavar="N", help="vllm bench serve's: one random prefix of N tokens shared by every request, before each request's own --random-input-len tokens (the range ratio draws those, not the prefix): --prefix-tokens N --suffix-tokens LEN."),
        click.option("--percentile-metrics", callback=_metrics, metavar="M,M,...", help=f"vllm bench serve's: the metrics --save-result's file has statistics for ({', '.join(PERCENTILE_METRICS)}; default: every one); summary.json and the table keep every metric."),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


@dataclass(frozen=True)
class VllmLine:
    """What a ``vllm bench serve`` line resolved to: the API, vLLM's lengths where it
    chose them, and the sentences saying what was mapped (for stderr)."""

    api: str
    input_tokens: str | None
    output_tokens: str | None
    said: tuple[str, ...]
    # vLLM's --random-prefix-len: one shared prefix, the prompt's own tokens after it
    prefix_tokens: int | None = None
    suffix_tokens: str | None = None


def resolve(kw: dict[str, Any], names: frozenset[str], api_given: bool) -> VllmLine:
    """The API and lengths a command line with option values ``kw`` (flag names used:
    ``names``; ``--api`` given or not) runs. ``UsageError`` where the line contradicts
    itself (``--api chat --backend openai``, an ``--endpoint`` of another API than the
    backend's) or ``--dataset-name random`` is given with another workload."""
    said: list[str] = []
    backend, endpoint = kw.get("backend"), kw.get("endpoint")
    api: str = kw["api"]
    vllm_line = bool(names & VLLM_NAMES)
    if backend is not None:
        if api_given and api != BACKEND_APIS[backend]:
            raise UsageError(f"--api {api} and --backend {backend} ({BACKEND_APIS[backend]}): give one")
        api = BACKEND_APIS[backend]
    elif not api_given and vllm_line:
        api = BACKEND_APIS[DEFAULT_BACKEND]
        used = sorted(names & VLLM_NAMES)[0]
        said.append(f"a vllm bench serve line ({used}): --api {api}, as vLLM's default --backend {DEFAULT_BACKEND} "
                    f"(give --api chat or --backend openai-chat for chat)")
    if endpoint is not None and ENDPOINT_APIS[endpoint] != api:
        source = (f"--api {api}" if api_given else f"--backend {backend}" if backend
                  else f"vLLM's default --backend {DEFAULT_BACKEND}")
        raise UsageError(f"--endpoint {endpoint} is the {ENDPOINT_APIS[endpoint]} API, and {source} sends {api}: "
                         f"add --backend {'openai-chat' if ENDPOINT_APIS[endpoint] == 'chat' else 'openai'}")
    if backend is not None:
        said.append(f"--backend {backend}: --api {api} ({'/v1/chat/completions' if api == 'chat' else '/v1/completions'})")
    chosen = kw.get("percentile_metrics")
    if chosen:
        where = "--save-result's file has statistics of these only" if kw.get("save_result") else "no --save-result file to choose them for"
        said.append(f"--percentile-metrics {','.join(chosen)}: {where}; summary.json and the table keep every metric")
    inp, out = kw.get("input_tokens"), kw.get("output_tokens")
    others = [flag for key, flag in _OTHER_WORKLOADS.items() if kw.get(key)]
    if kw.get("dataset_name") == "random" and others:
        raise UsageError(f"--dataset-name random and {others[0]}: give one workload")
    ratio, prefix = kw.get("random_range_ratio"), kw.get("random_prefix_len")
    random_flag = "--random-range-ratio" if ratio is not None else "--random-prefix-len" if prefix is not None else None
    if random_flag and others:
        raise UsageError(f"{random_flag} shapes vLLM's random dataset, and {others[0]} is another workload: give one")
    defaulted = vllm_line and not others and inp is None
    if vllm_line and not others and (inp is None or out is None):
        inp = inp or str(RANDOM_INPUT_TOKENS)
        out = out or str(RANDOM_OUTPUT_TOKENS)
        said.append(f"vLLM's random dataset: {inp} input and {out} output tokens per request "
                    f"(its --random-input-len/--random-output-len defaults where not given)")
    vllms_length = defaulted or "--random-input-len" in names  # (not --input-tokens: inferlab's, the text's own)
    if random_flag or (kw.get("tokenizer") and vllms_length and _fixed(inp) and _fixed(out)):
        return _random_dataset(VllmLine(api, inp, out, tuple(said)), ratio, prefix, kw.get("tokenizer"))
    return VllmLine(api, inp, out, tuple(said))


def _fixed(spec: str | None) -> bool:
    """Whether ``spec`` is one length (N), not a distribution (nor a dataset to read)."""
    return spec is not None and spec.strip().isdigit() and parse_length(spec).kind == "fixed"


def _random_dataset(line: VllmLine, ratio: float | None, prefix: int | None, tokenizer: str | None) -> VllmLine:
    """``line`` with its lengths drawn as vLLM's random dataset draws them: the prompt's
    own tokens from ``floor(L x (1 - R))`` to ``ceil(L x (1 + R))`` (``L``: the input
    length less the tokenizer's special tokens, which the server adds back), the output's
    from ``max(1, floor(O x (1 - R)))`` to ``ceil(O x (1 + R))``, integers drawn
    uniformly with both ends included (numpy's ``integers(low, high + 1)``), as
    ``uniform:LO:HI`` draws them; a ``--random-prefix-len`` prefix of ``P`` tokens,
    shared by every request, before them (a total of ``P`` + the drawn length).

    From ``RandomDataset.sample`` and ``get_sampling_params`` in vLLM's
    ``vllm/benchmarks/datasets/random.py`` (commit 237145ea190a901f93c570f157091fe43835bc63)."""
    flag = "--random-range-ratio" if ratio is not None else "--random-prefix-len"
    r = ratio or 0.0
    for spec, name in ((line.input_tokens, "--random-input-len"), (line.output_tokens, "--random-output-len")):
        if not _fixed(spec):
            raise UsageError(f"{flag} draws around a fixed {name}, and {spec} is a distribution of its own: give "
                             f"{name} N (or the range itself, --input-tokens/--output-tokens uniform:LO:HI, without {flag})")
    assert line.input_tokens is not None and line.output_tokens is not None  # (fixed)
    length, out = int(line.input_tokens), int(line.output_tokens)
    special = _special_tokens(tokenizer)
    real = max(0, length - special)
    in_lo, in_hi = math.floor(real * (1 - r)), math.ceil(real * (1 + r))
    out_lo, out_hi = max(math.floor(out * (1 - r)), 1), max(math.ceil(out * (1 + r)), 1)
    if in_lo < 1:  # (vLLM refuses it without a prefix; inferlab sends no empty prompt part)
        raise UsageError(f"--random-input-len {length} less {special} special tokens, x (1 - {r:g}), is {in_lo} tokens: "
                         "give a longer --random-input-len or a smaller --random-range-ratio")
    if not (r or prefix or special):
        return line  # (vLLM's lengths as given)
    inp, outp = _spec(in_lo, in_hi), _spec(out_lo, out_hi)
    less = f"{length} less {special} special token{'' if special == 1 else 's'}" + (
        "" if tokenizer else " (no --tokenizer: vLLM takes its tokenizer's off, one for a BOS such as Llama's)")
    how = f"floor(L x {1 - r:g}) to ceil(L x {1 + r:g}), both included, " if r else ""
    mapped = f"--input-tokens {inp}"
    if prefix:
        mapped = f"--prefix-tokens {prefix} (one prefix shared by every request) --suffix-tokens {inp}"
    said = (f"vLLM's random dataset{f', --random-range-ratio {r:g}' if r else ''}: {mapped} --output-tokens {outp} "
            f"({how}L = --random-input-len {less}; the output's likewise around {out}, at least 1)")
    if prefix:
        return dataclasses.replace(line, input_tokens=None, output_tokens=outp, said=(*line.said, said),
                                   prefix_tokens=prefix, suffix_tokens=inp)
    return dataclasses.replace(line, input_tokens=inp, output_tokens=outp, said=(*line.said, said))


def _spec(lo: int, hi: int) -> str:
    return str(lo) if lo == hi else f"uniform:{lo}:{hi}"


def _special_tokens(tokenizer: str | None) -> int:
    """The special tokens ``tokenizer`` adds around one sequence (0 without one)."""
    if not tokenizer:
        return 0
    from inferlab.workload.tokenizers import load_tokenizer

    return load_tokenizer(tokenizer).num_special_tokens_to_add()
