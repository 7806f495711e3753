"""What an OpenAI-compatible server refuses for its context, and how far it lets an
answer run: vLLM's API server (``output_limit``, by release) and SGLang's
(``SGLangLimits``). The simulated engine refuses by these (``sim.engine``), and bench's
pre-run context check reads the same rules (``client.preflight``), so the two cannot
drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass


class ContextError(ValueError):
    """A request the server refuses for the context (HTTP 400); ``param``: the request
    field it names, if any; ``stream_type``: where not None, a streamed request is
    refused inside its stream instead (HTTP 200, then an error event of this type:
    SGLang's)."""

    def __init__(self, message: str, param: str | None = None, *, stream_type: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.stream_type = stream_type


def over_context(limit: int, prompt: int, output: int) -> str:
    """vLLM's words for prompt + max_tokens over the context."""
    return (f"This model's maximum context length is {limit} tokens. However, you requested {prompt + output} "
            f"tokens ({prompt} in the messages, {output} in the completion). Please reduce the length of the "
            "messages or completion.")


def output_limit(
    prompt_tokens: int, max_tokens: int | None, max_model_len: int, *, clamp: bool, param: str = "max_tokens"
) -> int:
    """The most tokens a request may generate, as vLLM's API server decides before the
    engine sees it: ``max_tokens`` (``param`` names the field it came in), or without
    one the context the prompt leaves. ``ContextError`` (its 400) for what it refuses.

    ``clamp`` (vLLM 0.32 on, ``FamilyRules.clamp_max_tokens``): a ``max_tokens`` over
    what the prompt leaves is lowered to it (the answer ends "length"); refused are a
    ``max_tokens`` over the whole context, a prompt over it, and a prompt that fills it
    (max_tokens lowered to 0), each in 0.32's words. Otherwise (vLLM before 0.32, the
    other engines) prompt + ``max_tokens`` over the context is refused, as is a prompt
    that leaves no room for one token."""
    room = max_model_len - prompt_tokens
    if not clamp:
        if max_tokens is not None and max_tokens > room:
            raise ContextError(over_context(max_model_len, prompt_tokens, max_tokens))
        if room < 1:
            raise ContextError(f"This model's maximum context length is {max_model_len} tokens. However, your prompt "
                               f"has {prompt_tokens} tokens. Please reduce the length of the prompt.")
        return room if max_tokens is None else max_tokens
    if max_tokens is not None and max_tokens > max_model_len:
        raise ContextError(f"{param}={max_tokens} cannot be greater than max_model_len={max_model_len}. "
                           "Please request fewer output tokens.", param)
    if room < 0:
        raise ContextError(f"This model's maximum context length is {max_model_len} tokens. However, your prompt "
                           f"contains {prompt_tokens} input tokens, which exceeds this limit even without any output "
                           "tokens. Please reduce the length of the input prompt.", "input_tokens")
    if room == 0:
        raise ContextError("max_tokens must be at least 1, got 0.", "max_tokens")
    return room if max_tokens is None else min(max_tokens, room)


#: SGLang's first release that takes a request whose prompt + max_new_tokens is exactly
#: the context (sgl-project/sglang#22546: ``>=`` became ``>`` in the tokenizer manager's
#: check; 0.5.10's wheel still has ``>=``, 0.5.11's ``>``) ...
SGLANG_TOTAL_FILLS_SINCE = (0, 5, 11)
#: ... and its first that answers a streamed request its tokenizer manager refuses with
#: HTTP 400 (serving_chat.py and serving_completions.py start the stream before the 200),
#: and sends its scheduler's refusal of one as an error event of type "BAD_REQUEST"
#: (serving_chat.py's ``finish_reason_type == "abort"``) ...
SGLANG_STREAM_400_SINCE = (0, 5, 10)
#: ... where 0.5.6-0.5.9 end such a stream with finish_reason "abort" and no error event
#: (the tokenizer manager yields the scheduler's abort to a stream from 0.5.6, and their
#: serving_chat.py and serving_completions.py pass it on as a finish reason); up to
#: 0.5.5 it is an error event of type "BadRequestError", as the tokenizer manager's
SGLANG_ABORT_FINISH_SINCE = (0, 5, 6)
#: ``ContextError.stream_type`` of a stream that ends with finish_reason "abort" instead
STREAM_ABORT = "abort"


@dataclass(frozen=True)
class SGLangLimits:
    """SGLang's server's limits on one request, for a context of ``context`` tokens and a
    KV pool of ``pool_tokens`` (None: no smaller than the context), in its release
    ``release`` (None: a current one, 0.5.11 on); read in its 0.4.6, 0.4.9, 0.5.3,
    0.5.9, 0.5.10, 0.5.11 and 0.5.23 wheels, python/sglang/srt/managers/. The simulated
    SGLang refuses by it (``output_limit``) and bench's context check reads it
    (``client.preflight.ContextRule``)."""

    context: int
    pool_tokens: int | None = None
    release: tuple[int, int, int] | None = None

    @property
    def total_fills(self) -> bool:
        """Whether prompt + max_tokens of exactly the context is taken (0.5.11 on)."""
        return self.release is None or self.release >= SGLANG_TOTAL_FILLS_SINCE

    @property
    def stream_400(self) -> bool:
        """Whether a streamed request the tokenizer manager refuses gets HTTP 400 (0.5.10 on)."""
        return self.release is None or self.release >= SGLANG_STREAM_400_SINCE

    @property
    def scheduler_stream_type(self) -> str:
        """How a stream gets the scheduler's refusal (``ContextError.stream_type``): an
        error event of type "BAD_REQUEST" (0.5.10 on) or "BadRequestError" (to 0.5.5), or
        finish_reason "abort" (``STREAM_ABORT``, 0.5.6-0.5.9)."""
        if self.stream_400:
            return "BAD_REQUEST"
        assert self.release is not None  # (a current release has stream_400)
        return STREAM_ABORT if self.release >= SGLANG_ABORT_FINISH_SINCE else "BadRequestError"

    @property
    def max_req_len(self) -> int:
        """The scheduler's ``max_req_len``: one under the smaller of the context and the
        KV pool (``TpModelWorker``)."""
        return min(self.context, self.pool_tokens or self.context) - 1

    @property
    def prompt_limit(self) -> int:
        """A prompt of this many tokens or more is refused: the scheduler's
        ``max_req_input_len`` (``max_req_len - 5``), under the tokenizer manager's context."""
        return self.max_req_len - 5

    @property
    def total_limit(self) -> int:
        """The most prompt + max_tokens the tokenizer manager takes: the context from
        0.5.11, one under it before."""
        return self.context if self.total_fills else self.context - 1

    @property
    def answer_room(self) -> int:
        """The most prompt + answer tokens the scheduler lets a request have
        (``init_req_max_new_tokens``: ``max_req_len - prompt - 1`` for the answer): an
        answer ends "length" two tokens short of the context."""
        return self.max_req_len - 1

    def answer_limit(self, prompt_tokens: int) -> int:
        """The longest answer a prompt of ``prompt_tokens`` may have (``answer_room``)."""
        return self.answer_room - prompt_tokens

    def output_limit(self, prompt_tokens: int, max_tokens: int | None) -> int:
        """The most tokens a request may generate, as SGLang's server decides:
        ``ContextError`` in its words for what it refuses, which its OpenAI server
        answers with HTTP 400.

        Its tokenizer manager (``_validate_one_request``; ``_validate_token_len`` in
        0.4) refuses a prompt of the whole context or more, and, where the request gives
        ``max_tokens``, a prompt + max_tokens over ``total_limit``; a streamed request
        gets these inside its stream unless ``stream_400``. Its scheduler then refuses a
        prompt of ``prompt_limit`` tokens or more (``validate_input_length``; a streamed
        request gets it inside its stream) and cuts the answer at ``answer_limit``, with
        or without a max_tokens."""
        in_stream = None if self.stream_400 else "BadRequestError"
        if prompt_tokens >= self.context:
            raise ContextError(f"The input ({prompt_tokens} tokens) is longer than the model's context length "
                               f"({self.context} tokens).", stream_type=in_stream)
        total = prompt_tokens + (max_tokens or 0)
        if max_tokens is not None and total > self.total_limit:
            raise ContextError(f"Requested token count exceeds the model's maximum context length of {self.context} "
                               f"tokens. You requested a total of {total} tokens: {prompt_tokens} tokens from the input "
                               f"messages and {max_tokens} tokens for the completion. Please reduce the number of "
                               "tokens in the input messages or the completion to fit within the limit.",
                               stream_type=in_stream)
        if prompt_tokens >= self.prompt_limit:
            raise ContextError(f"Input length ({prompt_tokens} tokens) exceeds the maximum allowed length "
                               f"({self.prompt_limit} tokens). Use a shorter input or enable --allow-auto-truncate.",
                               stream_type=self.scheduler_stream_type)
        room = self.answer_limit(prompt_tokens)
        return room if max_tokens is None else min(max_tokens, room)
