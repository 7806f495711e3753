import dataclasses
import json
import re
from pathlib import Path

import pytest

from inferlab._errors import UsageError
from inferlab.sim.engine.dtypes import VLLM_METHODS, KVCacheDType, Quantization
from inferlab.sim.engine.hardware import GpuSpec, resolve_gpu, resolve_model
from inferlab.sim.engine.steptime import (
    DEFAULT_EFFICIENCIES,
    RooflineStepTime,
    activation_reserve_bytes,
    kv_bytes_per_token,
    load_efficiencies,
    weight_bytes_per_rank,
)

QWEN7B = "Qwen/Qwen2.5-7B-Instruct"
LLAMA8B = "meta-llama/Llama-3.1-8B-Instruct"
LLAMA70B = "meta-llama/Llama-3.1-70B-Instruct"


def roofline(model: str = QWEN7B, gpu: str = "H100", **kw: object) -> RooflineStepTime:
    return RooflineStepTime(resolve_model(model), resolve_gpu(gpu), **kw)  # type: ignore[arg-type]


# --- hardware -------------------------------------------------------------------------


def test_models_resolve_by_preset_hf_id_and_case_insensitive_name() -> None:
    assert resolve_model("Qwen2.5-7B-Instruct").name == "Qwen2.5-7B-Instruct"
    assert resolve_model(QWEN7B).name == "Qwen2.5-7B-Instruct"
    assert resolve_model(LLAMA8B).name == "Llama-3.1-8B"
    assert resolve_model("someone/llama-3.1-8b-instruct").name == "Llama-3.1-8B"
    assert resolve_model("meta-llama/Llama-2-7b-hf").name == "Llama-2-7B"
    # as benchmark pages and local runners write them
    assert resolve_model("LLaMA v3.1 8B").name == resolve_model("llama3.1:8b").name == "Llama-3.1-8B"
    assert resolve_model("Llama 3.1 70B").name == "Llama-3.1-70B"
    assert resolve_model("Mixtral 8x7B").name == "Mixtral-8x7B"
    # the 2507 checkpoints declare a 262,144-token context; the originals 40,960
    assert resolve_model("Qwen/Qwen3-30B-A3B-Instruct-2507").max_position_embeddings == 262144
    assert resolve_model("Qwen/Qwen3-235B-A22B-Thinking-2507").max_position_embeddings == 262144
    assert resolve_model("Qwen/Qwen3-30B-A3B").max_position_embeddings == 40960


def test_parameter_counts_match_the_presets() -> None:
    presets = json.loads(
        (Path(__file__).parents[3] / "src/inferlab/sim/data/presets.json").read_text()
    )["models"]
    for name, cfg in presets.items():
        if "params_per_layer" not in cfg:
            continue  # some presets carry shapes only; the others also carry their published counts
        spec = resolve_model(name)
        assert spec.params_per_layer == cfg["params_per_layer"], name
        assert spec.params_total == cfg["params_total"], name
        assert kv_bytes_per_token(spec, 1) == cfg["kv_bytes_per_token_bf16"], name


@pytest.mark.parametrize(
    ("model", "published_billions"),
    [  # the sizes their model cards state
        ("01-ai/Yi-34B-Chat", 34.4),
        ("codellama/CodeLlama-34b-Instruct-hf", 33.7),
        ("TinyLlama/TinyLlama-1.1B-Chat-v1.0", 1.1),
        ("microsoft/phi-4", 14.7),
        ("internlm/internlm2_5-7b-chat", 7.7),
        ("ibm-granite/granite-3.1-8b-instruct", 8.2),
        ("THUDM/glm-4-9b-chat", 9.4),
        ("deepseek-ai/DeepSeek-R1-Distill-Llama-8B", 8.0),  # a dense Llama, not the MoE R1
    ],
)
def test_added_presets_have_their_published_sizes(model: str, published_billions: float) -> None:
    assert resolve_model(model).params_total / 1e9 == pytest.approx(published_billions, rel=0.02)


@pytest.mark.parametrize(
    ("model", "total_billions", "active_billions", "card_counts_embeddings"),
    [  # total and activated parameters as their model cards state them
        ("mistralai/Mixtral-8x7B-Instruct-v0.1", 46.7, 12.9, True),
        ("mistralai/Mixtral-8x22B-Instruct-v0.1", 141, 39, True),
        ("Qwen/Qwen3-30B-A3B", 30.5, 3.3, True),
        ("Qwen/Qwen3-235B-A22B", 235, 22, True),
        ("Qwen/Qwen1.5-MoE-A2.7B-Chat", 14.3, 2.7, True),
        ("zai-org/GLM-4.5-Air", 106, 12, False),  # "12B active": its layers alone
    ],
)
def test_mixture_of_experts_presets_have_their_published_sizes(
    model: str, total_billions: float, active_billions: float, card_counts_embeddings: bool
) -> None:
    spec = resolve_model(model)
    assert spec.params_total / 1e9 == pytest.approx(total_billions, rel=0.02)
    active = spec.active_params_total if card_counts_embeddings else spec.num_layers * spec.active_params_per_layer
    assert active / 1e9 == pytest.approx(active_billions, rel=0.05)


# A toy layout counted by hand: hidden 8, 2 query heads and 1 KV head of 4, vocabulary 10,
# 4 layers. Attention per layer: q 8x8 + k 8x4 + v 8x4 + o 8x8 = 192; embedding and LM
# head 80 each; a router 8 x experts; a SwiGLU expert or MLP of width w: 3 x 8 x w.
_TOY = {"hidden_size": 8, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4,
        "vocab_size": 10, "num_hidden_layers": 4, "intermediate_size": 6}


@pytest.mark.parametrize(
    ("family", "keys", "moe_layers", "total"),
    [
        # every layer: 192 + router 32 + 4 experts x 72 = 512; 4 x 512 + 160
        ("mixtral", {"num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 3}, 4, 2208),
        # (i+1) % 2 == 0 and not in mlp_only_layers [1]: layer 3 only; MoE layer
        # 192 + 32 + 288 + shared 3x8x5 = 632, dense layers 192 + 144 = 336
        ("qwen2_moe", {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 3,
                       "shared_expert_intermediate_size": 5, "decoder_sparse_step": 2, "mlp_only_layers": [1]},
         1, 3 * 336 + 632 + 160),
        # i >= first_k_dense_replace 1 and i % moe_layer_freq 2 == 0: layer 2 only; MoE
        # layer 192 + 32 + 288 + one shared expert 72 = 584
        ("deepseek_v2", {"n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 3,
                         "n_shared_experts": 1, "first_k_dense_replace": 1, "moe_layer_freq": 2},
         1, 3 * 336 + 584 + 160),
        # the listed moe_layers [0, 2], not the interleave step 1; MoE layer 192 + 32 +
        # 288 + shared expert 72 = 584, dense layers of intermediate_size_mlp 6 = 336
        ("llama4_text", {"num_local_experts": 4, "num_experts_per_tok": 1, "intermediate_size": 3,
                         "intermediate_size_mlp": 6, "interleave_moe_layer_step": 1, "moe_layers": [0, 2]},
         2, 2 * 584 + 2 * 336 + 160),
    ],
)
def test_each_moe_config_family_is_counted_by_its_own_layer_rule(
    tmp_path: Path, family: str, keys: dict[str, object], moe_layers: int, total: int
) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**_TOY, "model_type": family, **keys}))
    spec = resolve_model(str(tmp_path))
    assert spec.moe_layers == moe_layers
    assert spec.params_total == total


@pytest.mark.parametrize(("experts", "step", "total_billions"), [(16, 1, 109), (128, 2, 400)])
def test_a_llama4_checkpoint_config_reads_its_text_model(
    tmp_path: Path, experts: int, step: int, total_billions: float
) -> None:
    """Llama 4 Scout (16 experts in every layer) and Maverick (128 in every other layer):
    17B active parameters each, as Meta's cards state; the config nests the language
    model under ``text_config``."""
    text = {
        "model_type": "llama4_text", "hidden_size": 5120, "num_hidden_layers": 48,
        "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
        "intermediate_size": 8192, "intermediate_size_mlp": 16384, "vocab_size": 202048,
        "num_local_experts": experts, "num_experts_per_tok": 1, "interleave_moe_layer_step": step,
    }
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama4", "text_config": text}))
    spec = resolve_model(str(tmp_path))
    assert spec.params_total / 1e9 == pytest.approx(total_billions, rel=0.02)
    assert spec.active_params_total / 1e9 == pytest.approx(17, rel=0.03)


def _moe_config(experts: int, top_k: int) -> dict[str, object]:
    return {  # a Mixtral-style layout: every layer's MLP is ``experts`` SwiGLU experts
        "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
        "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 32000,
        "num_local_experts": experts, "num_experts_per_tok": top_k,
    }


def test_mixture_of_experts_reads_the_chosen_experts_and_computes_the_active_ones(tmp_path: Path) -> None:
    """Decode at batch 1 streams the weights of the 2 experts a token chose, so Mixtral
    decodes like a ~13B dense model; a large batch touches every expert, and its prefill
    does the FLOPs of the active parameters, not of all 47B."""
    (tmp_path / "moe.json").write_text(json.dumps(_moe_config(8, 2)))
    dense_cfg = {**_moe_config(8, 2), "intermediate_size": 8 * 14336}  # all 47B in every token's path
    del dense_cfg["num_local_experts"], dense_cfg["num_experts_per_tok"]
    (tmp_path / "dense.json").write_text(json.dumps(dense_cfg))
    moe, dense = (RooflineStepTime(resolve_model(str(tmp_path / f)), resolve_gpu("H100"), tp=2) for f in ("moe.json", "dense.json"))
    assert moe.model.params_total == pytest.approx(dense.model.params_total, rel=1e-3)
    one = [(1, 1000)]
    assert moe.step_time_s(one, 1) < 0.45 * dense.step_time_s(one, 1)
    # 256 decodes choose nearly every expert: the weights read approach the dense twin's
    many = [(1, 1000)] * 256
    assert moe.step_time_s(many, 256) > 0.8 * dense.step_time_s(many, 256)
    prefill = [(8192, 0)]
    assert moe.step_time_s(prefill, 1) < 0.5 * dense.step_time_s(prefill, 1)


def test_the_experts_a_step_reads_grow_like_distinct_choices(tmp_path: Path) -> None:
    """Qwen3-30B-A3B, 8 of 128 experts per token, on a card with compute to spare (weights
    dominate): 16 tokens touch 128·(1 − (120/128)^16) ≈ 82 experts, not all 128 (a linear
    count would) nor 15 (one expert per token would); 128 tokens touch nearly all."""
    (tmp_path / "gpu.json").write_text(json.dumps({"bf16_dense_tflops": 1e9, "hbm_gb": 200, "hbm_bw_tbs": 3.35}))
    quiet = dataclasses.replace(DEFAULT_EFFICIENCIES, per_seq_s=0.0)  # no per-sequence host cost
    st = RooflineStepTime(resolve_model("Qwen/Qwen3-30B-A3B"), resolve_gpu(str(tmp_path / "gpu.json")),
                          efficiencies=quiet, serving=False)

    def step(tokens: int) -> float:
        return st.step_time_s([(1, 1)] * tokens, 1)

    grown = (step(16) - step(1)) / (step(128) - step(1))
    expected = ((1 - (120 / 128) ** 16) - 8 / 128) / ((1 - (120 / 128) ** 128) - 8 / 128)
    assert grown == pytest.approx(expected, abs=0.05)


def test_the_moe_constants_move_the_step_time(tmp_path: Path) -> None:
    """The fused-MoE rate stretches the expert part of a Mixtral decode step; routing adds
    its fixed cost once per MoE layer."""
    mixtral, gpu = resolve_model("Mixtral-8x7B"), resolve_gpu("H100")
    one, prefill = [(1, 500)], [(8192, 0)]

    def step(seqs: list[tuple[int, int]] = one, **changes: float) -> float:
        eff = dataclasses.replace(DEFAULT_EFFICIENCIES, **changes)
        return RooflineStepTime(mixtral, gpu, tp=2, efficiencies=eff).step_time_s(seqs, 1)

    assert step(moe_gemm_factor=0.4) > 1.3 * step(moe_gemm_factor=0.8)  # streaming the experts
    assert step(prefill, moe_gemm_factor=0.4) > 1.3 * step(prefill, moe_gemm_factor=0.8)  # computing them
    no_routing = step(moe_routing_per_layer_s=0.0)
    assert step(moe_routing_per_layer_s=15e-6) - no_routing == pytest.approx(32 * 15e-6, rel=0.01)


def test_a_moe_profile_run_reserves_the_fused_expert_buffers() -> None:
    """vLLM's fused-MoE kernels hold, per token of the profile batch, k gate/up outputs
    (2·w each) and k permuted copies of the hidden state: at least that much activation
    memory stays out of the KV cache (Qwen3-30B-A3B: k 8, w 768, h 2048)."""
    spec = resolve_model("Qwen/Qwen3-30B-A3B")
    tokens = 8192
    reserve = activation_reserve_bytes(spec, 1, tokens, 1) - DEFAULT_EFFICIENCIES.reserve_fixed_bytes
    assert reserve >= tokens * 2 * 8 * (2 * 768 + 2048)


def test_mixture_of_experts_weights_all_count_against_memory() -> None:
    mixtral = resolve_model("Mixtral-8x7B")
    assert weight_bytes_per_rank(mixtral, 1) / 2**30 == pytest.approx(2 * 46.7e9 / 2**30, rel=0.02)
    with pytest.raises(ValueError, match="weights need"):
        from inferlab.sim.engine.engine import Engine, EngineConfig

        Engine(EngineConfig(model="Mixtral-8x7B", gpu="H100"))  # 87 GiB on one 80 GB card


def test_architectures_the_model_does_not_cover_are_refused_by_name(tmp_path: Path) -> None:
    cfg = {**_moe_config(256, 8), "kv_lora_rank": 512, "n_routed_experts": 256}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UsageError, match="latent attention"):
        resolve_model(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({**_moe_config(32, 4), "model_type": "gpt_oss"}))
    with pytest.raises(UsageError, match="gpt-oss"):
        resolve_model(str(tmp_path))
    for hybrid in ({"model_type": "jamba", "attn_layer_period": 8},
                   {"model_type": "qwen3_next", "full_attention_interval": 4},
                   {"layer_types": ["linear_attention", "full_attention"] * 16}):
        (tmp_path / "config.json").write_text(json.dumps({**_moe_config(16, 2), **hybrid}))
        with pytest.raises(UsageError, match="hybrid"):
            resolve_model(str(tmp_path))
    ernie = {k: v for k, v in _moe_config(64, 6).items() if k not in ("num_local_experts", "num_experts_per_tok")}
    (tmp_path / "config.json").write_text(json.dumps({**ernie, "moe_num_experts": 64, "moe_k": 6}))
    with pytest.raises(UsageError, match="not read"):
        resolve_model(str(tmp_path))


def test_model_from_a_config_json(tmp_path: Path) -> None:
    cfg = {
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        "vocab_size": 1000,
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    spec = resolve_model(str(tmp_path))
    assert spec.num_kv_heads == 4 and spec.head_dim == 16
    assert spec.params_per_layer == 4 * 64 * 64 + 3 * 64 * 128


@pytest.mark.parametrize(
    ("quantization_config", "kind"),
    [  # what vLLM reads from a checkpoint when --quantization is not given
        ({"quant_method": "awq", "bits": 4}, "awq"),
        ({"quant_method": "gptq", "bits": 8}, "w8a16"),
        ({"quant_method": "fp8"}, "fp8"),
        ({"quant_method": "modelopt", "quant_algo": "FP8"}, "fp8"),
        ({"quant_method": "compressed-tensors", "config_groups": {"g": {
            "weights": {"num_bits": 8, "type": "float"}, "input_activations": {"num_bits": 8, "type": "float"}}}}, "fp8"),
        ({"quant_method": "compressed-tensors", "config_groups": {"g": {
            "weights": {"num_bits": 8, "type": "int"}, "input_activations": {"num_bits": 8, "type": "int"}}}}, "int8"),
        ({"quant_method": "compressed-tensors", "config_groups": {"g": {
            "weights": {"num_bits": 4, "type": "int"}, "input_activations": None}}}, "gptq"),
    ],
)
def test_a_checkpoint_config_states_its_own_quantization(
    tmp_path: Path, quantization_config: dict[str, object], kind: str
) -> None:
    from inferlab.sim.engine.engine import Engine, EngineConfig

    cfg = {"num_hidden_layers": 28, "hidden_size": 3584, "num_attention_heads": 28, "num_key_value_heads": 4,
           "intermediate_size": 18944, "vocab_size": 152064, "max_position_embeddings": 32768,
           "quantization_config": quantization_config}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert Engine(EngineConfig(model=str(tmp_path))).config.quantization == kind
    # a flag naming the checkpoint's own runs it; one that contradicts it is refused, as vLLM refuses it
    own = {"w8a16": "gptq"}.get(kind, kind)  # (vLLM's gptq names the format, 8-bit or not)
    if quantization_config["quant_method"] == "compressed-tensors" and own in VLLM_METHODS:
        # vLLM runs a compressed-tensors checkpoint under no other name (fp8 and gptq are refused)
        with pytest.raises(UsageError, match=f"--quantization {own} contradicts .* compressed-tensors checkpoint") as e:
            Engine(EngineConfig(model=str(tmp_path), quantization=own))
        # (the name the error offers is one the flag takes: compressed-tensors is not, so it says to leave it out)
        assert "--quantization compressed-tensors" not in str(e.value)
        assert "--quantization left out" in str(e.value)
    else:
        assert Engine(EngineConfig(model=str(tmp_path), quantization=own)).config.quantization == kind
    other = "awq" if kind != "awq" else "fp8"
    with pytest.raises(UsageError, match=f"--quantization {other} contradicts the checkpoint's own quantization \\({kind}\\)"):
        Engine(EngineConfig(model=str(tmp_path), quantization=other))


def test_a_checkpoint_quantized_another_way_says_so(tmp_path: Path) -> None:
    from inferlab.sim.engine.engine import Engine, EngineConfig

    cfg = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128,
           "vocab_size": 1000, "quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": True}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UsageError, match="'bitsandbytes' is not simulated; give --quantization"):
        Engine(EngineConfig(model=str(tmp_path)))


def test_unknown_names_are_usage_errors_listing_the_known_ones() -> None:
    with pytest.raises(UsageError, match=r"Qwen2\.5-7B-Instruct") as e:
        resolve_model("nobody/NoSuchModel-3B")
    assert "\n" not in str(e.value)
    with pytest.raises(UsageError, match="H100"):
        resolve_gpu("TPUv5")


def test_gpus_resolve_by_short_and_preset_names_and_from_a_file(tmp_path: Path) -> None:
    assert resolve_gpu("H100").name == "H100-SXM-80GB"
    assert resolve_gpu("h200").hbm_bytes_per_s == pytest.approx(4.8e12)
    assert resolve_gpu("A100-80G").name == resolve_gpu("A100").name == "A100-SXM-80GB"
    assert resolve_gpu("4090").name == resolve_gpu("RTX4090").name == "RTX-4090-24GB"
    # as published results and nvidia-smi write them
    for text, preset in (("A100-SXM4-80GB", "A100-SXM-80GB"), ("NVIDIA H100 80GB HBM3", "H100-SXM-80GB"),
                         ("H100 PCIe", "H100-PCIe-80GB"), ("NVIDIA GeForce RTX 4090", "RTX-4090-24GB"),
                         ("NVIDIA L40S", "L40S-48GB"), ("A100-PCIE-40GB", "A100-SXM-40GB")):
        assert resolve_gpu(text).name == preset, text
    for unknown in ("A10G", "GH200", "./h100.json", "NVIDIA RTX A1000", "NVIDIA GeForce RTX 4090 Laptop GPU",
                    "NVIDIA H800 PCIe", "A800 PCIe 40GB", "H100 96GB"):  # other cards that share a name's letters
        with pytest.raises(UsageError, match="unknown GPU"):
            resolve_gpu(unknown)
    assert resolve_gpu("L40S-48GB").fp8_flops_per_s == pytest.approx(733e12)
    assert resolve_gpu("H100").bus_bytes_per_s > 10 * resolve_gpu("L40S").bus_bytes_per_s
    spec = {"bf16_dense_tflops": 100, "hbm_gb": 32, "hbm_bw_tbs": 1.0, "bus_bw_gbs": 50}
    (tmp_path / "mygpu.json").write_text(json.dumps(spec))
    gpu = resolve_gpu(str(tmp_path / "mygpu.json"))
    assert gpu.name == "mygpu" and gpu.fp8_flops_per_s is None
    assert gpu.bus_bytes_per_s == pytest.approx(50e9)


def test_gddr_cards_stream_a_larger_share_of_their_bandwidth_but_never_above_a_copy(tmp_path: Path) -> None:
    """Batch-1 decode on an L40S against an HBM card with the L40S's datasheet: ~12 %
    faster (measured vLLM decode on RTX 4090 and L4 ran 11-17 % faster than the HBM-fit
    model); a card claiming any larger factor still streams weights below 0.92 of its
    bandwidth, what a plain copy reaches."""
    gpu = resolve_gpu("L40S")
    twin = {"bf16_dense_tflops": 362, "fp8_dense_tflops": 733, "hbm_gb": 48, "hbm_bw_tbs": 0.864}
    (tmp_path / "hbm.json").write_text(json.dumps(twin))
    (tmp_path / "fast.json").write_text(json.dumps({**twin, "stream_factor": 3.0}))
    model = resolve_model(LLAMA8B)
    decode = [(1, 200)]
    l40s, hbm, fast = (RooflineStepTime(model, g).step_time_s(decode, 1) for g in (gpu, resolve_gpu(str(tmp_path / "hbm.json")), resolve_gpu(str(tmp_path / "fast.json"))))
    assert resolve_gpu(str(tmp_path / "hbm.json")).stream_factor == 1.0 < gpu.stream_factor
    assert 0.85 * hbm < l40s < 0.93 * hbm
    long = [(1, 100_000)]  # the KV cache streams too
    assert RooflineStepTime(model, gpu).step_time_s(long, 1) < 0.93 * RooflineStepTime(
        model, resolve_gpu(str(tmp_path / "hbm.json"))).step_time_s(long, 1)
    weights_bytes = weight_bytes_per_rank(model, 1)
    assert fast > weights_bytes / (0.92 * 0.864e12)


def test_card_variants_differ_where_their_datasheets_do() -> None:
    """PCIe and export cards share a name with the SXM part but not its memory system or
    tensor cores: decode follows HBM bandwidth, long prefill follows tensor throughput."""
    decode = [(1, 512)] * 8
    prefill = [(4096, 0)]

    def times(gpu: str) -> tuple[float, float]:
        st = roofline(gpu=gpu)
        return st.step_time_s(decode, 8), st.step_time_s(prefill, 1)

    sxm, pcie, h20 = times("H100"), times("H100-PCIe"), times("H20")
    assert pcie[0] > 1.4 * sxm[0] and pcie[1] > 1.2 * sxm[1]  # 2.0 vs 3.35 TB/s, 756 vs 989 TF
    assert h20[0] < sxm[0] and h20[1] > 4 * sxm[1]  # 4.0 TB/s but 148 TF
    assert resolve_gpu("A100-40G").hbm_bytes < 0.55 * resolve_gpu("A100").hbm_bytes
    assert resolve_gpu("L4").fp8_flops_per_s and resolve_gpu("A10").fp8_flops_per_s is None


# --- memory ---------------------------------------------------------------------------


def test_weight_and_kv_bytes_follow_precision_and_tp() -> None:
    m = resolve_model(LLAMA70B)
    bf16 = weight_bytes_per_rank(m, 1)
    assert bf16 == pytest.approx(m.params_total * 2)
    assert weight_bytes_per_rank(m, 4) == pytest.approx(bf16 / 4)
    assert weight_bytes_per_rank(m, 1, Quantization.FP8) < 0.55 * bf16
    assert weight_bytes_per_rank(m, 1, Quantization.AWQ) < 0.3 * bf16
    assert weight_bytes_per_rank(m, 1, Quantization.NONE) == bf16
    assert kv_bytes_per_token(m, 1, KVCacheDType.FP8) * 2 == kv_bytes_per_token(m, 1)
    assert kv_bytes_per_token(m, 2) * 2 == kv_bytes_per_token(m, 1)
    # 8 KV heads: beyond TP 8 they are replicated, not split further
    assert kv_bytes_per_token(m, 16) == kv_bytes_per_token(m, 8)


# --- step time ------------------------------------------------------------------------


def test_decode_is_bounded_below_by_streaming_the_weights_at_peak_bandwidth() -> None:
    for model, gpu in [(QWEN7B, "H100"), (LLAMA8B, "A100"), (LLAMA8B, "H200")]:
        st = roofline(model, gpu)
        floor_s = weight_bytes_per_rank(st.model, 1) / st.gpu.hbm_bytes_per_s
        t = st.step_time_s([(1, 500)], 1)
        assert floor_s < t < 2 * floor_s, (model, gpu)


def test_prefill_is_bounded_below_by_its_flops_at_peak() -> None:
    st = roofline(LLAMA8B, "H100")
    flops = 2 * 1000 * st.model.num_layers * st.model.params_per_layer
    t = st.step_time_s([(1000, 0)], 1)
    assert flops / st.gpu.bf16_flops_per_s < t < 4 * flops / st.gpu.bf16_flops_per_s


def test_step_time_grows_with_prompt_length_batch_and_context() -> None:
    st = roofline()
    prefill = [st.step_time_s([(n, 0)], 1) for n in (16, 256, 1024, 4096, 8192)]
    assert prefill == sorted(prefill) and prefill[-1] > 10 * prefill[1]
    decode = [st.step_time_s([(1, 1000)] * b, b) for b in (1, 8, 64, 256)]
    assert decode == sorted(decode) and decode[-1] > decode[0]
    context = [st.step_time_s([(1, c)] * 32, 32) for c in (100, 4000, 30_000)]
    assert context == sorted(context) and context[-1] > 1.5 * context[0]
    assert st.step_time_s([], 0) == 0.0


def test_tensor_parallelism_lowers_decode_time_for_a_70b_model() -> None:
    batch = [(1, 1000)] * 8
    tp1, tp2, tp4 = (roofline(LLAMA70B, tp=t).step_time_s(batch, 8) for t in (1, 2, 4))
    assert tp1 > tp2 > tp4
    assert tp2 > tp1 / 2  # all-reduces and fixed costs do not shrink with TP
    with pytest.raises(ValueError, match="divisible"):
        roofline(LLAMA70B, tp=3)


def test_quantization_lowers_batch1_decode_but_int4_loses_at_large_batch() -> None:
    one = [(1, 500)]
    bf16, int4, fp8 = (roofline(quantization=q).step_time_s(one, 1) for q in (None, Quantization.AWQ, Quantization.FP8))
    assert int4 < fp8 < bf16
    big = [(1, 500)] * 64 + [(4096, 0)]
    assert roofline(quantization=Quantization.GPTQ).step_time_s(big, 65) > roofline().step_time_s(big, 65)
    assert roofline(quantization=Quantization.FP8).step_time_s(big, 65) < roofline().step_time_s(big, 65)


def test_fp8_kv_cache_lowers_long_context_decode_time() -> None:
    batch = [(1, 32_000)] * 64
    assert roofline(kv_cache_dtype=KVCacheDType.FP8).step_time_s(batch, 64) < roofline().step_time_s(batch, 64)


def test_eager_mode_costs_more_than_cuda_graphs() -> None:
    assert roofline(enforce_eager=True).step_time_s([(1, 10)], 1) > roofline().step_time_s(
        [(1, 10)], 1
    )


def test_non_emitting_chunk_skips_lm_head_and_sampler() -> None:
    st = roofline()
    assert st.step_time_s([(512, 0)], 0) < st.step_time_s([(512, 0)], 1)


def test_efficiencies_load_from_json(tmp_path: Path) -> None:
    path = tmp_path / "eff.json"
    path.write_text(json.dumps({"weight_stream": 0.5, "cpu_step_s": 0.001}))
    eff = load_efficiencies(path)
    assert eff.weight_stream == 0.5 and eff.cpu_step_s == 0.001
    assert eff.gemm_compute == DEFAULT_EFFICIENCIES.gemm_compute
    slower = roofline(efficiencies=eff).step_time_s([(1, 10)], 1)
    assert slower > roofline().step_time_s([(1, 10)], 1)
    path.write_text(json.dumps({"warp_speed": 9}))
    with pytest.raises(UsageError, match="warp_speed"):
        load_efficiencies(path)
    path.write_text(json.dumps({"weight_stream": "fast"}))
    with pytest.raises(UsageError, match="numbers"):
        load_efficiencies(path)


def test_an_unusable_gpu_file_is_named_by_its_path(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"hbm_gb": 32}))
    with pytest.raises(UsageError, match=rf"^{re.escape(str(bad))}: not a usable GPU spec \('bf16_dense_tflops' missing\)$"):
        resolve_gpu(str(bad))
    bad.write_text(json.dumps({"name": "X", "bf16_dense_tflops": "fast", "hbm_gb": 32, "hbm_bw_tbs": 1}))
    with pytest.raises(UsageError, match=rf"^{re.escape(str(bad))}: not a usable GPU spec \(invalid value"):
        resolve_gpu(str(bad))


@pytest.mark.parametrize(
    ("name", "preset", "quant"),
    [
        ("meta-llama/Meta-Llama-3.1-8B-Instruct", "Llama-3.1-8B", None),
        ("meta-llama/Llama-3.3-70B-Instruct", "Llama-3.1-70B", None),
        ("hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4", "Llama-3.1-70B", "awq"),
        ("neuralmagic/Meta-Llama-3.1-8B-Instruct-FP8", "Llama-3.1-8B", "fp8"),
        ("Qwen/Qwen2.5-72B-Instruct-GPTQ-Int4", "Qwen2.5-72B-Instruct", "gptq"),
        ("Qwen/Qwen2.5-72B-Instruct-GPTQ-Int8", "Qwen2.5-72B-Instruct", "w8a16"),
        ("RedHatAI/Llama-3.1-8B-Instruct-quantized.w4a16", "Llama-3.1-8B", "gptq"),
        ("meta-llama/Llama-2-7b-chat-hf", "Llama-2-7B", None),
        ("meta-llama/Meta-Llama-3-8B-Instruct", "Meta-Llama-3-8B", None),
        ("deepseek-ai/DeepSeek-R1-Distill-Qwen-32B", "Qwen2.5-32B-Instruct", None),
        ("google/gemma-2-9b-it", "Gemma-2-9B", None),
        ("mistralai/Mistral-7B-Instruct-v0.2", "Mistral-7B-Instruct-v0.3", None),
    ],
)
def test_checkpoint_names_map_to_base_shapes_and_their_quantization(name: str, preset: str, quant: str | None) -> None:
    from inferlab.sim.engine.hardware import quantization_from_name

    assert resolve_model(name).name == preset
    assert quantization_from_name(name) == quant


def test_a_quantized_checkpoint_name_is_simulated_quantized() -> None:
    from inferlab.sim.engine.engine import Engine, EngineConfig

    named = Engine(EngineConfig(model="Qwen/Qwen2.5-7B-Instruct-AWQ", max_model_len=4096))
    plain = Engine(EngineConfig(model="Qwen/Qwen2.5-7B-Instruct", max_model_len=4096))
    assert named.config.quantization == "awq" and plain.config.quantization is None
    assert named.kv_capacity_tokens > plain.kv_capacity_tokens  # int4 weights leave more room
    with pytest.raises(UsageError, match=r"--quantization gptq contradicts the checkpoint's own quantization \(awq\)"):
        Engine(EngineConfig(model="Qwen/Qwen2.5-7B-Instruct-AWQ", quantization="gptq", max_model_len=4096))


def test_a_gpu_file_that_is_not_there_is_called_missing_and_the_names_are_listed() -> None:
    for name in ("nonexist.json", "gpus/h100.json"):
        with pytest.raises(UsageError) as e:
            resolve_gpu(name)
        msg = str(e.value)
        assert msg.startswith(f"unknown GPU {name!r}: no such file; a GPU is a JSON file with the preset keys, or one of: H100, H200,")
    with pytest.raises(UsageError, match=r"^unknown GPU 'TPUv5'; known: H100"):  # a name stays a name
        resolve_gpu("TPUv5")


def test_decode_compute_makes_each_decode_row_pay_its_own_gemm_work() -> None:
    # llama.cpp on one CPU thread: a batch of eight decodes costs about eight times one.
    # With decode_compute low, a one-token row costs its FLOPs at that rate, unshared;
    # left at 0 (GPUs), a batch of decodes shares the weight reads and costs little more.
    shared = roofline(LLAMA8B, "H100")
    rowwise = roofline(LLAMA8B, "H100", efficiencies=dataclasses.replace(DEFAULT_EFFICIENCIES, decode_compute=0.001))
    def batch(st: RooflineStepTime, b: int) -> float:
        return st.step_time_s([(1, 200)] * b, b)
    assert batch(shared, 8) < 1.5 * batch(shared, 1)
    assert batch(rowwise, 8) > 6 * batch(rowwise, 1)
    # the same rows given as sums (the steady path) cost the same
    assert rowwise.step_time_s([], 8, decodes=8, decode_context=8 * 200) == pytest.approx(batch(rowwise, 8))
    # prompt rows keep the GEMM rate: a 2,048-token prefill that emits nothing is unchanged
    assert rowwise.step_time_s([(2048, 0)], 0) == pytest.approx(shared.step_time_s([(2048, 0)], 0))


def test_h200_decodes_faster_than_h100_by_less_than_its_datasheet_bandwidth(tmp_path: Path) -> None:
    """H200 reaches a smaller share of its 4.8 TB/s than H100 of its 3.35 (the fitted
    factor): a memory-bound decode step is faster on H200, but by less than 4.8/3.35, and
    the same card stated as a spec file without the factor decodes faster still."""
    model = resolve_model(LLAMA8B)
    decode = [(1, 2048)] * 32
    h100, h200 = resolve_gpu("H100"), resolve_gpu("H200")
    assert h200.stream_factor < 1.0 == h100.stream_factor
    t100 = RooflineStepTime(model, h100).step_time_s(decode, 32)
    t200 = RooflineStepTime(model, h200).step_time_s(decode, 32)
    assert t200 < t100 and t100 / t200 < h200.hbm_bytes_per_s / h100.hbm_bytes_per_s
    spec = {"bf16_dense_tflops": 989.4, "fp8_dense_tflops": 1978.9, "hbm_gb": 141, "hbm_bw_tbs": 4.8}
    (tmp_path / "h200.json").write_text(json.dumps(spec))
    plain = resolve_gpu(str(tmp_path / "h200.json"))
    assert plain.stream_factor == 1.0
    assert RooflineStepTime(model, plain).step_time_s(decode, 32) < t200


@pytest.mark.parametrize("factor", [0, -1.0, "fast"])
def test_a_gpu_spec_stating_an_unusable_stream_factor_is_refused(tmp_path: Path, factor: object) -> None:
    """A stated factor is used as stated (1.0 included, on any card), and one at or below
    zero, or not a number, is a usage error rather than the card's default."""
    spec = {"bf16_dense_tflops": 989.4, "hbm_gb": 141, "hbm_bw_tbs": 4.8}
    (tmp_path / "as_is.json").write_text(json.dumps({**spec, "stream_factor": 1}))
    assert resolve_gpu(str(tmp_path / "as_is.json")).stream_factor == 1.0
    (tmp_path / "bad.json").write_text(json.dumps({**spec, "stream_factor": factor}))
    with pytest.raises(UsageError, match="stream_factor"):
        resolve_gpu(str(tmp_path / "bad.json"))


def test_geforce_cards_all_reduce_through_host_memory(tmp_path: Path) -> None:
    """A GeForce card has no peer-to-peer access: at TP 2 and up a decode step pays each
    all-reduce at the host-memory latency, several times NVLink's 10 us, growing with the
    ring as 2(t-1)/t; at TP 1 nothing changes. A spec file may state either, and a
    statement that is no true or false is refused."""
    model = resolve_model(LLAMA8B)
    twin = {"bf16_dense_tflops": 165.2, "fp8_dense_tflops": 330.3, "hbm_gb": 24, "hbm_bw_tbs": 1.008,
            "bus_bw_gbs": 25, "stream_factor": resolve_gpu("4090").stream_factor}
    (tmp_path / "p2p.json").write_text(json.dumps({**twin, "peer_to_peer": True}))
    (tmp_path / "no_p2p.json").write_text(json.dumps({**twin, "peer_to_peer": False}))
    rtx, p2p, stated = resolve_gpu("4090"), resolve_gpu(str(tmp_path / "p2p.json")), resolve_gpu(str(tmp_path / "no_p2p.json"))
    assert not rtx.peer_to_peer and p2p.peer_to_peer and not stated.peer_to_peer
    assert resolve_gpu("H100").peer_to_peer and resolve_gpu("L40S").peer_to_peer
    decode = [(1, 200)] * 4

    def step(gpu: GpuSpec, tp: int) -> float:
        return RooflineStepTime(model, gpu, tp=tp).step_time_s(decode, 4)

    assert step(rtx, 1) == step(p2p, 1)
    assert step(stated, 2) == step(rtx, 2)
    extra = {tp: step(rtx, tp) - step(p2p, tp) for tp in (2, 4, 8)}
    ar_per_step = 2 * model.num_layers  # two all-reduces a layer
    assert extra[2] > ar_per_step * 4 * 10e-6  # several times the P2P latency each
    assert extra[2] < extra[4] < extra[8] < 2 * extra[2]  # the ring's 2(t-1)/t: 1, 1.5, 1.75
    (tmp_path / "bad.json").write_text(json.dumps({**twin, "peer_to_peer": "no"}))
    with pytest.raises(UsageError, match="peer_to_peer"):
        resolve_gpu(str(tmp_path / "bad.json"))


def test_a_presets_memory_is_the_total_the_card_reports_with_its_source() -> None:
    """nvidia-smi's memory.total, not the datasheet's GB read as GiB: an L40S ("48GB")
    reports 46,068 MiB, an H100 ("80GB") 81,559 MiB; an A100 80GB does report 80 GiB."""
    from inferlab.sim.engine.hardware import gpu_memory_source, gpu_presets

    gib = 2**30
    assert 44.9 * gib < resolve_gpu("L40S").hbm_bytes < 45 * gib
    assert 79.6 * gib < resolve_gpu("H100").hbm_bytes < 79.7 * gib
    assert resolve_gpu("A100").hbm_bytes == 80 * gib
    assert resolve_gpu("L4").hbm_bytes < 22.5 * gib and resolve_gpu("A10").hbm_bytes < 22.5 * gib
    sourced = [name for name in gpu_presets() if gpu_memory_source(name) is not None]
    assert {"L40S-48GB", "H100-SXM-80GB", "H200-SXM-141GB", "RTX-4090-24GB", "B200-180GB"} <= set(sourced)
    assert all("https://" in str(gpu_memory_source(name)) for name in sourced)


def test_a_gpu_file_reads_hbm_gb_as_gib_and_memory_mib_as_reported(tmp_path: Path) -> None:
    spec = {"bf16_dense_tflops": 362, "hbm_gb": 48, "hbm_bw_tbs": 0.864}
    old = tmp_path / "old.json"
    old.write_text(json.dumps(spec))
    assert resolve_gpu(str(old)).hbm_bytes == 48 * 2**30  # (files written before memory_mib: as they ran)
    new = tmp_path / "new.json"
    new.write_text(json.dumps({**spec, "memory_mib": 46068}))
    assert resolve_gpu(str(new)).hbm_bytes == 46068 * 2**20
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**spec, "memory_mib": 0}))
    with pytest.raises(UsageError, match="memory_mib must be a number above 0"):
        resolve_gpu(str(bad))


def test_an_l40s_holds_fewer_kv_blocks_than_48_gib_would(tmp_path: Path) -> None:
    from inferlab.sim.engine.engine import Engine, EngineConfig

    as_48 = tmp_path / "l40s-48gib.json"
    as_48.write_text(json.dumps({"name": "L40S-48GB", "bf16_dense_tflops": 362.05, "fp8_dense_tflops": 733,
                                 "hbm_gb": 48, "hbm_bw_tbs": 0.864}))
    l40s = Engine(EngineConfig(gpu="L40S", max_model_len=4096))
    assert l40s.kv_capacity_tokens < 0.9 * Engine(EngineConfig(gpu=str(as_48), max_model_len=4096)).kv_capacity_tokens
