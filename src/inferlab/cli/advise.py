"""``inferlab advise``: evidence → recommendations (``analysis.advise``)."""

from __future__ import annotations

import sys
from typing import Any

import click
from rich.console import Console
from rich.markup import escape

from inferlab.analysis.advise import GOALS, Advice, advise
from inferlab.cli.common import console, run_guarded
from inferlab.results.provenance import PREDICTION
from inferlab.results.runfiles import dumps


@click.command("advise")
@click.argument("source", type=click.Path())
@click.option("--goal", type=click.Choice(GOALS), default="latency", show_default=True, help="What matters most: the order of the list.")
@click.option("--json", "as_json", is_flag=True, help="Print the recommendations as JSON.")
def advise_command(source: str, goal: str, as_json: bool) -> None:
    """Recommendations from a run directory, a profile folder, or a folder of runs
    (a sweep): what triggered each, the exact change, and the expected gain (a simulator
    prediction where one applies)."""
    sys.exit(run_guarded(lambda: _advise(source, goal, as_json)))


def _advise(source: str, goal: Any, as_json: bool) -> int:
    result = advise(source, goal)
    if as_json:
        click.echo(dumps(result.to_json()))
    else:
        render_advice(console(), result)
    return 0


def render_advice(console: Console, a: Advice) -> None:
    """The checklist, in the goal's order."""
    console.print(f"[bold]advice for {escape(a.source)}[/bold] ({a.kind}; goal: {a.goal})")
    if a.simulated:
        console.print(f"[yellow]{PREDICTION}[/yellow]: what this reads came from inferlab's simulator (virtual time, or the "
                      "simulated server): every number below, the evidence included, is a prediction, not a measurement")
    unmeasured = f"; not measured, so not checked: {', '.join(a.not_measured)}" if a.not_measured else ""
    unjudged: dict[str, list[str]] = {}
    for rule, why in a.not_checked.items():
        unjudged.setdefault(why, []).append(rule)
    unmeasured += "".join(f"; not checked: {', '.join(rules)} ({why})" for why, rules in unjudged.items())
    if not a.recommendations:
        checked = f"{', '.join(a.checked)} checked" if a.checked else "no rule checked"
        console.print(f"nothing to change: no rule fired ({checked}{unmeasured})")
        return
    for i, r in enumerate(a.recommendations, 1):
        console.print(f"\n[bold]{i}. {escape(r.title)}[/bold]")
        console.print(f"   [dim]why:[/dim] {escape(r.evidence)}")
        if r.change:
            console.print(f"   [dim]change:[/dim] {escape(r.change)}")
        kinds = {g.kind for g in r.gains}
        for g in r.gains:
            text = g.text() if len(kinds) > 1 else g.text().removesuffix(f" [{g.kind}]")
            console.print(f"   [dim]expected:[/dim] {escape(text)}")
        if len(kinds) == 1:
            console.print(f"   [dim]source:[/dim] {escape(kinds.pop())}")
        if r.note:
            console.print(f"   [dim]note:[/dim] {escape(r.note)}")
    console.print(f"\n[dim]rules checked: {', '.join(a.checked) or 'none'}{unmeasured}[/dim]")
