"""``inferlab tokens``: what the system prompt, user content and chat template cost."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import TYPE_CHECKING, Any

import click

from inferlab._errors import UsageError
from inferlab.cli.common import FloatRange, console, given, run_guarded
from inferlab.results.provenance import PREDICTION
from inferlab.sim.engine.engine import EngineConfig

if TYPE_CHECKING:
    from inferlab.analysis.tokencost import TokenCost

#: What each TTFT figure is, by where its prefill time comes from (``--json``'s ``ttft_basis``).
SIM_BASIS = ("a prediction by inferlab's simulator: one request alone on an idle engine, no prefix cache hit, "
             "from arrival to first token (API server time included)")
RATE_BASIS = "the prompt's tokens / --prefill-tps: prefill alone, no queueing or API server time"

#: The slowest prefill rate ``--prefill-tps`` takes: slower than any server prefills.
MIN_PREFILL_TPS = 1.0


def text_arg(value: str | None, flag: str) -> str | None:
    """``TEXT`` as given, or ``@FILE``'s contents; ``UsageError`` for a file that cannot
    be read, is not UTF-8 text or holds no text (it would be measured as an empty part)."""
    if value is None or not value.startswith("@"):
        return value
    if value == "@":
        raise UsageError(f"{flag} @: give a file name after the @ (@FILE)")
    try:
        with open(value[1:], encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError as e:
        raise UsageError(f"{flag} {value}: not UTF-8 text ({e.reason} at byte {e.start})") from e
    except OSError as e:
        raise UsageError(f"{flag} {value}: {e.strerror or e}") from e
    if not text.strip():
        raise UsageError(f"{flag} {value}: the file holds no text")
    return text


def tokenizer_model(tokenizer: str) -> str | None:
    """The simulator's name for the model ``--tokenizer`` belongs to: the
    ``config.json`` beside its ``tokenizer.json``, or the id or folder name of a model
    the simulator knows; None when neither is one it can simulate."""
    from inferlab.sim.engine.hardware import resolve_model
    from inferlab.workload.tokenizers import resolve_tokenizer_file

    config = os.path.join(os.path.dirname(resolve_tokenizer_file(tokenizer)), "config.json")
    candidates = [config] if os.path.isfile(config) else []
    if not os.path.isfile(tokenizer):  # (a folder's name, or a model id)
        candidates.append(tokenizer.rstrip("/"))
    for candidate in candidates:
        try:
            resolve_model(candidate)
        except UsageError:
            continue
        return candidate
    return None


@click.command()
@click.option("--system", help="System prompt: TEXT or @FILE.")
@click.option("--prompt", help="User prompt: TEXT or @FILE.")
@click.option("--dataset", type=click.Path(dir_okay=False), help="A prompt set (JSONL, ShareGPT JSON or CSV, as for bench): mean tokens per part, and each prompt's own TTFT as mean, p50 and p99; --system is added to each prompt that has no system or developer message.")
@click.option("--dataset-format", type=click.Choice(["jsonl", "sharegpt", "csv"]), help="How to read --dataset (default: from its name and content).")
@click.option("--tokenizer", type=click.Path(exists=False), help="A tokenizer.json, its directory, or a Hugging Face model id in the local HF cache (no downloads). Default: the simulator's built-in tokenizer.")
@click.option("--prefill-tps", type=FloatRange(finite=True), help="Prefill rate in tokens/s for the TTFT cost (at least 1). Default: one prefill on the simulator (--model/--gpu, which it replaces).")
@click.option("--model", default=EngineConfig.model, show_default=True, help="Simulated model for the TTFT cost (not with --prefill-tps). Default: --tokenizer's model where the simulator knows it (its config.json beside the tokenizer, or its name), else this.")
@click.option("--gpu", default=EngineConfig.gpu, show_default=True, help="Simulated GPU for the TTFT cost (not with --prefill-tps).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON on stdout.")
def tokens(**kw: Any) -> None:
    """What the system prompt, user content and chat template cost in tokens and TTFT.
    Messages count by role: system and developer messages are the system prompt, the
    others user content; the chat template is what the templated prompt adds."""
    sys.exit(run_guarded(lambda: _tokens(kw)))


def _tokens(kw: dict[str, Any]) -> int:
    from inferlab.analysis.tokencost import SYSTEM_ROLES, rate_prefill, sim_prefill, token_cost
    from inferlab.workload.builtin_tokenizer import BuiltinTokenizer
    from inferlab.workload.datasets import read_dataset
    from inferlab.workload.spec import RequestSpec
    from inferlab.workload.tokenizers import load_tokenizer

    if kw["dataset_format"] is not None and not kw["dataset"]:
        raise UsageError("--dataset-format: give --dataset too (it says how to read that file)")
    if kw["prefill_tps"] is not None:  # (--model and --gpu pick the simulated rate it replaces)
        for name in ("model", "gpu"):
            if given(name):
                raise UsageError(f"--{name}: only the simulated prefill uses it, and --prefill-tps gives the rate")
    if kw["system"] == "":  # (an empty system prompt is no system message: nothing to measure)
        raise UsageError("--system: empty; leave it out for a prompt without a system prompt")
    if kw["tokenizer"] == "":
        raise UsageError("--tokenizer: empty; give a tokenizer.json, its directory or a Hugging Face model id")
    system = text_arg(kw["system"], "--system")
    prompt = text_arg(kw["prompt"], "--prompt")
    if kw["dataset"] and prompt is not None:
        raise UsageError("--prompt and --dataset cannot be combined")
    where: list[str] = []
    system_added: int | None = None  # (--system with --dataset: the prompts it went to)
    if kw["dataset"]:
        rows = read_dataset(kw["dataset"], kw["dataset_format"])
        where = [r.where for r in rows]
        # (a row with a system or developer message anywhere has its own system prompt)
        own = [any(role in SYSTEM_ROLES for role, _ in r.messages) for r in rows]
        specs = [r.spec(None, False) if mine else dataclasses.replace(r.spec(None, False), system=system)
                 for r, mine in zip(rows, own, strict=True)]
        if system is not None:
            system_added = own.count(False)
    elif prompt is not None or system is not None:
        specs = [RequestSpec(prompt or "", system=system)]
    else:
        raise UsageError("give --prompt, --system or --dataset")
    tok = load_tokenizer(kw["tokenizer"]) if kw["tokenizer"] else BuiltinTokenizer()
    other_model = False  # (the TTFT is the default model's, not the tokenizer's)
    if kw["prefill_tps"] is not None:
        if not kw["prefill_tps"] >= MIN_PREFILL_TPS:  # (below it the TTFT printed is hundreds of digits)
            raise UsageError(f"--prefill-tps {kw['prefill_tps']:g}: must be at least {MIN_PREFILL_TPS:g} token/s")
        prefill, source, basis = rate_prefill(kw["prefill_tps"]), f"{kw['prefill_tps']:g} tokens/s", RATE_BASIS
    else:
        model = kw["model"]
        if kw["tokenizer"] and not given("model"):  # (the tokenizer's model, where the simulator knows it)
            found = tokenizer_model(kw["tokenizer"])
            model, other_model = found or model, found is None
        prefill, source, basis = sim_prefill(model, kw["gpu"]), f"{model} on {kw['gpu']} {PREDICTION}", SIM_BASIS
    cost = token_cost(specs, tok, prefill, source, where)
    approximate = not kw["tokenizer"]
    template = tok.template_source
    if kw["as_json"]:
        click.echo(json.dumps({
            **cost.to_json(), "ttft_basis": basis, "tokenizer": kw["tokenizer"] or "built-in (simulator)",
            "approximate": approximate, "chat_template": template,
            **({"system_added_to_prompts": system_added} if system_added is not None else {}),
        }, indent=2))
        return 0
    from rich.table import Table

    many = cost.prompts > 1
    per = " (mean per prompt)" if many else ""
    table = Table(title=f"inferlab tokens · {_count(cost.prompts, 'prompt')}{per}", title_justify="left",
                  header_style="bold")
    table.add_column("part")
    table.add_column("tokens", justify="right")
    table.add_column("share", justify="right")
    digits = 1 if many else 0  # one prompt: whole tokens; a set: means
    for label, n in (("system prompt", cost.system_tokens), ("user content", cost.user_tokens),
                     ("chat template", cost.template_tokens), ("total", cost.total_tokens)):
        table.add_row(label, f"{n:,.{digits}f}", f"{n / cost.total_tokens:.1%}" if cost.total_tokens else "—")
    out = console()
    out.print(table)
    if many:
        out.print(f"prompt tokens (total) over the {cost.prompts:,} prompts: p50 {cost.total_tokens_p50:,.0f}, "
                  f"p99 {cost.total_tokens_p99:,.0f}, max {cost.total_tokens_max:,}", highlight=False)
    if approximate:
        out.print(
            "[yellow]note:[/yellow] counts are approximate for real models: the built-in tokenizer "
            "knows only a few hundred words (others cost a token per byte); pass --tokenizer "
            "tokenizer.json (or its directory) for your model's exact counts"
        )
    if cost.merged_tokens:
        out.print(
            f"[yellow]note:[/yellow] the templated {'prompts are' if many else 'prompt is'} "
            f"{_count(cost.merged_tokens, 'token')} shorter than {'their' if many else 'its'} parts counted apart: "
            "the template joins texts without a separator and BPE merges tokens across the join; the chat "
            "template counts 0 tokens where that happens"
        )
    if system_added is not None and system_added < cost.prompts:
        out.print(f"[yellow]note:[/yellow] --system went to {system_added:,} of the {cost.prompts:,} prompts: the "
                  f"other {cost.prompts - system_added:,} have a system or developer message of their own, "
                  "counted as their system prompt instead", highlight=False)
    out.print(f"chat template: {template}")
    out.print(f"system + template share: {cost.overhead_share:.1%}")
    out.print(_ttft_line(cost, source), highlight=False)
    out.print(f"(TTFT: {basis})", highlight=False)
    if other_model:
        out.print(f"[yellow]note:[/yellow] the TTFT is {kw['model']}'s (the --model default): the "
                  "simulator does not know the tokenizer's model; give --model (a known name or its config.json) "
                  "or --prefill-tps", highlight=False)
    return 0


def _count(n: int, noun: str) -> str:
    """'1 prompt', '2 prompts'."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def _ttft_line(cost: TokenCost, source: str) -> str:
    """The prefill TTFT in words: one prompt's, or a set's each prompt's own (mean, p50,
    p99), over the prompts the model's context holds; why none where it holds none."""
    if cost.ttft_ms is None or cost.ttft_user_only_ms is None:
        if cost.context_tokens is None:
            return f"prefill TTFT ({source}): not available"
        longest = (f"the prompt ({cost.total_tokens_max:,} tokens) exceeds" if cost.prompts == 1
                   else f"each of the {cost.prompts:,} prompts exceeds")
        return (f"prefill TTFT ({source}): not available: {longest} the model's context of "
                f"{cost.context_tokens:,} tokens (give --prefill-tps for a rate, or a --model with a longer context)")
    if cost.prompts == 1:
        return (f"prefill TTFT ({source}): {cost.ttft_ms:,.2f} ms; user content alone {cost.ttft_user_only_ms:,.2f} ms; "
                f"system + template cost {cost.ttft_saved_ms:,.2f} ms per uncached request")
    over = f"each prompt's own, over the {cost.ttft_prompts:,} prompts"
    if cost.ttft_prompts < cost.prompts:
        over = (f"each prompt's own, over the {cost.ttft_prompts:,} of {cost.prompts:,} prompts within the model's "
                f"context of {cost.context_tokens:,} tokens ({cost.prompts - cost.ttft_prompts:,} longer)")
    return (f"prefill TTFT ({source}; {over}): mean {cost.ttft_ms:,.2f} ms, p50 {cost.ttft_p50_ms:,.2f} ms, "
            f"p99 {cost.ttft_p99_ms:,.2f} ms; user content alone: mean {cost.ttft_user_only_ms:,.2f} ms; "
            f"system + template cost a mean {cost.ttft_saved_ms:,.2f} ms per uncached request")
