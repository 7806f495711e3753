"""Data-type enums: every alias parses to its member, a bad name is a one-line usage error
listing the known names, and parsed values keep their strings in JSON."""

import dataclasses
import json

import pytest
from click.testing import CliRunner

from inferlab._errors import UsageError
from inferlab.cli.sim import sim
from inferlab.sim import Engine, EngineConfig
from inferlab.sim.engine.dtypes import (
    DTYPE_NAMES,
    KV_CACHE_DTYPE_NAMES,
    QUANTIZATION_NAMES,
    SIMULATED_QUANTIZATIONS,
    DType,
    KVCacheDType,
    Quantization,
)

# The names the CLI has always accepted (vLLM's, its checkpoints', benchmark pages'),
# by what they mean: none may be lost.
QUANTIZATIONS = {
    "fp8": ("fp8", "fp8_e4m3", "fp8-dynamic", "fp8_dynamic", "modelopt", "fbgemm_fp8", "w8a8-fp8", "w8a8_fp8"),
    "int8": ("int8", "w8a8", "w8a8-int8", "w8a8_int8", "smoothquant"),
    "w8a16": ("w8a16", "gptq-int8", "gptq_int8"),
    "awq": ("awq", "awq_marlin"),
    "gptq": ("gptq", "gptq_marlin", "marlin", "int4", "w4a16"),
    "none": ("none", "bf16", "bfloat16", "fp16", "float16"),
}
DTYPES = {"auto": ("auto",), "bfloat16": ("bfloat16", "bf16"), "float16": ("float16", "fp16", "half")}
KV_DTYPES = {"auto": ("auto", "bf16", "bfloat16", "fp16", "float16"), "fp8": ("fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc")}

CASES = [
    (Quantization, QUANTIZATION_NAMES, QUANTIZATIONS),
    (DType, DTYPE_NAMES, DTYPES),
    (KVCacheDType, KV_CACHE_DTYPE_NAMES, KV_DTYPES),
]


@pytest.mark.parametrize(("kind", "table", "meanings"), CASES)
def test_every_alias_parses_to_its_member(kind: type, table: dict[str, object], meanings: dict[str, tuple[str, ...]]) -> None:
    assert {n for names in meanings.values() for n in names} == set(table)
    for value, names in meanings.items():
        member = kind(value)
        for name in names:
            assert kind.parse(name) is member  # type: ignore[attr-defined]
            assert kind.parse(f" {name.upper()}\t") is member  # type: ignore[attr-defined]
    for member in kind:  # type: ignore[var-annotated]
        assert kind.parse(member) is member  # type: ignore[attr-defined]
        assert table[member.value] is member


@pytest.mark.parametrize(
    ("parse", "bad", "message"),
    [
        (Quantization.parse, "nf4", "unknown quantization 'nf4'; known: fp8, int8, w8a16, awq, gptq, none (also awq_marlin, bf16,"),
        (DType.parse, "float32", "unknown dtype 'float32'; known: auto, bfloat16, float16 (also bf16, fp16, half)"),
        (KVCacheDType.parse, "int2", "unknown kv_cache_dtype 'int2'; known: auto, fp8 (also bf16,"),
    ],
)
def test_a_bad_name_is_one_line_listing_the_known_ones(parse: object, bad: str, message: str) -> None:
    with pytest.raises(UsageError) as e:
        parse(bad)  # type: ignore[operator]
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_engine_config_reads_strings_into_members_once() -> None:
    cfg = EngineConfig(dtype="half", quantization="awq_marlin", kv_cache_dtype="fp8_e5m2", engine_family="sglang")
    assert cfg.dtype is DType.FLOAT16 and cfg.quantization is Quantization.AWQ
    assert cfg.kv_cache_dtype is KVCacheDType.FP8
    assert EngineConfig().quantization is None  # the checkpoint's
    # JSON keeps the canonical strings
    assert json.loads(json.dumps(dataclasses.asdict(cfg)))["quantization"] == "awq"
    for kw in ({"dtype": "float32"}, {"quantization": "nf4"}, {"kv_cache_dtype": "int2"}):
        with pytest.raises(UsageError):
            EngineConfig(**kw)  # type: ignore[arg-type]


def test_a_checkpoint_states_only_simulated_quantizations_as_members() -> None:
    assert Quantization.NONE not in SIMULATED_QUANTIZATIONS
    assert set(SIMULATED_QUANTIZATIONS) | {Quantization.NONE} == set(Quantization)
    assert [q for q in Quantization if q.is_int4] == [Quantization.AWQ, Quantization.GPTQ]


def test_an_explicit_none_runs_an_unquantized_checkpoint_and_is_refused_for_a_quantized_one() -> None:
    # vLLM cannot run fp8 weights as bf16: it refuses a --quantization the checkpoint contradicts
    fp8 = Engine(EngineConfig(model="neuralmagic/Meta-Llama-3.1-8B-Instruct-FP8", max_model_len=4096))
    bf16 = Engine(EngineConfig(model="meta-llama/Meta-Llama-3.1-8B-Instruct", quantization="bf16", max_model_len=4096))
    assert fp8.config.quantization is Quantization.FP8 and bf16.config.quantization is Quantization.NONE
    assert bf16.sizes.weight_bytes > fp8.sizes.weight_bytes
    with pytest.raises(UsageError, match=r"--quantization none contradicts the checkpoint's own quantization \(fp8\)"):
        Engine(EngineConfig(model="neuralmagic/Meta-Llama-3.1-8B-Instruct-FP8", quantization="bf16", max_model_len=4096))


@pytest.mark.parametrize("flag", ["none", "fp8", "gptq", "int8"])
def test_a_quantization_flag_that_contradicts_a_checkpoint_name_is_refused_with_exit_2(flag: str) -> None:
    # vLLM: "Quantization method specified in the model config (awq) does not match the
    # quantization method specified in the `quantization` argument (fp8)"
    out = CliRunner().invoke(sim, ["run", "--model", "Qwen/Qwen2.5-7B-Instruct-AWQ", "--quantization", flag, "-n", "1"])
    assert out.exit_code == 2, out.output
    line = f"--quantization {flag} contradicts the checkpoint's own quantization (awq)"
    assert line in out.output and out.output.strip().count("\n") == 0


def test_the_names_vllm_lets_through_for_a_checkpoint_run_as_it_is_quantized() -> None:
    # awq_marlin for an AWQ checkpoint, gptq_marlin for an 8-bit GPTQ one (vLLM's kernel for it)
    awq = Engine(EngineConfig(model="Qwen/Qwen2.5-7B-Instruct-AWQ", quantization="awq_marlin", max_model_len=4096))
    assert awq.config.quantization is Quantization.AWQ
    int8 = Engine(EngineConfig(model="Qwen/Qwen2.5-7B-Instruct-GPTQ-Int8", quantization="gptq_marlin", max_model_len=4096))
    assert int8.config.quantization is Quantization.W8A16
    # an unquantized checkpoint may be run (or modelled) quantized: vLLM quantizes fp8 online
    online = Engine(EngineConfig(model="Qwen/Qwen2.5-7B-Instruct", quantization="fp8", max_model_len=4096))
    assert online.config.quantization is Quantization.FP8


def test_the_cli_reads_flags_by_their_aliases_and_refuses_others_with_exit_2() -> None:
    runner = CliRunner()
    bad = runner.invoke(sim, ["run", "--quantization", "nf4", "-n", "1"])
    assert bad.exit_code == 2 and "unknown quantization 'nf4'; known: fp8," in bad.output
    bad = runner.invoke(sim, ["run", "--engine-family", "tgi", "-n", "1"])
    assert bad.exit_code == 2 and "vllm-v0.5" in bad.output
