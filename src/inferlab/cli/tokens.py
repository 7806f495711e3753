"""``inferlab tokens``: what the system prompt, user content and chat template cost."""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Any

import click

from inferlab._errors import UsageError
from inferlab.cli.common import FloatRange, console, given, run_guarded
from inferlab.results.provenance import PREDICTION
from inferlab.sim.engine.engine import EngineConfig

#: The slowest prefill rate ``--prefill-tps`` takes: slower than any server prefills.
MIN_PREFILL_TPS = 1.0


def text_arg(value: str | None, flag: str) -> str | None:
    """``TEXT`` as given, or ``@FILE``'s contents."""
    if value is None or not value.startswith("@"):
        return value
    try:
        with open(value[1:], encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"{flag} {value}: {getattr(e, 'strerror', None) or e}") from e


@click.command()
@click.option("--system", help="System prompt: TEXT or @FILE.")
@click.option("--prompt", help="User prompt: TEXT or @FILE.")
@click.option("--dataset", type=click.Path(dir_okay=False), help="A prompt set (JSONL, ShareGPT JSON or CSV, as for bench); --system is added to each prompt that has none.")
@click.option("--dataset-format", type=click.Choice(["jsonl", "sharegpt", "csv"]), help="How to read --dataset (default: from its name and content).")
@click.option("--tokenizer", type=click.Path(exists=False), help="A tokenizer.json, its directory, or a Hugging Face model id in the local HF cache (no downloads). Default: the simulator's built-in tokenizer.")
@click.option("--prefill-tps", type=FloatRange(finite=True), help="Prefill rate in tokens/s for the TTFT cost (at least 1). Default: one prefill on the simulator (--model/--gpu, which it replaces).")
@click.option("--model", default=EngineConfig.model, show_default=True, help="Simulated model for the TTFT cost (not with --prefill-tps).")
@click.option("--gpu", default=EngineConfig.gpu, show_default=True, help="Simulated GPU for the TTFT cost (not with --prefill-tps).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON on stdout.")
def tokens(**kw: Any) -> None:
    """What the system prompt, user content and chat template cost in tokens and TTFT."""
    sys.exit(run_guarded(lambda: _tokens(kw)))


def _tokens(kw: dict[str, Any]) -> int:
    from inferlab.analysis.tokencost import rate_prefill, sim_prefill, token_cost
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
    system = text_arg(kw["system"], "--system")
    prompt = text_arg(kw["prompt"], "--prompt")
    if kw["dataset"] and prompt is not None:
        raise UsageError("--prompt and --dataset cannot be combined")
    if kw["dataset"]:
        specs = [r.spec(None, False) for r in read_dataset(kw["dataset"], kw["dataset_format"])]
        specs = [dataclasses.replace(s, system=s.system or system) for s in specs]
    elif prompt is not None or system is not None:
        specs = [RequestSpec(prompt or "", system=system)]
    else:
        raise UsageError("give --prompt, --system or --dataset")
    tok = load_tokenizer(kw["tokenizer"]) if kw["tokenizer"] else BuiltinTokenizer()
    if kw["prefill_tps"] is not None:
        if not kw["prefill_tps"] >= MIN_PREFILL_TPS:  # (below it the TTFT printed is hundreds of digits)
            raise UsageError(f"--prefill-tps {kw['prefill_tps']:g}: must be at least {MIN_PREFILL_TPS:g} token/s")
        prefill, source = rate_prefill(kw["prefill_tps"]), f"{kw['prefill_tps']:g} tokens/s"
    else:
        prefill, source = sim_prefill(kw["model"], kw["gpu"]), f"{kw['model']} on {kw['gpu']} {PREDICTION}"
    cost = token_cost(specs, tok, prefill, source)
    approximate = not kw["tokenizer"]
    template = tok.template_source
    if kw["as_json"]:
        click.echo(json.dumps({
            **cost.to_json(), "tokenizer": kw["tokenizer"] or "built-in (simulator)", "approximate": approximate,
            "chat_template": template,
        }, indent=2))
        return 0
    from rich.table import Table

    per = " (mean per prompt)" if cost.prompts > 1 else ""
    table = Table(title=f"inferlab tokens · {cost.prompts} prompt(s){per}", title_justify="left", header_style="bold")
    table.add_column("part")
    table.add_column("tokens", justify="right")
    table.add_column("share", justify="right")
    digits = 1 if cost.prompts > 1 else 0  # one prompt: whole tokens; a set: means
    for label, n in (("system prompt", cost.system_tokens), ("user content", cost.user_tokens),
                     ("chat template", cost.template_tokens), ("total", cost.total_tokens)):
        table.add_row(label, f"{n:,.{digits}f}", f"{n / cost.total_tokens:.1%}" if cost.total_tokens else "—")
    out = console()
    out.print(table)
    if approximate:
        out.print(
            "[yellow]note:[/yellow] counts are approximate for real models: the built-in tokenizer "
            "knows only a few hundred words (others cost a token per byte); pass --tokenizer "
            "tokenizer.json (or its directory) for your model's exact counts"
        )
    out.print(f"chat template: {template}")
    out.print(f"system + template share: {cost.overhead_share:.1%}")
    if cost.ttft_ms is not None and cost.ttft_user_only_ms is not None:
        out.print(
            f"prefill TTFT ({source}): {cost.ttft_ms:,.2f} ms; user content alone {cost.ttft_user_only_ms:,.2f} ms; "
            f"system + template cost {cost.ttft_saved_ms:,.2f} ms per uncached request"
        )
    return 0


