"""bench/q8_data.py — the benchmark input of the GPU scripts (bench/pipeline.sh, bench/zero1_check.sh,
bench/moe_pipeline.sh): a config.json for `dflash train --random-target` (Qwen3-8B shapes, or Qwen3-30B-A3B's) and N
random rows of 3072 tokens (64 prompt + 3008 supervised) to feed `dflash prepare`.
Usage: python3 bench/q8_data.py CONFIG_JSON ROWS_JSONL N_ROWS [qwen3-8b|qwen3-30b-a3b]
"""
import json
import random
import sys

config_path, rows_path, n_rows = sys.argv[1], sys.argv[2], int(sys.argv[3])
shape = sys.argv[4] if len(sys.argv) > 4 else "qwen3-8b"
cfg = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 4096, "intermediate_size": 12288,
       "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
       "vocab_size": 151936, "rms_norm_eps": 1e-6, "rope_theta": 1000000, "max_position_embeddings": 40960,
       "tie_word_embeddings": False, "attention_bias": False, "hidden_act": "silu", "torch_dtype": "bfloat16"}
if shape == "qwen3-30b-a3b":  # Qwen/Qwen3-30B-A3B config.json
    cfg = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
           "intermediate_size": 6144, "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4,
           "head_dim": 128, "vocab_size": 151936, "rms_norm_eps": 1e-6, "rope_theta": 1000000,
           "max_position_embeddings": 40960, "tie_word_embeddings": False, "attention_bias": False,
           "hidden_act": "silu", "torch_dtype": "bfloat16", "num_experts": 128, "num_experts_per_tok": 8,
           "moe_intermediate_size": 768, "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": []}
elif shape != "qwen3-8b":
    sys.exit(f"q8_data.py: unknown shape {shape!r} (qwen3-8b or qwen3-30b-a3b)")
with open(config_path, "w") as f:
    json.dump(cfg, f)
r = random.Random(1)
with open(rows_path, "w") as f:
    for _ in range(n_rows):
        ids = [r.randrange(8192) for _ in range(3072)]
        f.write(json.dumps({"input_ids": ids, "loss_mask": [0] * 64 + [1] * 3008}) + "\n")
