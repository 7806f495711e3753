"""``inferlab sim calibrate``: fit the simulator's step-time constants to measured runs
of one server (``sim.validation.twin``)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.table import Table

from inferlab._errors import ConfigError, InferlabError, UsageError
from inferlab.cli.common import OneNamePerSetting, check_output_folder, console, given, run_guarded
from inferlab.cli.sim import (
    RUN_DEFAULTS,
    engine_config,
    engine_options,
    flag_words,
    model_key,
    setting_text,
    take_recorded_engine,
    twin_model,
)
from inferlab.client.serverid import FAMILY_OF_SOFTWARE
from inferlab.results.provenance import simulated_engine
from inferlab.sim.engine.bands import SIZED_WITH
from inferlab.sim.engine.config import BLOCK_SIZES, parse_release, release_local_label
from inferlab.sim.engine.dtypes import KVCacheDType
from inferlab.sim.engine.engine import EngineConfig
from inferlab.sim.engine.families import EngineFamily, family_for_engine

if TYPE_CHECKING:
    from inferlab.sim.validation.twin import MeasuredRun


@click.command("calibrate", cls=OneNamePerSetting)
@engine_options(RUN_DEFAULTS)
@click.argument("runs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--holdout", multiple=True, type=click.Path(exists=True, file_okay=False), help="A run directory predicted, not fitted on (repeatable): the error reported on it is the twin's.")
@click.option("--fit", "fit_names", default=None, metavar="NAME,NAME,...", help="The step-time constants to fit (default: gemm_compute, weight_stream, attention_compute, cpu_step_s, api_overhead_s).")
@click.option("--max-evaluations", type=click.IntRange(min=1), default=400, show_default=True, help="Simulated reruns of the fit set at most (a search stopped by it may not have converged: said, and recorded as converged false).")
@click.option("--allow-failures", is_flag=True, help="Fit (and judge on) runs whose failures bias their numbers: a request that timed out or was cancelled, a run interrupted, or more than 5% of its requests failed (refused without it: their p50s are over the requests that completed). A run with any failed request is said either way.")
@click.option("--allow-unreliable", is_flag=True, help="Fit (and judge on) runs whose summary warns their numbers are off: the client was likely the bottleneck (its own delay in the latencies), or the server served their prompts from a cache an earlier run filled (a cached prompt's TTFT). Refused without it; said either way.")
@click.option("-o", "--out", required=True, type=click.Path(dir_okay=False), help="The efficiencies file to write (for sim run --efficiencies, with the same model and GPU: the family, release, what the server stated and the engine flags calibrate ran with come from the file, where a run's flags do not say otherwise).")
@click.option("--report", type=click.Path(dir_okay=False), help="Also write the fit's report (constants, per-run measured and predicted) as JSON.")
def calibrate_cmd(**kw: Any) -> None:
    """Fit the simulator to measured runs of one server (bench run directories of
    synthetic workloads; not sim run's, which are predictions): its step-time constants,
    for the engine the flags describe, so that it reproduces their TTFT p50, TPOT p50,
    E2E p50 and output tok/s. Reports the error on the fit runs and on --holdout runs
    (each run once: none both fitted and held out); the result is a twin whose numbers
    are predictions. The constants are not individually meaningful (other values can
    fit the runs as well): only the twin's predictions are, as its held-out error says."""
    sys.exit(run_guarded(lambda: _calibrate(kw)))


def _as_the_simulator_ran(kw: dict[str, Any], paths: list[str], fitted: tuple[str, ...], err: Console) -> bool:
    """Runs of ``bench`` against inferlab's simulated server (``sim serve``) record the
    engine it ran (``config.json``'s ``resolved.engine``): calibrate the twin of that engine, its model,
    card and flags (eager mode, context length, ...), each where no flag gives another,
    said on stderr; but not the constants fitted (``fitted``) or an efficiencies file.
    ``UsageError`` for runs of different simulated engines, or some of one and some of
    another server: a twin is of one. Whether the runs were of the simulated server (their
    numbers are predictions too)."""
    engines = []
    for path in paths:
        try:
            config = json.loads((Path(path) / "config.json").read_text())
        except (OSError, ValueError):
            config = {}
        # (a sim run's directory, the simulator's own prediction, is refused before: _measurements)
        engines.append(simulated_engine(config) if config.get("command") != "sim run" else None)
    recorded = [e for e in engines if e is not None]
    if not recorded:
        return False
    if len(recorded) < len(engines):
        raise UsageError("some runs were measured on inferlab's simulated server and some on another: a twin is of one server")
    if any(e != recorded[0] for e in recorded[1:]):
        raise UsageError("the runs were measured on simulated servers with different engines: a twin is of one server")
    taken = take_recorded_engine(kw, recorded[0], keep=(*fitted, "efficiencies_path"))
    shown = [flag_words(k, kw[k]) for k in _SHOWN_AS_RAN if k in taken and kw[k] is not None]
    model, gpu = recorded[0].get("model"), recorded[0].get("gpu_preset", recorded[0].get("gpu"))
    err.print(f"inferlab sim calibrate: the runs' server was inferlab's simulated engine ({model} on "
              f"{gpu}): calibrating the engine it ran, every flag as it "
              f"ran ({', '.join(shown)}, ...; flags given here win)", highlight=False)
    for key, ran in (("model", model), ("gpu", gpu)):
        if given(key) and ran and not _same(key, str(kw[key]), str(ran)):
            err.print(f"inferlab sim calibrate: the runs' server ran {key} {ran}; calibrating --{key} {kw[key]} as given: "
                      "the twin is of another server than the runs measured", highlight=False)
    return True


def _same(key: str, a: str, b: str) -> bool:
    """Whether ``a`` and ``b`` name one model (``key`` "model") or one GPU ("gpu"): the
    same preset or spec, or, for names the simulator does not know, the same name (a
    model's by its last path part: a server may load it from a local folder)."""
    from inferlab.sim.engine.hardware import resolve_gpu, resolve_model

    if model_key(a) == model_key(b):
        return True
    try:
        return (resolve_model(a).name == resolve_model(b).name if key == "model"
                else resolve_gpu(a).name == resolve_gpu(b).name)
    except UsageError:
        return False


def _measurements(fit_runs: list[MeasuredRun], holdout: list[MeasuredRun], allow_failures: bool, err: Console,
                  allow_unreliable: bool = False) -> None:
    """``UsageError`` for runs that are no measurement of one server to fit on or judge
    by: a ``sim run``'s (the simulator's prediction); a run given twice, or both fitted
    on and held out (by path, or as the same records under another: in-sample error
    would be reported as held-out); runs of different models (by name, the path aside:
    a twin is of one model); a run whose failures bias its numbers (``twin.failures``),
    unless ``allow_failures``; a run its summary warns is off (``twin.unreliable``: a
    client bottleneck, prompts served from a cache another run filled), unless
    ``allow_unreliable``. Said on stderr: every run with failed requests, or unreliable,
    a metric of a run left out of the fit and why, and runs at different URLs (one
    server restarted on another port, or reached by another name, is still one: not
    refused)."""
    from inferlab.sim.validation.twin import failures

    runs = [*fit_runs, *holdout]
    for r in runs:
        if r.predicted:
            raise UsageError(f"{r.path}: a sim run directory, the simulator's prediction, not a measurement: calibrate "
                             "fits runs measured on a server (bench)")
    seen: dict[object, tuple[str, bool]] = {}
    for held, group in ((False, fit_runs), (True, holdout)):
        for r in group:
            for key, how in ((Path(r.path).resolve(), "are one directory"),
                             (r.digest, "hold the same run (identical requests.jsonl)")):
                if key is None:
                    continue
                if key not in seen:
                    seen[key] = (r.path, held)
                    continue
                other, other_held = seen[key]
                if other_held != held:
                    raise UsageError(f"{other} and {r.path} {how}, fitted on and held out: a held-out run's error is the "
                                     "twin's only where the fit never saw it; give each run once")
                raise UsageError(f"{other} and {r.path} {how}, given twice {'as --holdout' if held else 'to fit on'}: "
                                 "it would count twice; give each run once")
    names = sorted({r.model for r in runs if r.model})
    if len({model_key(n) for n in names}) > 1:
        raise UsageError(f"the runs were measured on servers of different models ({', '.join(names)}): a twin is of "
                         "one server and model; calibrate each apart")
    urls = sorted({r.url for r in runs if r.url})
    if len(urls) > 1:
        err.print(f"inferlab sim calibrate: the runs were measured at different URLs ({', '.join(urls)}): calibrated "
                  "as one server (one restarted on another port, or reached by another name); calibrate each apart "
                  "if they were not", highlight=False)
    biased = []
    for r in runs:
        text, bias = failures(r)
        if text is None:
            continue
        if bias and not allow_failures:  # (refused below)
            biased.append(f"{r.path}: {text}")
            continue
        err.print(f"inferlab sim calibrate: {r.path}: {text}: its p50s and tok/s are over the requests that completed"
                  + (" (taken anyway, --allow-failures)" if bias else ""), highlight=False)
    if biased:
        raise UsageError(f"{'; '.join(biased)}: failures that bias a run's numbers (a request timed out or was "
                         "cancelled, the run was interrupted, or over 5% failed: its p50s leave out the requests that "
                         "did not complete); rerun it, fit without it, or give --allow-failures to fit it anyway")
    off = [f"{r.path}: {'; '.join(r.unreliable)}" for r in runs if r.unreliable]
    if off and not allow_unreliable:
        raise UsageError(f"{'; '.join(off)}: its summary warns its numbers are off, and a twin fitted or judged on "
                         "them would be too; rerun it (the client a core of its own, fresh prompts: another --seed), "
                         "fit without it, or give --allow-unreliable to fit it anyway")
    for text in off:
        err.print(f"inferlab sim calibrate: {text} (taken anyway, --allow-unreliable)", highlight=False)
    labels = {"ttft_p50_ms": "TTFT p50", "tpot_p50_ms": "TPOT p50", "e2e_p50_ms": "E2E p50", "output_tok_s": "out tok/s"}
    for r in runs:
        for metric, why in r.left_out.items():
            err.print(f"inferlab sim calibrate: {r.path}: its {labels.get(metric, metric)} is left out of the fit and "
                      f"its error: {why}", highlight=False)


def _served_model(runs: list[MeasuredRun]) -> str | None:
    """The model name the runs' server served them under (``MeasuredRun.model``; one
    model, ``_measurements`` checked: the name most runs recorded, a folder's path and
    its model's name being one), which the twin records; None where none recorded one."""
    names = Counter(r.model for r in runs if r.model)
    return names.most_common(1)[0][0] if names else None


def _model_and_gpu(kw: dict[str, Any], runs: list[MeasuredRun], err: Console) -> None:
    """Runs of a server that is not inferlab's simulated one: say where the model
    calibrated is not the one the runs' server served (the default, or one given), and
    that the GPU is the default where none is given (no server states its device)."""
    from inferlab.sim.engine.hardware import resolve_model

    def say(text: str) -> None:
        err.print(f"inferlab sim calibrate: {text}", highlight=False)

    served = next((r.model for r in runs if r.model), None)
    if served is not None and not _same("model", str(kw["model"]), served):
        if given("model"):
            say(f"the runs' server served {served}; calibrating --model {kw['model']} as given: the twin is of that "
                "model (check it is the one served)")
        else:
            try:
                resolve_model(served)
                hint = f"give --model {served}"
            except UsageError:
                hint = "give --model: a preset, or the served model's config.json"
            say(f"the runs' server served {served}, but no --model was given: calibrating the simulator's default "
                f"model, {kw['model']} ({hint})")
    if not given("gpu"):
        say(f"the runs do not say the server's GPU: calibrating on the default --gpu {kw['gpu']} (give --gpu)")


#: Constants a fit cannot tell from the others without fit runs of more than one prompt
#: length (what grows with the context) or more than one load (what a batch shares, and
#: what each sequence in it costs)
_NEED_LENGTHS = ("attention_compute", "kv_stream")
_NEED_LOADS = ("weight_stream", "cpu_step_s", "cpu_step_eager_s", "decode_compute", "per_seq_s", "sampler_s",
               "api_per_seq_s")


def _underdetermined(fit_runs: list[MeasuredRun], names: tuple[str, ...], say: Callable[[str], None]) -> None:
    """Say where the fit runs cannot determine the constants fitted: fewer measured values
    than constants, or no variation in what a constant needs (``_NEED_LENGTHS``,
    ``_NEED_LOADS``)."""
    values = sum(len(r.measured) for r in fit_runs)
    if values < len(names):
        say(f"{len(names)} constants fitted to {values} measured values ({len(fit_runs)} run(s)): more unknowns than "
            "numbers, so many sets of constants match them alike and the error on the fit runs says nothing; add fit "
            "runs (other prompt lengths and users), hold runs out, or fit fewer constants (--fit)")
    if len(fit_runs) < 1:
        return
    lengths = {(w.input_tokens, w.prefix_tokens, w.suffix_tokens, w.system_tokens, w.sessions, w.turns)
               for w in (r.config.workload for r in fit_runs)}
    need = [n for n in names if n in _NEED_LENGTHS]
    if len(lengths) == 1 and need:
        say(f"every fit run has the same prompts (--input-tokens {fit_runs[0].config.workload.input_tokens}): "
            f"{', '.join(need)} (what grows with the context) cannot be told from the other constants; add fit runs "
            "of other prompt lengths")
    loads = {repr(r.config.load.schedule) for r in fit_runs}
    need = [n for n in names if n in _NEED_LOADS]
    if len(loads) == 1 and need:
        say(f"every fit run ran the same load ({_load_words(fit_runs[0])}): {', '.join(need)} (what a batch shares, "
            "and what each sequence in it costs) cannot be told apart; add a fit run at another concurrency (one user "
            "alone cannot tell what a batch shares)")


def _load_words(run: MeasuredRun) -> str:
    from inferlab.results.loaddiff import schedule_text

    schedule = run.config.load.schedule
    return schedule_text({"kind": type(schedule).__name__, **dataclasses.asdict(schedule)})


#: The recorded flags ``_as_the_simulator_ran`` names (it takes them all)
_SHOWN_AS_RAN = ("engine_family", "tensor_parallel_size", "quantization", "max_model_len", "max_num_batched_tokens",
                 "max_num_seqs", "enforce_eager")


def _as_the_server_said(kw: dict[str, Any], runs: list[MeasuredRun], err: Console) -> dict[str, Any]:
    """What the runs' server said it is (``bench`` records it: ``client.serverid``), where
    no flag says otherwise, each said on stderr:

    - vLLM or SGLang: the family that models that release (vLLM before 0.8 is ``vllm-v0``)
      and the release (``--engine-version``), so the twin runs its defaults; vLLM's CPU
      build (a ``+cpu`` release) without async scheduling, which it does not run;
    - llama.cpp: no async scheduling (it computes a batch, then schedules the next);
    - the settings it states (``client.serverid``: vLLM's KV cache's block size, blocks,
      dtype and prefix caching and its context length; SGLang's arguments and KV pool;
      llama.cpp's slots and a slot's context), returned (the twin records them, and runs
      of it take them).

    A flag given wins, with a word where it contradicts the server. ``UsageError`` for
    runs of different servers or releases: a twin is of one."""
    said = [r.software for r in runs if r.software]
    if not said:
        return {}
    names = sorted({str(s.get("name")) for s in said})
    if len(names) > 1:
        raise UsageError(f"the runs were measured on different servers ({', '.join(names)}): a twin is of one server")
    name, of = names[0], (f"{len(said)} of {len(runs)} runs'" if len(said) < len(runs) else "the runs'")

    def say(text: str) -> None:
        err.print(f"inferlab sim calibrate: {text}", highlight=False)

    def no_overlap(why: str) -> None:
        if not given("overlap_schedule") and EngineFamily.parse(str(kw["engine_family"])).rules.overlap_schedule:
            kw["overlap_schedule"] = False
            say(f"{why}: calibrating without async scheduling (give --async-scheduling to say otherwise)")

    if name == "llama.cpp":
        no_overlap(f"{of} server is llama.cpp, which schedules no step ahead")
        taken = _served_settings(kw, name, said, say)
        _slots_pool(kw, taken, said, say)
        return taken
    if name not in FAMILY_OF_SOFTWARE:
        return {}
    _as_the_release_said(kw, name, said, of, say, no_overlap)
    return _served_settings(kw, name, said, say)


def _slots_pool(kw: dict[str, Any], taken: dict[str, Any], said: list[dict[str, Any]], say: Callable[[str], None]) -> None:
    """A llama-server's KV cache, from its slots: each of the ``max_num_seqs`` slots it
    states holds up to the ``max_model_len`` it states, so its cache holds at most their
    product (all of ``-c`` without ``--kv-unified``, where /props states a slot's share of
    it; fewer where the slots share one cache), whatever flags say of the twin's context
    or cap (a what-if on the same server). /props states no pool, so calibrate would
    otherwise size one from the device's memory, millions of tokens on a CPU. Put in
    ``kw`` and ``taken`` where every run stated both alike and no flag sizes the cache."""
    def stated(key: str) -> Any:
        values = {s["settings"].get(key) for s in said if isinstance(s.get("settings"), dict)}
        return values.pop() if len(values) == 1 else None

    slots, context = stated("max_num_seqs"), stated("max_model_len")
    if not slots or not context or any(given(k) for k in ("num_gpu_blocks_override", "gpu_memory_utilization")):
        return
    size = int(kw.get("block_size") or EngineConfig().block_size)
    tokens = int(slots) * int(context)
    null = 1 if EngineFamily.parse(str(kw["engine_family"])).rules.null_block else 0
    blocks = -(-tokens // size) + null
    kw["num_gpu_blocks_override"] = taken["num_gpu_blocks_override"] = blocks
    taken["block_size"] = size
    say(f"llama.cpp keeps a request in one of its {slots} slots of {context:,} tokens: the KV cache is simulated "
        f"as {tokens:,} tokens ({slots} x {context:,}; fewer where its slots share one cache, --kv-unified), "
        "not sized from memory")


#: The families whose KV block count means what a server's own count does (vLLM's, its
#: null block included; SGLang's token pool in its pages)
_COUNTED_AS = {
    "vLLM": (EngineFamily.VLLM, EngineFamily.VLLM_V0, EngineFamily.VLLM_V05),
    "SGLang": (EngineFamily.SGLANG,),
}
#: What a server states that means something else in another family than its own: SGLang's
#: chunked prefill size is the ``sglang`` family's batch budget, its overlap scheduler
#: that family's; and a server's KV pool is counted its own way (``_COUNTED_AS``)
_OWN_FAMILY_ONLY = {"SGLang": ("max_num_batched_tokens", "enable_chunked_prefill", "overlap_schedule", "mixed_batches")}
#: Flags by which calibrate's engine would hold another pool than the server's: its
#: tensor-parallel degree (another share of each GPU), what sizes a cache (``SIZED_WITH``:
#: budget, sequence cap and CUDA graphs for the activation reserve, block size, memory
#: share, which no server states: given at all, it sizes the cache) and its dtype
_SIZES_THE_POOL = ("tensor_parallel_size", *SIZED_WITH, "kv_cache_dtype")


def _served_settings(kw: dict[str, Any], name: str, said: list[dict[str, Any]], say: Callable[[str], None]) -> dict[str, Any]:
    """The engine flags the runs' server (``name``) stated (each run's ``settings``),
    where no flag gives another value and every run that stated one stated the same;
    put in ``kw`` and said, and a flag given that contradicts one said too. Its overlap
    (async) scheduling goes with the release (``served_by`` records it), not with these.

    Its KV pool (``num_gpu_blocks_override``) is taken only by the families that count
    it as that server does, and not where a flag given sizes the cache otherwise (a
    memory share, or another value than the server's of ``_SIZES_THE_POOL``); taken, it
    goes with the block size it is counted in. A pool paged a token at a time (SGLang's
    default: slow to simulate) or in pages the simulator does not take is simulated in
    blocks of the run's block size, the same tokens; what the fit took (``server_settings``)
    then holds that block size and count. What means otherwise in another family than
    the server's own (``_OWN_FAMILY_ONLY``) is not taken for another family."""
    stated = [_pool_as_flag(s["settings"]) for s in said if isinstance(s.get("settings"), dict)]
    if not stated:
        return {}
    had = any(_had(s["settings"]) for s in said if isinstance(s.get("settings"), dict))
    agreed: dict[str, Any] = {}  # (a cache dtype by its canonical name)
    differ: list[str] = []
    for key in sorted(set().union(*stated)):
        values = [st.get(key) for st in stated]
        if any(v != values[0] for v in values):
            differ.append(key)
        elif key != "kv_cache_dtype":
            agreed[key] = values[0]
        else:
            with contextlib.suppress(UsageError):  # (a dtype inferlab does not know: not taken)
                agreed[key] = KVCacheDType.parse(str(values[0])).value
    def words(key: str) -> str:  # (a pool the server had is no override it was given)
        return "its KV pool" if had and key == "num_gpu_blocks_override" else flag_words(key)

    family = EngineFamily.parse(str(kw["engine_family"]))
    if family not in _COUNTED_AS.get(name, ()):
        other = [k for k in ("num_gpu_blocks_override", *_OWN_FAMILY_ONLY.get(name, ())) if k in agreed]
        if other:
            say(f"calibrating as the {family} family, not {name}'s: what the runs' server states of "
                f"{', '.join(map(words, other))} is {name}'s, not taken")
            for key in other:
                del agreed[key]
    size, page = int(kw.get("block_size") or EngineConfig().block_size), agreed.get("block_size")
    converted: dict[str, Any] = {}
    pool, paged = "", ""  # (the server's pool as it stated it; its conversion, said where taken)
    if isinstance(page, int) and (page == 1 or page not in BLOCK_SIZES) and page != size:
        del agreed["block_size"]
        if "num_gpu_blocks_override" in agreed and not given("num_gpu_blocks_override"):  # (the same tokens)
            tokens = agreed.pop("num_gpu_blocks_override") * page
            converted = {"block_size": size, "num_gpu_blocks_override": tokens // size}
            pool = f"{tokens:,}-token pool"
            paged = (f"the runs' server pages its KV cache {'a token' if page == 1 else f'{page} tokens'} at a time: "
                     f"its {tokens:,} tokens are simulated as {tokens // size:,} blocks of {size}")
    contradicted = [k for k in agreed if k != "num_gpu_blocks_override" and given(k) and setting_text(k, kw.get(k)) != setting_text(k, agreed[k])]
    if contradicted:
        say(f"the runs' server states {', '.join(flag_words(k, agreed[k]) for k in contradicted)}: calibrating with "
            "the flags given instead")
    overlap = agreed.pop("overlap_schedule", None)
    if overlap is not None and not given("overlap_schedule"):
        kw["overlap_schedule"] = overlap
        say(f"{'with' if overlap else 'without'} overlap scheduling, as the runs' server states (give "
            f"--{'no-' if overlap else ''}overlap-schedule to say otherwise)")
    taken = {k: v for k, v in agreed.items() if not given(k)}
    blocks = taken.pop("num_gpu_blocks_override", None) or converted.get("num_gpu_blocks_override")
    if blocks is not None:
        sized = [flag_words(k) for k in _SIZES_THE_POOL if k in contradicted]
        sized += [flag_words("gpu_memory_utilization")] if given("gpu_memory_utilization") else []
        if sized:
            say(f"{', '.join(sized)} given: the KV cache is sized from the flags, not from the "
                f"{pool or f'{blocks} blocks'} the runs' server states")
            converted = {}
        elif converted:
            say(paged)
        else:  # (with the block size they are counted in, given or not)
            taken.update(num_gpu_blocks_override=blocks, block_size=int(agreed.get("block_size", size)))
    shown = {k: v for k, v in taken.items() if not (had and k == "num_gpu_blocks_override")}
    if shown:
        say(f"as the runs' server states its engine: {', '.join(flag_words(k, v) for k, v in shown.items())} "
            "(unless flags say otherwise)")
    if had and "num_gpu_blocks_override" in taken:  # (its blocks, however it sized them: no override it gave)
        blocks, page = taken["num_gpu_blocks_override"], taken["block_size"]
        say(f"its KV cache as the runs' server had it: {blocks:,} blocks of {page} tokens ({blocks * page:,} tokens), "
            f"simulated with --num-gpu-blocks-override {blocks}, not sized from the simulated GPU's memory")
    taken.update(converted)
    for key, value in taken.items():
        kw[key] = KVCacheDType.parse(value) if key == "kv_cache_dtype" else value
    if differ:
        say(f"the runs' server stated {', '.join(map(words, differ))} differently from run to run: "
            "not taken (a twin is of one server; give the flags)")
    return taken


#: The settings of the config inferlab started a server from (``engines.launch.EngineSpec``)
#: that are the simulated engine's flags of the same name
_STARTED_WITH = ("tensor_parallel_size", "max_model_len", "max_num_batched_tokens", "max_num_seqs",
                 "enable_prefix_caching", "enforce_eager")
#: What sizes a batch: said where neither the server nor the config it was started from gave it
_BATCH_SIZES = ("max_num_batched_tokens", "max_num_seqs")


def _as_the_engine_was_started(kw: dict[str, Any], runs: list[MeasuredRun], stated: dict[str, Any],
                               err: Console) -> set[str]:
    """The engine flags of the config inferlab started the runs' server from (``bench
    --engine``, a sweep's setting: ``MeasuredRun.engine_config``), put in ``kw`` where no
    flag gives another value, the server states none (``stated``: what it states wins)
    and every run started from one had the same; each said on stderr with where it came
    from, and a flag given that contradicts one. The keys known so (taken or given)."""
    def say(text: str) -> None:
        err.print(f"inferlab sim calibrate: {text}", highlight=False)

    started = [r.engine_config for r in runs if r.engine_config and r.engine_config.get("engine") != "sim"]
    if not started:
        return set()
    of = f"{len(started)} of {len(runs)} runs'" if len(started) < len(runs) else "the runs'"
    taken: dict[str, Any] = {}
    contradicted: list[str] = []
    differ: list[str] = []
    for key in _STARTED_WITH:
        values = {json.dumps(c.get(key)) for c in started}
        value = started[0].get(key)
        if len(values) > 1:
            differ.append(key)
        elif value is None or key in stated:
            continue
        elif given(key):
            if setting_text(key, kw[key]) != setting_text(key, value):
                contradicted.append(key)
        else:
            taken[key] = kw[key] = value
    if taken:
        say(f"as inferlab started {of} server (config.json's engine_config, from --engine): "
            f"{', '.join(flag_words(k, v) for k, v in taken.items())} (unless flags or the server say otherwise)")
    if contradicted:
        say(f"{of} server was started with {', '.join(flag_words(k, started[0][k]) for k in contradicted)}: "
            "calibrating with the flags given instead")
    if differ:
        say(f"{of} server was started with {', '.join(map(flag_words, differ))} differently from run to run: "
            "not taken (a twin is of one server; give the flags)")
    return set(taken) | {k for k in _STARTED_WITH if given(k)}


def _batch_defaults(engine: EngineConfig, known: set[str], say: Callable[[str], None]) -> None:
    """Say where the batch budget and sequence cap are the simulator's defaults: known
    neither from a flag nor from the runs (what their server states, the config it was
    started from): the twin's batches may be other than its server's."""
    from inferlab.sim.engine.config import resolve
    from inferlab.sim.engine.sizing import size_engine

    left = [k for k in _BATCH_SIZES if k not in known and getattr(engine, k) is None]
    if not left:
        return
    try:
        sizes = size_engine(resolve(engine))
    except (InferlabError, ValueError, TypeError):  # (the fit says why the engine cannot run)
        return
    say(f"the runs do not say the server's {' or '.join(map(flag_words, left))}: left at the simulator's defaults "
        f"({', '.join(flag_words(k, f'{getattr(sizes, k):,}') for k in left)}; give {'them' if len(left) > 1 else 'it'} as the server ran, "
        "or its batches may not be the twin's)")


def _pool_as_flag(settings: dict[str, Any]) -> dict[str, Any]:
    """A server's stated settings with its KV pool as the simulated engine's flag that
    holds a pool of that many blocks (``num_gpu_blocks_override``): vLLM's blocks it had
    (``num_gpu_blocks``, however it sized them; an override it stated is the same count),
    SGLang's token pool (``kv_cache_tokens``) in its pages (``block_size``, else a token
    each). A run recorded before SGLang's pool was counted in tokens states its pages as
    ``num_gpu_blocks_override``: the same count."""
    out = {k: v for k, v in settings.items() if k not in ("num_gpu_blocks", "kv_cache_tokens")}
    if isinstance(settings.get("num_gpu_blocks"), int):
        out["num_gpu_blocks_override"] = settings["num_gpu_blocks"]
    tokens, page = settings.get("kv_cache_tokens"), settings.get("block_size")
    if isinstance(tokens, int):
        out["num_gpu_blocks_override"] = tokens // (page if isinstance(page, int) and page >= 1 else 1)
    return out


def _had(settings: dict[str, Any]) -> bool:
    """Whether a server stated the KV pool it had, however it sized it (vLLM's
    ``num_gpu_blocks``, SGLang's ``kv_cache_tokens``), not an override it was given."""
    return "num_gpu_blocks" in settings or "kv_cache_tokens" in settings


def _as_the_release_said(
    kw: dict[str, Any], name: str, said: list[dict[str, Any]], of: str, say: Callable[[str], None],
    no_overlap: Callable[[str], None],
) -> None:
    """The family and release the runs' server said (``_as_the_server_said``)."""
    texts = sorted({str(s["version"]) for s in said if s.get("version")})
    releases: dict[tuple[int, int], str] = {}
    for t in texts:
        try:
            releases.setdefault(parse_release(t), t)
        except ConfigError:
            belongs = family_for_engine(FAMILY_OF_SOFTWARE[name], None)
            if not given("engine_family") and belongs is not EngineFamily.parse(str(kw["engine_family"])):
                kw["engine_family"] = belongs
                say(f"the {belongs} family, as {of} server said {name} (give --engine-family to say otherwise)")
            say(f"{of} server said {name} {t}, which is not a release inferlab can read: calibrating as a "
                "current release (give --engine-version to say which)")
            return
    if len(releases) > 1:
        raise UsageError(f"the runs were measured on different releases of {name} ({', '.join(texts)}): "
                         "a twin is of one; calibrate each apart, or say which with --engine-version")
    release, text = next(iter(releases.items())) if releases else (None, None)
    server = f"{name} {text}" if text else name
    belongs = family_for_engine(FAMILY_OF_SOFTWARE[name], release)
    stated = EngineFamily.parse(str(kw["engine_family"]))
    if belongs is not stated:
        if given("engine_family"):
            say(f"{of} server said {server}, which the {belongs} family models; calibrating as the {stated} "
                "family, as --engine-family says, at its current release")
            return
        kw["engine_family"] = stated = belongs
        say(f"the {belongs} family, as {of} server said {server} (give --engine-family to say otherwise)")
    if given("engine_version"):
        if release is not None and release != parse_release(str(kw["engine_version"])):
            say(f"{of} server said {server}; calibrating as release {kw['engine_version']}, as --engine-version says")
        return
    if text is None:
        say(f"{of} server said {name} but not its release: calibrating as a current release "
            "(give --engine-version to say which)")
        return
    if not stated.rules.release_dated:
        return
    kw["engine_version"] = text
    say(f"release {text}, as {of} server said ({said[0].get('source')}); give --engine-version to say otherwise")
    if stated is not EngineFamily.VLLM:
        return
    if "cpu" in release_local_label(text).split("."):
        no_overlap(f"{server} is vLLM's CPU build, which keeps async scheduling off")
    elif not given("overlap_schedule") and stated.rules.overlap_schedule_in(release):
        # (a build that does not say "+cpu" cannot be told from a GPU one by its /version)
        say("it schedules ahead as that release does on a GPU; vLLM's CPU backend does not: "
            "add --no-async-scheduling for a twin of one")


def _calibrate(kw: dict[str, Any]) -> int:
    from inferlab.report.sweep import COLUMNS
    from inferlab.sim.validation.twin import (
        DEFAULT_FIT,
        METRICS,
        at_bounds,
        calibrate,
        loads_of,
        median_abs_error,
        read_run,
        write_efficiencies,
    )

    names = DEFAULT_FIT if kw["fit_names"] is None else tuple(n.strip() for n in kw["fit_names"].split(",") if n.strip())
    if not names:
        raise UsageError("--fit names no constant")
    if kw["api_overhead_s"] is not None and "api_overhead_s" in names:
        raise UsageError("--api-latency-ms sets api_overhead_s, which --fit would fit: drop one of them")
    for path in (kw["out"], kw["report"]):  # (before the fit, which takes a while)
        if path:
            check_output_folder(Path(path))
    fit_runs = [read_run(p) for p in kw["runs"]]
    holdout = [read_run(p) for p in kw["holdout"]]
    err = console(stderr=True)
    _measurements(fit_runs, holdout, kw["allow_failures"], err, kw["allow_unreliable"])
    served = _served_model(fit_runs + holdout)
    twin_model(kw, served, "the runs were")  # (a twin's constants to start from: of which model, said)
    simulated = _as_the_simulator_ran(kw, [*kw["runs"], *kw["holdout"]], names, err)
    stated = _as_the_server_said(kw, fit_runs + holdout, err)
    if not simulated:
        known = _as_the_engine_was_started(kw, fit_runs + holdout, stated, err) | set(stated)
        _model_and_gpu(kw, fit_runs + holdout, err)
    engine = engine_config(kw)
    if not simulated:
        _batch_defaults(engine, known, lambda text: err.print(f"inferlab sim calibrate: {text}", highlight=False))
    fitted = tuple(dict.fromkeys("cpu_step_eager_s" if n == "cpu_step_s" and engine.enforce_eager else n for n in names))
    _underdetermined(fit_runs, fitted, lambda text: err.print(f"inferlab sim calibrate: {text}", highlight=False))
    labels = {key: label for label, key, _ in COLUMNS}  # (the twin's metrics are sweep headline keys)
    against = ", ".join(labels[m] for m in METRICS)
    err.print(f"inferlab sim calibrate: fitting {', '.join(fitted)} to {against} of {len(fit_runs)} run(s), "
              f"{len(holdout)} held out (each evaluation reruns the fit set in virtual time)")
    fit = calibrate(engine, fit_runs, holdout, names, kw["max_evaluations"])
    if not fit.converged:
        err.print(f"inferlab sim calibrate: the search stopped at --max-evaluations {kw['max_evaluations']} before it "
                  "converged: a better fit may remain (give more; the twin records converged: false)", highlight=False)
    checked = holdout or fit_runs  # (the runs the twin's error is over)
    write_efficiencies(kw["out"], engine, fit, stated, {"checked": loads_of(checked), "all": loads_of([*fit_runs, *holdout])},
                       served)
    if kw["report"]:
        Path(kw["report"]).write_text(json.dumps(fit.to_json(), indent=2) + "\n")
    out = console()
    # (runs of the simulated server hold the simulator's numbers: not measurements)
    ran = "the runs' (simulated server: predictions)" if simulated else "measured"
    table = Table(title=f"inferlab sim calibrate: {ran} vs the twin's prediction", title_justify="left", header_style="bold")
    for col in ("set", "run", "metric", "simulated run" if simulated else "measured", "prediction", "error"):
        table.add_column(col, justify="left" if col in ("set", "run", "metric") else "right")
    for label, rows in (("fit", fit.fit_runs), ("held out", fit.holdout_runs)):
        for r in rows:
            for m in METRICS:
                if m in r["measured"]:
                    pred, e = r["predicted"][m], r["error"][m]
                    table.add_row(label, Path(r["run"]).name, m, f"{r['measured'][m]:,.2f}",
                                  "—" if pred is None else f"{pred:,.2f}", "—" if e is None else f"{e:+.1%}")
    out.print(table)
    for label, rows in (("fit", fit.fit_runs), ("held out", fit.holdout_runs)):
        if rows:
            meds = {m: median_abs_error(rows, m) for m in METRICS}
            out.print(f"median |error|, {label}: " + ", ".join(f"{m} {v:.1%}" for m, v in meds.items() if v is not None))
    out.print("constants: " + ", ".join(f"{k} {v:.4g}" for k, v in fit.constants.items())
              + f" ({fit.evaluations} evaluations{'' if fit.converged else ', not converged'}; not meaningful one by one: "
              "other values can fit the runs as well, and only the twin's predictions are checked)")
    for name, side in at_bounds(fit.constants).items():
        err.print(f"inferlab sim calibrate: {name} ended at its {side} bound ({fit.constants[name]:.4g}): the engine as "
                  "stated (model, device, flags) cannot explain the runs with it, and the other constants made up for "
                  "it; check those, or fit other constants (bench/llamacpp_twin.py shows a CPU server's)", highlight=False)
    out.print(f"efficiencies: {kw['out']} (sim run --efficiencies {kw['out']} with the same model and GPU; the "
              "family, release, what the server stated and the engine flags calibrate ran with come from the file, "
              "where a run's flags do not say otherwise)")
    return 0
