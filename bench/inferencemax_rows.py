"""Write ``bench/data/published_inferencemax.csv`` from InferenceMAX's published results.

SemiAnalysis's InferenceMAX ran vLLM 0.10.2 nightly on Llama-3.3-70B-Instruct FP8 (random
prompts of 1k/1k, 1k/8k and 8k/1k tokens, closed loops of 4 to 64 users) and published
each night's GitHub Actions run on inferencemax.semianalysis.com; the runs' artifacts are
not kept in its repository and have expired. ``denosys/InferenceMAX`` downloaded the
aggregated artifacts of one night (runs 18577107964, 18577199847, 18577146883) and
committed them; this script reads those three files and writes one row per vLLM FP8
record on H100 and H200 (every tensor-parallel size and concurrency there is; B200's
server flags differ and are not written here)::

    BASE=https://raw.githubusercontent.com/denosys/InferenceMAX/f42938101097e8c1f7148450a8a6b62fa954992e/docs/data
    curl -sLo 70b_1k1k.json $BASE/18577107964-4295924251-results_70b_1k1k__agg_70b_1k1k.json
    curl -sLo 70b_1k8k.json $BASE/18577199847-4302624689-results_70b_1k8k__agg_70b_1k8k.json
    curl -sLo 70b_8k1k.json $BASE/18577146883-4297902145-results_70b_8k1k__agg_70b_8k1k.json
    python bench/inferencemax_rows.py DIR bench/data/published_inferencemax.csv

Every number is the source's; the only arithmetic is seconds to ms and InferenceMAX's
per-GPU throughputs back to the server's (times TP: its ``utils/process_result.py``
divides by TP). The server flags and the client's settings are read from InferenceMAX's
scripts of that week (SemiAnalysisAI/InferenceX, the repository's later name, commit
b13bcafe): ``vllm serve --gpu-memory-utilization 0.9 --tensor-parallel-size TP
--max-num-seqs CONC`` with ``kv-cache-dtype: fp8``, ``async-scheduling``, prefix caching
off, ``max-num-batched-tokens: 8192``; the client ``benchmark_serving.py --dataset-name
random --random-range-ratio 0.8 --ignore-eos --max-concurrency CONC --num-prompts
10*CONC`` (lengths uniform in [0.8 L, L]).
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

MIRROR = "https://github.com/denosys/InferenceMAX/blob/f42938101097e8c1f7148450a8a6b62fa954992e/docs/data"
SCRIPTS = "SemiAnalysisAI/InferenceX@b13bcafe"
HEADER = Path(__file__).parent / "data" / "published_v1.csv"  # (the column order of every file)
# length setting -> (GitHub Actions run, the mirrored file, input length, output length)
RUNS = {
    "1k1k": ("18577107964", "18577107964-4295924251-results_70b_1k1k__agg_70b_1k1k.json", 1024, 1024),
    "1k8k": ("18577199847", "18577199847-4302624689-results_70b_1k8k__agg_70b_1k8k.json", 1024, 8192),
    "8k1k": ("18577146883", "18577146883-4297902145-results_70b_8k1k__agg_70b_8k1k.json", 8192, 1024),
}
TPS = {"h100": (2, 4, 8), "h200": (1, 2, 4, 8)}  # what InferenceMAX ran vLLM at
GPU = {
    "h100": "H100 80GB (InferenceMAX runner label 'h100': nodes h100-cr (docker) or h100-cw (Slurm), "
    "the same server flags; which node ran this point and its form factor are not stated, SXM assumed)",
    "h200": "H200 141GB (InferenceMAX runner label 'h200': Slurm nodes h200-cw / h200-nb / h200-nv; "
    "which node ran this point and its form factor are not stated, SXM assumed)",
}
FIRST_ROW = 5001


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f}"


def mean_len(n: int) -> str:
    lo = int(n * 0.8)
    return f"{(lo + n) / 2:g}"


def row(row_id: int, setting: str, rec: dict[str, float | str], isl: int, osl: int) -> dict[str, str]:
    run, name, _, _ = RUNS[setting]
    hw, tp, conc = str(rec["hw"]), int(rec["tp"]), int(rec["conc"])
    # max-model-len per InferenceMAX's launch scripts: 10,240 on H100; on H200 the
    # request's longest plus 20 (1k/1k) or 200
    mml = 10240 if hw == "h100" else isl + osl + (20 if (isl, osl) == (1024, 1024) else 200)
    script = "benchmarks/70b_fp8_h100_docker.sh or _h100_slurm.sh" if hw == "h100" else "benchmarks/70b_fp8_h200_slurm.sh"
    f = {k: float(v) for k, v in rec.items() if isinstance(v, (int, float))}
    return {
        "row_id": str(row_id),
        "source_title": f"SemiAnalysis InferenceMAX v1 nightly results, Llama-3.3-70B FP8, {setting} "
        f"(the CI artifact agg_70b_{setting}.json of run {run}, mirrored in denosys/InferenceMAX docs/data/{name})",
        "source_url": f"{MIRROR}/{name}",
        "source_kind": "benchmark_publisher_ci_artifact (InferenceMAX's aggregated benchmark_serving results, "
        "JSON; a third party's copy of the artifact)",
        "engine": "vLLM (V1 engine, OpenAI completions endpoint)",
        "engine_version": "0.10.2",
        "model": "nvidia/Llama-3.3-70B-Instruct-FP8",
        "weight_precision": "fp8 (NVIDIA ModelOpt FP8 checkpoint)",
        "kv_cache_dtype": "fp8 (kv-cache-dtype: fp8)",
        "gpu": GPU[hw],
        "num_gpus": str(tp),
        "tp": str(tp),
        "scenario": f"closed_loop_concurrency (benchmark_serving.py random dataset, --max-concurrency {conc} "
        f"--request-rate inf, {conc * 10} prompts)",
        "batch_or_concurrency": str(conc),
        "request_rate_rps": "inf",
        "num_requests": str(conc * 10),
        "input_len": f"U[{int(isl * 0.8)},{isl}]",
        "output_len": f"U[{int(osl * 0.8)},{osl}]",
        "length_distribution": "lengths uniform integers in [int(0.8*L), L]: benchmark_serving random dataset "
        f"--random-input-len {isl} --random-output-len {osl} --random-range-ratio 0.8 --ignore-eos "
        f"(mean {mean_len(isl)} in / {mean_len(osl)} out); seed default (0)",
        "engine_config": f"vllm serve nvidia/Llama-3.3-70B-Instruct-FP8 --config config.yaml "
        f"--gpu-memory-utilization 0.9 --tensor-parallel-size {tp} --max-num-seqs {conc} --disable-log-requests; "
        f"config.yaml: kv-cache-dtype: fp8, async-scheduling: true, no-enable-prefix-caching: true, "
        f"max-num-batched-tokens: 8192, max-model-len: {mml} (image vllm/vllm-openai:v0.10.2; {script} at {SCRIPTS})",
        "ttft_ms": ms(f["mean_ttft"]),
        "itl_ms": ms(f["mean_itl"]),
        "tpot_ms": ms(f["mean_tpot"]),
        "e2e_latency_ms": ms(f["mean_e2el"]),
        "metric_stat": "mean (medians/p99 in notes)",
        "output_tok_per_s": f"{f['output_tput_per_gpu'] * tp:.2f}",
        "total_tok_per_s": f"{f['tput_per_gpu'] * tp:.2f}",
        "req_per_s": "",
        "derived": "latencies = the source's seconds x 1000; output_tok_per_s = output_tput_per_gpu x TP and "
        "total_tok_per_s = tput_per_gpu x TP (InferenceMAX's utils/process_result.py divides benchmark_serving's "
        "throughputs by TP); rounded to 2 decimals",
        "notes": (
            f"median TTFT {ms(f['median_ttft'])} ms, p99 {ms(f['p99_ttft'])}; median TPOT {ms(f['median_tpot'])}, "
            f"p99 {ms(f['p99_tpot'])}; median ITL {ms(f['median_itl'])}, p99 {ms(f['p99_itl'])}; median E2E "
            f"{ms(f['median_e2el'])}, p99 {ms(f['p99_e2el'])}; the source's per-GPU values tput_per_gpu "
            f"{f['tput_per_gpu']:.4f}, output_tput_per_gpu {f['output_tput_per_gpu']:.4f}. Provenance: InferenceMAX's "
            f"nightly sweep ({setting}), GitHub Actions run {run}, linked from inferencemax.semianalysis.com; its "
            f"aggregated artifact was downloaded by denosys/InferenceMAX's update-pages workflow and committed on "
            "2025-10-19 (the artifact itself has expired). Assumptions: the run used InferenceMAX's code of "
            "2025-10-15/16 (the records carry output_tput_per_gpu, added on 2025-10-15, and not input_tput_per_gpu, "
            "added on 2025-10-17), so the image and flags are read from that week's scripts; the record states neither "
            "the image, the node nor req/s; num_requests = 10 x concurrency per the launch script; client "
            "kimbochen/bench_serving benchmark_serving.py, cloned unpinned at run time (backend vllm, /v1/completions, "
            "--request-rate inf, --ignore-eos)."
        ),
        "confidence": "medium",
        "source_id": "inferencemax",
        "split": "holdout",
        "distribution": (
            f"ttft_ms median={ms(f['median_ttft'])} p99={ms(f['p99_ttft'])}; "
            f"tpot_ms median={ms(f['median_tpot'])} p99={ms(f['p99_tpot'])}; "
            f"itl_ms median={ms(f['median_itl'])} p99={ms(f['p99_itl'])}; "
            f"e2e_latency_ms median={ms(f['median_e2el'])} p99={ms(f['p99_e2el'])}"
        ),
    }


def main(src: Path, out: Path) -> int:
    missing = [f"70b_{setting}.json" for setting in RUNS if not (src / f"70b_{setting}.json").is_file()]
    if missing:
        raise SystemExit(f"{src}: no {', '.join(missing)} (the curl lines in this script's docstring fetch them)")
    header = HEADER.read_text().splitlines()[0].split(",")
    rows, row_id = [], FIRST_ROW
    for setting, (_, _, isl, osl) in RUNS.items():
        records = json.loads((src / f"70b_{setting}.json").read_text())
        for hw, tps in TPS.items():
            for tp in tps:
                mine = [r for r in records if (r["hw"], r["tp"], r["framework"], r["precision"]) == (hw, tp, "vllm", "fp8")]
                if {int(r["conc"]) for r in mine} != {4, 8, 16, 32, 64} or len(mine) != 5:
                    raise SystemExit(f"{setting} {hw} TP{tp}: expected one record per concurrency 4-64, got {len(mine)}")
                for rec in sorted(mine, key=lambda r: int(r["conc"])):
                    if rec["model"] != "nvidia/Llama-3.3-70B-Instruct-FP8":
                        raise SystemExit(f"{setting} {hw} TP{tp}: model {rec['model']}")
                    rows.append(row(row_id, setting, rec, isl, osl))
                    row_id += 1
    with out.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=header)
        writer.writeheader()
        writer.writerows(rows)
    print(f"{len(rows)} rows to {out}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: python bench/inferencemax_rows.py DIR_WITH_THE_3_JSON_FILES OUT.csv")
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
