"""The engine's configuration: vLLM's flags (``EngineConfig``), and ``resolve``, which
reads their names (model, GPU, data types, family), checks them as vLLM does at start-up
and fills the switches left to the engine family. Sizes are resolved after, from memory
(``sizing``).
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import TypeVar

from inferlab._errors import ConfigError, UsageError
from inferlab.sim.engine.dtypes import (
    SIMULATED_QUANTIZATIONS,
    VLLM_METHODS,
    CapacityPolicy,
    DType,
    KVCacheDType,
    Quantization,
)
from inferlab.sim.engine.families import EngineFamily, FamilyRules, family_for_engine
from inferlab.sim.engine.hardware import (
    GpuSpec,
    ModelSpec,
    quantization_from_name,
    resolve_gpu,
    resolve_model,
)
from inferlab.sim.engine.steptime import (
    Efficiencies,
    check_tensor_parallel,
    efficiencies_json,
    load_efficiencies,
)

_T = TypeVar("_T")


@dataclass(frozen=True)
class EngineConfig:
    """vLLM-named engine flags with vLLM's defaults.

    ``None`` means "the engine family's default" (``families.FAMILY_RULES``): for vLLM
    V1, ``max_num_batched_tokens`` / ``max_num_seqs`` from the GPU and whether the engine
    runs offline (vLLM's ``LLM`` class) or as a server; the other families start from
    their own documented defaults. ``max_model_len`` is the model's context length,
    capped to what the KV cache holds.

    ``engine_family``, ``dtype``, ``quantization``, ``kv_cache_dtype`` and
    ``capacity_scheduler_policy`` may be given as
    strings by any of their names: they are read into their enums here (``UsageError``
    listing the known names for any other), so the engine only ever sees members.
    """

    model: str = "Qwen/Qwen2.5-7B-Instruct"
    gpu: str = "H100"
    tensor_parallel_size: int = 1
    max_model_len: int | None = None
    gpu_memory_utilization: float = 0.9
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    block_size: int = 16
    enable_prefix_caching: bool | None = None  # None: the family's (on; off for vLLM V0, TurboMind)
    enable_chunked_prefill: bool | None = None  # None: the family's default
    enforce_eager: bool = False
    dtype: DType = DType.AUTO
    quantization: Quantization | None = None  # None: the checkpoint's (its config, or name)
    # the name ``quantization`` was given by, in lower case (set from a string given): vLLM
    # runs a checkpoint or not by the name (marlin runs an AWQ one, gptq does not), so
    # ``resolve`` reads it, and keeps it where vLLM runs the checkpoint by it (marlin beside
    # the AWQ it runs); None when given as a member. Not part of a config's identity
    quantization_name: str | None = field(default=None, compare=False)
    kv_cache_dtype: KVCacheDType = KVCacheDType.AUTO
    efficiencies_path: str | None = None
    engine_family: EngineFamily = EngineFamily.VLLM
    api_overhead_s: float | None = None  # per-request API cost before queueing; None: the family's
    # fix the KV cache size (tests, what-ifs), in vLLM's meaning: blocks allocated, of
    # which vLLM V1 keeps one as its null block (``FamilyRules.null_block``)
    num_gpu_blocks_override: int | None = None
    # TRT-LLM / LMDeploy size the KV cache as this share of the memory left after weights
    # and activations (not gpu_memory_utilization of the GPU); None: the family's way
    kv_cache_free_fraction: float | None = None
    offline: bool = False  # size the scheduler like vLLM's offline LLM class, not its server
    # vLLM 0.5.5-0.7 --num-scheduler-steps: a decode batch runs this many steps before the
    # scheduler runs again (new requests wait for the group to end); 1: every step
    num_scheduler_steps: int = 1
    # a step mixes decodes with prefill chunks (vLLM V1, V0 with chunked prefill, TRT-LLM)
    # or runs prefill and decode steps apart (SGLang; vLLM V0 without chunking); None: the
    # family's way
    mixed_batches: bool | None = None
    # the host schedules step k+1 while the GPU runs step k (SGLang's overlap scheduler,
    # on by default since 0.4; vLLM's --async-scheduling, since 0.14): a request that
    # arrives during a step is seen one step later. None: the family's way in its release
    # (on for sglang and vllm)
    overlap_schedule: bool | None = None
    # vLLM's --scheduler-reserve-full-isl: a waiting or preempted request is admitted only
    # when free KV blocks hold its whole current sequence. None: the family's (on for vllm)
    scheduler_reserve_full_isl: bool | None = None
    # SGLang's admission: a waiting request is admitted only while free KV blocks hold its
    # prompt and output beyond the running requests' estimated outputs (its
    # new_token_ratio). None: the family's (on for sglang)
    reserve_outputs: bool | None = None
    # TensorRT-LLM's capacity scheduler (``CapacityPolicy``). None: the family's
    # (GUARANTEED_NO_EVICT for trtllm, MAX_UTILIZATION for the others)
    capacity_scheduler_policy: CapacityPolicy | None = None
    # a freed KV block without a prefix hash (a partly filled tail) goes to the front of
    # the free queue, reused before cached blocks (vLLM from 0.24). None: the family's
    evict_unhashed_first: bool | None = None
    # the engine's release ("0.15", "v0.4.3"): the switches above that a release turned on
    # (``FamilyRules.*_since``: vLLM's async scheduling 0.14, full-sequence admission 0.19,
    # unhashed blocks first 0.24; SGLang's overlap scheduler 0.4) follow it where not
    # given. None: a current release
    engine_version: str | None = None
    # the API front end (``frontend``): how many API server processes share intake and
    # streaming (vLLM's --api-server-count), and how fast this host's CPU is against the
    # typical host the family's front-end constants were fitted on (2.0: twice as fast)
    api_server_count: int = 1
    host_speed: float = 1.0

    def __post_init__(self) -> None:
        # (frozen: the parsed members replace the strings a Python caller may have given)
        set_field = object.__setattr__
        set_field(self, "engine_family", EngineFamily.parse(self.engine_family))
        set_field(self, "dtype", DType.parse(self.dtype))
        set_field(self, "kv_cache_dtype", KVCacheDType.parse(self.kv_cache_dtype))
        if isinstance(self.engine_version, str):
            set_field(self, "engine_version", self.engine_version.strip())
        given, name = self.quantization, self.quantization_name
        if given is not None and not isinstance(given, Quantization):
            set_field(self, "quantization_name", str(given).strip().lower())
            set_field(self, "quantization", Quantization.parse(given))
        elif name is not None and (given is None or not _names(name, given)):
            raise ConfigError(f"quantization_name {name!r} does not name quantization {given}")
        if self.capacity_scheduler_policy is not None:
            set_field(self, "capacity_scheduler_policy", CapacityPolicy.parse(self.capacity_scheduler_policy))


@dataclass(frozen=True)
class ResolvedConfig:
    """An ``EngineConfig`` with its names read: ``config`` has its quantization (None
    still: an unquantized checkpoint) and every on/off switch set; its sizes are as
    given (``sizing.size_engine`` resolves them)."""

    config: EngineConfig
    model: ModelSpec
    gpu: GpuSpec
    rules: FamilyRules  # the engine family's
    efficiencies: Efficiencies  # the family's, under the efficiencies file if one is given
    declared_len: int  # the context declared: ``max_model_len`` if given, else the model's


def resolve(config: EngineConfig) -> ResolvedConfig:
    """Read ``config``'s names and fill what its engine family decides.

    Raises ``UsageError`` for an unknown model or GPU, a checkpoint quantized a way that
    is not simulated (unless ``quantization`` says how to model it), or an unusable
    efficiencies file; ``ConfigError`` for flags vLLM rejects at start-up.
    """
    model = resolve_model(config.model)
    config = _with_checkpoint_quantization(config, model)
    gpu = resolve_gpu(config.gpu)
    rules = config.engine_family.rules
    path = config.efficiencies_path
    eff = load_efficiencies(path, rules.efficiencies) if path else rules.efficiencies
    _validate_flags(config, model.max_position_embeddings)
    # (offline there is no latency to speak of: an offline run records 0, whatever the file)
    file_latency = efficiencies_json(path).get("api_overhead_s") if path and not config.offline else None
    if file_latency is not None and config.api_overhead_s is not None and float(file_latency) != config.api_overhead_s:
        raise ConfigError(
            f"api_overhead_s: the efficiencies file {path} sets it (a calibrated twin's is part of what its error band "
            "measured); drop --api-latency-ms, or edit the file"
        )
    if config.num_scheduler_steps > 1 and not rules.multi_step:  # (it would simulate groups the engine has not)
        raise ConfigError(
            f"num_scheduler_steps {config.num_scheduler_steps}: {rules.engine} has no multi-step scheduling "
            "(vLLM 0.5.5-0.7 had it: --engine-family vllm-v0); leave it out"
        )
    if rules.front_end_in_process and config.api_server_count > 1:
        raise ConfigError(
            f"api_server_count {config.api_server_count}: {rules.engine} runs its API server in the "
            "engine's process (one only)"
        )
    if not rules.front_end_in_process and not (
        eff.api_intake_s or eff.api_intake_per_token_s or eff.api_stream_s or eff.api_stream_per_step_s
    ):
        moot = [n for n, on in (("api_server_count", config.api_server_count != 1), ("host_speed", config.host_speed != 1.0)) if on]
        if moot:  # (they scale the front end's CPU queue, and this one has none: accepted, they changed nothing)
            raise ConfigError(
                f"{' and '.join(moot)}: {rules.engine}'s API front end is modelled without a CPU queue "
                "(its request cost is in the engine step), so this changes nothing; leave it out"
            )
    _check_kv_cache_flags(config, rules)
    check_tensor_parallel(model, config.tensor_parallel_size)
    declared_len = config.max_model_len or model.max_position_embeddings
    config = _with_family_switches(config, rules, declared_len)
    return ResolvedConfig(config, model, gpu, rules, eff, declared_len)


def memory_share_refused(family: EngineFamily, *, of_the_gpu: bool) -> str | None:
    """Why ``family`` takes no memory share the given way (``of_the_gpu``: vLLM's and
    SGLang's ``gpu_memory_utilization``; else TensorRT-LLM's and LMDeploy's
    ``kv_cache_free_fraction``, of what weights and activations leave), or None where it
    does: the other way's share would be accepted and change nothing."""
    free = family.rules.kv_free_fraction
    if of_the_gpu and free is not None:
        return (f"the {family} family sizes its KV cache as a share of the memory left after weights (default "
                f"{free:g}): give --kv-cache-free-gpu-mem-fraction (TensorRT-LLM's kv_cache_free_gpu_mem_fraction; "
                "LMDeploy's --cache-max-entry-count) instead")
    if not of_the_gpu and free is None:
        also = " (SGLang's --mem-fraction-static)" if family is EngineFamily.SGLANG else ""
        return f"the {family} family sizes its KV cache with --gpu-memory-utilization{also}, a share of the whole GPU"
    return None


def _check_kv_cache_flags(config: EngineConfig, rules: FamilyRules) -> None:
    """Each family sizes its KV cache one way (``memory_share_refused``), and the other
    way's share is a ``ConfigError`` (a ``gpu_memory_utilization`` at its default is not
    known to be given here: the CLI refuses it given at all); so is a KV dtype the
    family has not."""
    family = config.engine_family
    if config.kv_cache_free_fraction is not None and (why := memory_share_refused(family, of_the_gpu=False)):
        raise ConfigError(f"kv_cache_free_fraction (--kv-cache-free-gpu-mem-fraction, --cache-max-entry-count): {why}")
    if config.gpu_memory_utilization != EngineConfig.gpu_memory_utilization and (
        why := memory_share_refused(family, of_the_gpu=True)
    ):
        raise ConfigError(f"gpu_memory_utilization {config.gpu_memory_utilization:g}: {why}")
    share = config.kv_cache_free_fraction
    if share is not None and not 0.0 < share <= 1.0:
        raise ConfigError("kv_cache_free_fraction must be in (0, 1]")
    if config.engine_family is EngineFamily.LMDEPLOY and config.kv_cache_dtype is not KVCacheDType.AUTO:
        raise ConfigError(
            f"kv_cache_dtype (--kv-cache-dtype) {config.kv_cache_dtype.value}: LMDeploy's TurboMind has no fp8 KV cache "
            "(it quantizes KV to int8 or int4, --quant-policy 8/4, which is not simulated); leave it out"
        )


#: The kernels vLLM runs a checkpoint's method with when ``--quantization`` names them:
#: each one's ``override_quantization_method`` takes the checkpoint, and the name given is
#: then the kernel's, so ``ModelConfig._verify_quantization`` finds no mismatch. AWQ:
#: awq_marlin or marlin (vllm/model_executor/layers/quantization/awq_marlin.py, commit
#: 0322f292); GPTQ: gptq_marlin or marlin (gptq_marlin.py, commit 00161ce0), 4- or 8-bit.
#: Both as on a CUDA GPU with a checkpoint Marlin runs (symmetric GPTQ, a group size it
#: has), which is not read from the config. compressed-tensors, fp8 and the others have none.
_VLLM_KERNELS: dict[str, tuple[str, ...]] = {"awq": ("awq_marlin", "marlin"), "gptq": ("gptq_marlin", "marlin")}

#: the method a checkpoint known only by its name (-AWQ, -GPTQ-Int4/-Int8) is taken to
#: have: AutoAWQ's and AutoGPTQ's; an -FP8 or -INT8 name may be fp8 or compressed-tensors
_NAMED_METHOD = {Quantization.AWQ: "awq", Quantization.GPTQ: "gptq", Quantization.W8A16: "gptq"}


def _names(name: str, scheme: Quantization) -> bool:
    """Whether ``name`` may stand beside ``scheme`` as the name it was given by: a name of
    that scheme, or a name vLLM runs such a checkpoint with (marlin an AWQ one, gptq an
    8-bit GPTQ one)."""
    method = _NAMED_METHOD.get(scheme)
    return Quantization.parse(name) is scheme or (method is not None and vllm_runs(method, name))


def vllm_runs(method: str, name: str) -> bool:
    """Whether vLLM starts a checkpoint whose config names quantization ``method`` with
    ``--quantization name`` (one of vLLM's names): the checkpoint's own method, or a
    kernel that takes it (``_VLLM_KERNELS``). Any other it refuses: "Quantization method
    specified in the model config (compressed-tensors) does not match the quantization
    method specified in the `quantization` argument (fp8)" (vllm/config/model.py,
    ``ModelConfig._verify_quantization``, commit 0052a5b8). A ModelOpt FP8 checkpoint is
    run as modelopt whatever is given (modelopt.py, ``ModelOptFp8Config.
    override_quantization_method``, commit 00155cde): here any name of fp8."""
    if method == "modelopt":
        return Quantization.parse(name) is Quantization.FP8
    return name == method or name in _VLLM_KERNELS.get(method, ())


def _with_checkpoint_quantization(config: EngineConfig, model: ModelSpec) -> EngineConfig:
    """``config`` with the quantization vLLM would run: the flag's, else the checkpoint's
    (its config, or a name ending -AWQ, -FP8, ...).

    For a quantized checkpoint, a flag vLLM refuses is refused (``vllm_runs``): it cannot
    run AWQ weights as bf16 or fp8, nor a compressed-tensors checkpoint under any name but
    its own; one it runs runs the checkpoint's scheme (``marlin`` an AWQ one as awq,
    ``gptq_marlin`` an 8-bit GPTQ one as w8a16). A name of this tool's (int4, w8a16, none,
    ...), or a checkpoint whose method is not known (an -FP8 name), must name the
    checkpoint's scheme. An unquantized checkpoint, or one whose quantization is not
    simulated, may be modelled as any scheme."""
    stated = model.quantization or quantization_from_name(config.model)
    if config.quantization is None:
        if model.unsimulated_quantization is not None:
            raise UsageError(
                f"{config.model}: the checkpoint's quantization {model.unsimulated_quantization!r} is not simulated; "
                f"give --quantization {'|'.join(SIMULATED_QUANTIZATIONS)} to model it as one of those"
            )
        return dataclasses.replace(config, quantization=stated)
    if stated is None:
        return config
    name = config.quantization_name
    method = model.quant_method or _NAMED_METHOD.get(stated)
    if method is not None and name in VLLM_METHODS:
        if not vllm_runs(method, name):
            raise UsageError(_contradiction(config, stated, vllm_refusal(method)))
    elif config.quantization is not stated and not (
        # (given as a member, gptq is taken as vLLM's, which names a format: either bit width)
        config.quantization is Quantization.GPTQ and stated is Quantization.W8A16 and name is None
    ):
        raise UsageError(_contradiction(config, stated, "which vLLM refuses at start-up"))
    # (the name given is kept where it names the scheme run, or vLLM ran the checkpoint by it)
    keep = name if name is not None and _names(name, stated) else None
    return dataclasses.replace(config, quantization=stated, quantization_name=keep)


def vllm_refusal(method: str) -> str:
    """What vLLM does with a ``--quantization`` it does not run a ``method`` checkpoint with."""
    if method == "modelopt":
        return "which vLLM ignores, running a modelopt checkpoint as its fp8 whatever is given"
    article = "an" if method[0] in "aeiou" else "a"
    if method not in VLLM_METHODS:  # (compressed-tensors: no name of this tool's says that format)
        return (f"which vLLM refuses at start-up (it runs {article} {method} checkpoint as {method} only, "
                "which is what --quantization left out runs here)")
    runs = " or ".join((method, *_VLLM_KERNELS.get(method, ())))
    return f"which vLLM refuses at start-up (it runs {article} {method} checkpoint with --quantization {runs} only)"


def _contradiction(config: EngineConfig, stated: Quantization, why: str) -> str:
    name, value = config.quantization_name, str(config.quantization)
    flag = value if name in (None, value) else f"{name} ({value})"
    return (
        f"{config.model}: --quantization {flag} contradicts the checkpoint's own quantization ({stated.value}), "
        f"{why}; leave --quantization out to run the checkpoint as it is quantized, or name an unquantized "
        "checkpoint to model another precision"
    )


def _with_family_switches(config: EngineConfig, rules: FamilyRules, declared_len: int) -> EngineConfig:
    """``config`` with the on/off switches it leaves open (chunked prefill, prefix
    caching, mixed batches, overlap scheduling, full-sequence admission, output-reserving admission,
    free-queue order) set to its engine family's defaults, in its release where it names one."""
    chunked = _given_or(config.enable_chunked_prefill, rules.chunked_prefill_default(declared_len))
    release = engine_release(config)
    return dataclasses.replace(
        config,
        enable_chunked_prefill=chunked,
        enable_prefix_caching=_given_or(config.enable_prefix_caching, rules.prefix_caching),
        mixed_batches=_given_or(config.mixed_batches, rules.mixes_batches(chunked)),
        overlap_schedule=_given_or(config.overlap_schedule, rules.overlap_schedule_in(release)),
        scheduler_reserve_full_isl=_given_or(config.scheduler_reserve_full_isl, rules.reserve_full_sequence_in(release)),
        reserve_outputs=_given_or(config.reserve_outputs, rules.reserve_outputs),
        capacity_scheduler_policy=_given_or(config.capacity_scheduler_policy, rules.capacity_policy),
        evict_unhashed_first=_given_or(config.evict_unhashed_first, rules.evict_unhashed_first_in(release)),
    )


#: PEP 440's shapes vLLM and SGLang use: 0.15, v0.15.1, 0.14.0rc1, 0.4.3.post1, 0.13.0+cu128,
#: 0.10.2rc2.dev123+g1a2b3c4.cpu (a pre-release, then a post-release, then a dev segment,
#: each at most once; a local label after "+")
_RELEASE = re.compile(r"v?(\d+)\.(\d+)(?:\.(?P<patch>\d+))?(?:\.\d+)*(?:\.?(?:a|b|rc)\d*)?(?:\.?post\d*)?(?:\.?dev\d*)?(?:\+(?P<local>[0-9A-Za-z.]+))?")


def parse_release(text: str) -> tuple[int, int]:
    """A release's text as (major, minor); ``ConfigError`` for a text that is not one.
    Only major and minor decide a default, so a dev or pre-release build of 0.14 is read
    as 0.14 (PEP 440 orders it before 0.14.0; a build of main then mostly has what 0.14
    shipped)."""
    m = _RELEASE.fullmatch(text.strip())
    if m is None:
        raise ConfigError(f"engine_version {text!r}: expected a release such as 0.15 or 0.15.1")
    return int(m.group(1)), int(m.group(2))


def release_with_patch(text: str) -> tuple[int, int, int]:
    """A release's text as (major, minor, patch), a missing patch read as 0 (PEP 440's
    0.5 is 0.5.0), for the one default a patch release changed (SGLang 0.5.11's
    context check, ``openai.context.SGLANG_TOTAL_FILLS_SINCE``); ``ConfigError`` as
    ``parse_release``."""
    major, minor = parse_release(text)
    m = _RELEASE.fullmatch(text.strip())
    assert m is not None  # (parse_release matched it)
    return major, minor, int(m.group("patch") or 0)


def release_local_label(text: str) -> str:
    """What follows "+" in a release's text ("cpu" in 0.11.0+cpu, "cu128"), lower case;
    "" when none."""
    m = _RELEASE.fullmatch(text.strip())
    return (m.group("local") or "").lower() if m else ""


def engine_release(config: EngineConfig) -> tuple[int, int] | None:
    """``config.engine_version`` as (major, minor), None when not given; ``ConfigError``
    for a text that is not a release, or a release the family's rules do not cover."""
    text = config.engine_version
    if text is None:
        return None
    release = parse_release(text)
    family = config.engine_family
    # (vLLM before 0.8 is V0's families: a release of theirs names them, and is taken
    # as said though nothing in them is dated, as the release that says which family)
    vllm_v0 = family in (EngineFamily.VLLM_V0, EngineFamily.VLLM_V05)
    if not family.rules.release_dated and not vllm_v0:
        raise ConfigError(
            f"engine_version (--engine-version) {text}: the {family} family has no release-dated defaults, "
            "so a release would change nothing; leave it out"
        )
    belongs = family_for_engine("vllm" if vllm_v0 else family.value, release)
    if belongs is not family:
        raise ConfigError(
            f"engine_version (--engine-version) {text}: that release is the {belongs} family: --engine-family {belongs}")
    return release


#: the KV block sizes the simulated engines take
BLOCK_SIZES = (1, 8, 16, 32, 64, 128)


def _given_or(flag: _T | None, default: _T) -> _T:
    """The flag when given (False included), else the family's default."""
    return default if flag is None else flag


def _validate_flags(config: EngineConfig, max_position_embeddings: int) -> None:
    """Raise ``ConfigError`` for flags vLLM rejects at start-up (before sizes are resolved)."""
    if config.tensor_parallel_size < 1:
        raise ConfigError("tensor_parallel_size must be at least 1")
    if not 0.0 < config.gpu_memory_utilization <= 1.0:
        raise ConfigError("gpu_memory_utilization must be in (0, 1]")
    for name in ("max_model_len", "max_num_batched_tokens", "max_num_seqs", "block_size", "num_scheduler_steps",
                 "num_gpu_blocks_override"):
        value = getattr(config, name)
        if value is not None and value < 1:
            raise ConfigError(f"{name} must be at least 1")
    if config.api_server_count < 1:
        raise ConfigError("api_server_count must be at least 1")
    if not config.host_speed > 0:  # (inf: a front end whose CPU costs nothing; nan refused)
        raise ConfigError("host_speed must be positive")
    if config.api_overhead_s is not None and not 0 <= config.api_overhead_s < math.inf:
        raise ConfigError("api_overhead_s (--api-latency-ms) must be a number, 0 or more")
    # an offline run (vLLM's LLM class) has no API server: its settings would change nothing
    # (but none: no latency, an infinitely fast front end, which is what offline is)
    if config.offline and (
        config.api_server_count != 1 or config.host_speed not in (1.0, math.inf) or config.api_overhead_s
    ):
        raise ConfigError(
            "api_server_count, host_speed and api_overhead_s (--api-server-count, --host-speed, --api-latency-ms) "
            "set the API front end, and an offline run has none (drop them, or serve the run: --served)"
        )
    if config.max_model_len is not None and config.max_model_len > max_position_embeddings:
        raise ConfigError(
            f"User-specified max_model_len ({config.max_model_len}) is greater than the "
            f"derived max_model_len (max_position_embeddings={max_position_embeddings} in "
            "model's config.json)."
        )
    if config.block_size not in BLOCK_SIZES:
        raise ConfigError(f"block_size ({config.block_size}) must be one of {', '.join(map(str, BLOCK_SIZES))}")
