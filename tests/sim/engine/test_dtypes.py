"""Data-type enums: every alias parses to its member, a bad name is a one-line usage error
listing the known names, and parsed values keep their strings in JSON."""

import dataclasses
import json
from pathlib import Path

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
    with pytest.raises(UsageError, match=r"--quantization bf16 \(none\) contradicts the checkpoint's own quantization \(fp8\)"):
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


_CT = "compressed-tensors"
_CT_FP8 = {"quant_method": _CT, "config_groups": {"g": {
    "weights": {"num_bits": 8, "type": "float"}, "input_activations": {"num_bits": 8, "type": "float"}}}}
_CT_W8A16 = {"quant_method": _CT, "config_groups": {"g": {"weights": {"num_bits": 8, "type": "int"}}}}
_AWQ = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True}
_GPTQ4 = {"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True, "desc_act": False}
_GPTQ8 = {**_GPTQ4, "bits": 8}
_MODELOPT = {"quant_method": "modelopt", "quant_algo": "FP8"}


def _checkpoint(folder: Path, quantization_config: dict[str, object]) -> str:
    cfg = {"num_hidden_layers": 28, "hidden_size": 3584, "num_attention_heads": 28, "num_key_value_heads": 4,
           "intermediate_size": 18944, "vocab_size": 152064, "max_position_embeddings": 32768,
           "quantization_config": quantization_config}
    (folder / "config.json").write_text(json.dumps(cfg))
    return str(folder)


@pytest.mark.parametrize(
    ("quantization_config", "flag", "ran"),
    [  # what vLLM's ModelConfig._verify_quantization does with the checkpoint's quant_method and the flag
        # (None: refused); its kernels take the checkpoint's method under their own names
        (_AWQ, "awq", "awq"), (_AWQ, "awq_marlin", "awq"), (_AWQ, "marlin", "awq"),
        (_AWQ, "gptq", None), (_AWQ, "gptq_marlin", None), (_AWQ, "fp8", None),
        (_GPTQ4, "gptq", "gptq"), (_GPTQ4, "gptq_marlin", "gptq"), (_GPTQ4, "marlin", "gptq"),
        (_GPTQ4, "awq_marlin", None), (_GPTQ4, "awq", None),
        (_GPTQ8, "gptq", "w8a16"), (_GPTQ8, "gptq_marlin", "w8a16"), (_GPTQ8, "marlin", "w8a16"),
        (_GPTQ8, "w8a16", "w8a16"),
        (_GPTQ8, "int4", None),  # (this tool's int4 says 4 bits: the checkpoint has 8)
        ({"quant_method": "fp8"}, "fp8", "fp8"),
        ({"quant_method": "fp8"}, "modelopt", None), ({"quant_method": "fp8"}, "fbgemm_fp8", None),
        ({"quant_method": "fbgemm_fp8"}, "fbgemm_fp8", "fp8"), ({"quant_method": "fbgemm_fp8"}, "fp8", None),
        # (ModelOpt FP8 runs as modelopt whatever is given: a name of fp8 is honoured, another would be ignored)
        (_MODELOPT, "modelopt", "fp8"), (_MODELOPT, "fp8", "fp8"), (_MODELOPT, "awq", None),
        # a compressed-tensors checkpoint runs under no other vLLM name than its own
        (_CT_FP8, "fp8", None), (_CT_FP8, "modelopt", None), (_CT_W8A16, "gptq", None), (_CT_W8A16, "marlin", None),
        (_CT_FP8, "fp8-dynamic", "fp8"), (_CT_W8A16, "w8a16", "w8a16"),  # (this tool's words for its scheme)
    ],
)
def test_a_quantization_flag_runs_a_checkpoint_exactly_where_vllm_runs_it(
    tmp_path: Path, quantization_config: dict[str, object], flag: str, ran: str | None
) -> None:
    model = _checkpoint(tmp_path, quantization_config)
    if ran is None:
        with pytest.raises(UsageError, match=f"--quantization {flag}( \\(\\w+\\))? contradicts the checkpoint's own quantization"):
            Engine(EngineConfig(model=model, quantization=flag, max_model_len=4096))
    else:
        assert Engine(EngineConfig(model=model, quantization=flag, max_model_len=4096)).config.quantization == ran


def test_marlin_runs_an_awq_checkpoint_named_so_and_says_what_vllm_runs_on_a_refusal() -> None:
    # vLLM's AWQMarlinConfig takes an AWQ checkpoint under --quantization marlin (a checkpoint
    # known by its -AWQ name is taken as AutoAWQ's, quant_method awq)
    out = CliRunner().invoke(sim, ["run", "--model", "Qwen/Qwen2.5-7B-Instruct-AWQ", "--quantization", "marlin",
                                   "-n", "1", "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["config"]["engine"]["quantization"] == "awq"
    out = CliRunner().invoke(sim, ["run", "--model", "Qwen/Qwen2.5-7B-Instruct-AWQ", "--quantization", "gptq_marlin",
                                   "-n", "1"])
    assert out.exit_code == 2, out.output
    assert "it runs an awq checkpoint with --quantization awq or awq_marlin or marlin only" in out.output


def test_a_compressed_tensors_fp8_checkpoint_refuses_vllms_fp8_with_exit_2(tmp_path: Path) -> None:
    model = _checkpoint(tmp_path, _CT_FP8)
    out = CliRunner().invoke(sim, ["run", "--model", model, "--quantization", "fp8", "-n", "1"])
    assert out.exit_code == 2 and out.output.strip().count("\n") == 0, out.output
    assert "--quantization fp8 contradicts the checkpoint's own quantization (fp8)" in out.output
    assert "compressed-tensors checkpoint as compressed-tensors only, which is what --quantization left out runs" in out.output
    # (the error offers no name the flag refuses: --quantization compressed-tensors is not one of its names)
    offered = CliRunner().invoke(sim, ["run", "--model", model, "--quantization", "compressed-tensors", "-n", "1"])
    assert offered.exit_code == 2 and "unknown quantization 'compressed-tensors'" in offered.output
    assert "--quantization compressed-tensors" not in out.output
    ran = CliRunner().invoke(sim, ["run", "--model", model, "-n", "1", "--json"])
    assert ran.exit_code == 0 and json.loads(ran.output)["config"]["engine"]["quantization"] == "fp8"


def test_a_compressed_tensors_config_spelled_with_an_underscore_is_read_as_vllm_reads_it(tmp_path: Path) -> None:
    # vLLM normalizes compressed_tensors to compressed-tensors before reading the scheme
    model = _checkpoint(tmp_path, {**_CT_FP8, "quant_method": "compressed_tensors"})
    assert Engine(EngineConfig(model=model, max_model_len=4096)).config.quantization is Quantization.FP8


def test_the_cli_reads_flags_by_their_aliases_and_refuses_others_with_exit_2() -> None:
    runner = CliRunner()
    bad = runner.invoke(sim, ["run", "--quantization", "nf4", "-n", "1"])
    assert bad.exit_code == 2 and "unknown quantization 'nf4'; known: fp8," in bad.output
    bad = runner.invoke(sim, ["run", "--engine-family", "tgi", "-n", "1"])
    assert bad.exit_code == 2 and "vllm-v0.5" in bad.output
