"""bench/q8_data.py — the Qwen3-8B-shaped benchmark input of the GPU scripts (bench/pipeline.sh, bench/zero1_check.sh):
a config.json for `dflash train --random-target` and N random rows of 3072 tokens (64 prompt + 3008 supervised) to
feed `dflash prepare`.
Usage: python3 bench/q8_data.py CONFIG_JSON ROWS_JSONL N_ROWS
"""
import json
import random
import sys

config_path, rows_path, n_rows = sys.argv[1], sys.argv[2], int(sys.argv[3])
cfg = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 4096, "intermediate_size": 12288,
       "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
       "vocab_size": 151936, "rms_norm_eps": 1e-6, "rope_theta": 1000000, "max_position_embeddings": 40960,
       "tie_word_embeddings": False, "attention_bias": False, "hidden_act": "silu", "torch_dtype": "bfloat16"}
with open(config_path, "w") as f:
    json.dump(cfg, f)
r = random.Random(1)
with open(rows_path, "w") as f:
    for _ in range(n_rows):
        ids = [r.randrange(8192) for _ in range(3072)]
        f.write(json.dumps({"input_ids": ids, "loss_mask": [0] * 64 + [1] * 3008}) + "\n")
