"""What to send, as the command line gives it: ``WorkloadConfig.build`` makes the workload."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from inferlab._errors import UsageError
from inferlab.openai.request import Api
from inferlab.workload.datasets import DatasetConfig, DatasetWorkload
from inferlab.workload.lengths import parse_length
from inferlab.workload.prompts import PromptBuilder
from inferlab.workload.sessions import SessionConfig, SessionWorkload
from inferlab.workload.spec import DEFAULT_PROMPT, RequestSpec, Trace
from inferlab.workload.synthetic import FixedPromptWorkload, SharedPrefixWorkload, SyntheticWorkload
from inferlab.workload.text import WORDS
from inferlab.workload.tokenizers import Tokenizer, load_tokenizer
from inferlab.workload.traces import TraceConfig


@dataclass(frozen=True)
class WorkloadConfig:
    """What to send, as flags give it; ``build`` makes the workload.

    One of: a ``trace`` (timed requests, replayed); shared-prefix groups
    (``prefix_groups``/``prefix_tokens``/``suffix_tokens``); synthetic prompts
    (``input_tokens``); or the fixed ``prompt``. Lengths are specs for
    ``parse_length`` (``500``, ``uniform:100:900``, ...). ``tokenizer`` is a local
    tokenizer.json (or a directory with one) that makes prompt lengths exact; with it the
    completions API gets token ids unless ``token_ids`` is off.
    """

    input_tokens: int | str | None = None
    output_tokens: int | str | None = None
    prompt: str | None = None
    exact_output: bool = True
    prefix_groups: int | None = None
    prefix_tokens: int | None = None
    suffix_tokens: int | str | None = None
    prefix_popularity: str = "uniform"
    trace: TraceConfig | None = None
    tokenizer: str | None = None
    token_ids: bool = True
    dataset: DatasetConfig | None = None
    sessions: int | None = None
    turns: int = 4
    think_time_s: float = 0.0
    system_tokens: int = 0
    context_window_tokens: int | None = None
    # the prompts' salt (``PromptBuilder``): None, fresh prompts each run against a server
    # (a random salt, recorded in config.json) and none in virtual time (the simulated
    # engine starts each run with an empty cache); a string, that run's prompts again
    prompt_salt: str | None = None

    def builder(
        self, api: Api = "chat", *, vocab: tuple[str, ...] = WORDS, tokens_per_word: float = 1.0, salt: str = ""
    ) -> PromptBuilder:
        """The prompt builder for ``api``: this config's tokenizer (token ids on the
        completions API unless ``token_ids`` is off); without one, prompts of ``vocab``
        words at ``tokens_per_word`` (what a server's preflight found); built prompts
        under ``salt`` (see ``PromptBuilder``)."""
        tok = load_tokenizer(self.tokenizer) if self.tokenizer else None
        ids = self.token_ids and api == "completions"
        return PromptBuilder(tok, ids, vocab=vocab, tokens_per_word=tokens_per_word, salt=salt)

    @property
    def shares_prefixes(self) -> bool:
        """Whether this workload's prompts may share prefixes by design (shared-prefix
        groups, sessions, traces, a fixed prompt, a dataset); built synthetic prompts
        share none."""
        return not (self.input_tokens is not None and self.sessions is None and self.trace is None
                    and self.dataset is None and self.prefix_tokens is None)

    @property
    def fixed_prompt(self) -> bool:
        """Whether every request sends the same prompt (``--prompt``, or the default)."""
        return not any(v is not None for v in (
            self.input_tokens, self.sessions, self.trace, self.dataset, self.prefix_tokens, self.prefix_groups,
        ))

    @property
    def synthetic(self) -> bool:
        """Whether prompts are built to token lengths (rather than given as text)."""
        return self.prompt is None and self.dataset is None

    def build(
        self, seed: int, api: Api = "chat", *, builder: PromptBuilder | None = None, template_tokens: int = 0,
        counter: Tokenizer | None = None,
    ) -> Iterator[RequestSpec] | Trace | SessionWorkload:
        """The workload: a ``Trace`` (timed requests) for a trace, a ``SessionWorkload`` for
        multi-turn sessions, else an iterator (endless but for a dataset).
        ``builder`` makes the prompts (default ``self.builder(api)``; ``bench``: one
        that hits token lengths the way the preflight found for the target server;
        ``sim run``: the simulator's own token ids); a trace's prompts are built
        ``template_tokens`` shorter, the tokens the target adds (``TraceConfig.load``).
        A dataset's lengths are counted with this config's tokenizer, else ``counter``
        (``sim run``: the simulator's own). ``UsageError`` for conflicting or malformed
        options."""
        shared = self.prefix_groups is not None or self.prefix_tokens is not None
        chosen = [n for n, on in (
            ("--trace", self.trace is not None), ("--prefix-groups/--prefix-tokens", shared),
            ("--input-tokens", self.input_tokens is not None), ("--prompt", self.prompt is not None),
            ("--dataset", self.dataset is not None), ("--sessions", self.sessions is not None),
        ) if on]
        if self.sessions is not None and self.input_tokens is not None:
            chosen.remove("--input-tokens")  # the new user message of each turn
        if len(chosen) > 1:
            raise UsageError(f"{' and '.join(chosen)} cannot be combined")
        if self.suffix_tokens is not None and not shared:
            raise UsageError("--suffix-tokens needs --prefix-tokens")
        out = None if self.output_tokens is None else parse_length(self.output_tokens, "--output-tokens")

        def prompts() -> PromptBuilder:
            return builder or self.builder(api)

        if self.trace is not None:
            if self.output_tokens is not None:
                raise UsageError("--output-tokens cannot be combined with --trace (the trace gives them)")
            return self.trace.load(prompts(), seed, self.exact_output, template_tokens)
        if self.sessions is not None:
            scfg = SessionConfig(
                self.sessions, self.turns, parse_length(self.input_tokens or 128, "--input-tokens"), out,
                self.think_time_s, self.system_tokens, self.context_window_tokens,
            )
            session_builder = prompts()
            session_builder.token_ids = False  # sessions send text: answers come back as text
            return SessionWorkload(scfg, session_builder, seed, self.exact_output)
        if self.dataset is not None:
            tok = load_tokenizer(self.tokenizer) if self.tokenizer else counter
            rows, notes = self.dataset.read(tok)
            return DatasetWorkload(rows, self.dataset.sample, out, seed, self.exact_output, in_words=tok is None,
                                   notes=tuple(notes))
        if shared:
            return iter(SharedPrefixWorkload(
                1 if self.prefix_groups is None else self.prefix_groups, self.prefix_tokens or 512,
                parse_length(self.suffix_tokens if self.suffix_tokens is not None else 64, "--suffix-tokens"),
                out, parse_popularity(self.prefix_popularity), seed, self.exact_output, prompts(),
            ))
        if self.input_tokens is not None:
            inp = parse_length(self.input_tokens, "--input-tokens")
            return iter(SyntheticWorkload(inp, out, seed, self.exact_output, prompts()))
        return iter(FixedPromptWorkload(self.prompt or DEFAULT_PROMPT, out, self.exact_output, seed))


def parse_popularity(spec: str) -> float:
    """``uniform`` → 0; ``zipf`` → 1; ``zipf:A`` → A (the Zipf exponent)."""
    kind, _, a = spec.strip().lower().partition(":")
    if kind == "uniform" and not a:
        return 0.0
    if kind == "zipf":
        try:
            value = float(a) if a else 1.0
        except ValueError:
            value = -1.0
        if value > 0:
            return value
    raise UsageError(f"--prefix-popularity {spec!r}: expected uniform, zipf or zipf:A with A > 0")
