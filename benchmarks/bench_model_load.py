"""Load-check benchmark: what the model-aware check adds to `check` on the full DeepSeek-V3.

    python benchmarks/bench_model_load.py            # the 671B config, 61 layers x 256 experts
    python benchmarks/bench_model_load.py --runs 5   # best of 5 in-process runs

The checkpoint has DeepSeek-V3's own config and tensor names (BF16, per-expert tensors as its
Hugging Face release stores them, plus the MTP layer 61), 163 shards written once as sparse
files (headers plus `truncate`, no data) and cached under `benchmarks/.cache/`.

Printed, in one run:
- `check` without the model rule and with it, each in a fresh interpreter (what a CLI user
  waits for: the `with` run imports torch and transformers and builds the meta model), and
  their difference: the target is under 3 s; building the meta model alone, in a fresh
  interpreter too (importing torch, transformers and the model's module, then building);
- in this process: importing torch and transformers, rebuilding the meta model (cache
  cleared, modules imported), the verdict with the model cached, and `check` with and
  without the rule, warm;
- ratios against `check` without the rule.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _synthetic import _attention, _mlp_shapes, ensure_listed
from bench_scan import best_of

from inspector._internal.checks import check
from inspector._internal.load.cache import CACHE_ENV
from inspector._internal.scan.entry import scan

TARGET_SECONDS = 3.0
# DeepSeek-V3's config.json (the fields that decide shapes), as released.
CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "vocab_size": 129280,
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 61,
    "num_nextn_predict_layers": 1,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "n_shared_experts": 1,
    "n_routed_experts": 256,
    "routed_scaling_factor": 2.5,
    "kv_lora_rank": 512,
    "q_lora_rank": 1536,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "qk_nope_head_dim": 128,
    "topk_method": "noaux_tc",
    "n_group": 8,
    "topk_group": 4,
    "num_experts_per_tok": 8,
    "moe_layer_freq": 1,
    "first_k_dense_replace": 3,
    "norm_topk_prob": True,
    "scoring_func": "sigmoid",
    "max_position_embeddings": 163840,
    "rms_norm_eps": 1e-06,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
SHARDS = 163


def tensors() -> list[tuple[str, str, tuple[int, ...]]]:
    """Every tensor of the release, in its order: embedding, 61 layers, MTP layer 61, head."""
    c = CONFIG
    h, layers = c["hidden_size"], c["num_hidden_layers"]
    out = [("model.embed_tokens.weight", "BF16", (c["vocab_size"], h))]
    for layer in range(layers + c["num_nextn_predict_layers"]):
        p = f"model.layers.{layer}"
        out += list(_attention(p, h))
        out += [(f"{p}.input_layernorm.weight", "BF16", (h,))]
        out += [(f"{p}.post_attention_layernorm.weight", "BF16", (h,))]
        if layer < c["first_k_dense_replace"]:
            out += [
                (f"{p}.mlp.{proj}.weight", "BF16", shape)
                for proj, shape in _mlp_shapes(h, c["intermediate_size"])
            ]
            continue
        experts = c["n_routed_experts"]
        out += [(f"{p}.mlp.gate.weight", "BF16", (experts, h))]
        out += [(f"{p}.mlp.gate.e_score_correction_bias", "F32", (experts,))]
        for e in [*range(experts), None]:
            where = f"{p}.mlp.experts.{e}" if e is not None else f"{p}.mlp.shared_experts"
            out += [
                (f"{where}.{proj}.weight", "BF16", shape)
                for proj, shape in _mlp_shapes(h, c["moe_intermediate_size"])
            ]
        if layer >= layers:  # DeepSeek's MTP layer: its own embedding, norms and head
            out += [
                (f"{p}.embed_tokens.weight", "BF16", (c["vocab_size"], h)),
                (f"{p}.enorm.weight", "BF16", (h,)),
                (f"{p}.hnorm.weight", "BF16", (h,)),
                (f"{p}.eh_proj.weight", "BF16", (h, 2 * h)),
                (f"{p}.shared_head.norm.weight", "BF16", (h,)),
                (f"{p}.shared_head.head.weight", "BF16", (c["vocab_size"], h)),
            ]
    out += [("model.norm.weight", "BF16", (h,)), ("lm_head.weight", "BF16", (c["vocab_size"], h))]
    return out


def ensure_checkpoint() -> Path:
    """The cached sparse checkpoint (rebuilt when a previous run was interrupted)."""
    return ensure_listed("deepseek-v3-671b", tensors, shards=SHARDS, config=CONFIG)


_CHILD = """
import sys, time
from inspector._internal.checks import check
from inspector._internal.scan.entry import scan
scanned = scan(sys.argv[1])
check(scanned, model=False)  # warm the page cache and the imports of the core
start = time.perf_counter()
if sys.argv[2] == "build":  # torch, transformers and the model's module imported, then built
    from inspector._internal.load import verdict as model_load
    model_load._built(scanned.config["architectures"][0], scanned.config, scanned.path, False)
else:
    check(scan(sys.argv[1]), model=sys.argv[2] == "model", cache=False)
print(time.perf_counter() - start)
"""


def fresh_process(folder: Path, what: str) -> float:
    """Seconds of `what` ("check", "model": check with the load check, "build": the meta
    model alone) in a new interpreter, after one warm-up check without the load check."""
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(folder), what],
        check=True,
        capture_output=True,
        text=True,
        cwd=root,
    )
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="best of N for in-process timings")
    args = parser.parse_args()
    # Every verdict here is computed (`cache=False`, which still keeps it: in a private folder,
    # never the user's cache); the verdict cache has its own benchmark.
    os.environ[CACHE_ENV] = tempfile.mkdtemp(prefix="bench-model-load-")
    start = time.perf_counter()
    folder = ensure_checkpoint()
    print(f"checkpoint: {folder} ({len(tensors()):,} tensors, {SHARDS} shards)")
    print(f"  ready in {time.perf_counter() - start:.1f} s (cached after the first run)")

    cold_without = min(fresh_process(folder, "check") for _ in range(args.runs))
    cold_with = min(fresh_process(folder, "model") for _ in range(args.runs))
    cold_build = min(fresh_process(folder, "build") for _ in range(args.runs))

    start = time.perf_counter()
    import torch  # noqa: F401
    import transformers  # noqa: F401

    imports = time.perf_counter() - start
    from inspector._internal.load import verdict as model_load

    scanned = scan(folder)

    def build(_: Path) -> object:
        model_load.clear_model_cache()
        return model_load._built(
            CONFIG["architectures"][0], scanned.config, scanned.path, trust=False
        )

    rebuild_s, _ = best_of(build, folder, runs=args.runs)
    verdict_s, verdict = best_of(
        lambda f: model_load.load_verdict(scanned, cache=False), folder, runs=args.runs
    )
    warm_without, _ = best_of(lambda f: check(scan(f), model=False), folder, runs=args.runs)
    warm_with, findings = best_of(lambda f: check(scan(f), cache=False), folder, runs=args.runs)

    print(f"verdict: {verdict.summary()}")
    print(f"findings with the model rule: {len(findings)}")
    print()
    print("fresh interpreter (what `ckpt-inspect check` waits for):")
    print(f"  check without the model rule  {cold_without:7.2f} s")
    print(f"  check with it                 {cold_with:7.2f} s  ({cold_with / cold_without:.2f}x)")
    added = cold_with - cold_without
    status = "OK" if added < TARGET_SECONDS else "OVER TARGET"
    print(
        f"  added by the model rule       {added:7.2f} s  (target < {TARGET_SECONDS} s: {status})"
    )
    print(
        f"  meta model build alone        {cold_build:7.2f} s  (imports included; "
        f"{cold_build / added:.0%} of what the rule adds)"
    )
    print()
    print(f"in this process (best of {args.runs}):")
    print(f"  import torch + transformers   {imports:7.2f} s")
    print(f"  meta model rebuilt, warm      {rebuild_s:7.2f} s")
    print(f"  verdict, model cached         {verdict_s:7.2f} s")
    print(f"  check without the model rule  {warm_without:7.2f} s")
    print(
        f"  check with it, model cached   {warm_with:7.2f} s  "
        f"({warm_with / warm_without:.2f}x, +{warm_with - warm_without:.2f} s)"
    )


if __name__ == "__main__":
    main()
