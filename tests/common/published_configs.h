// tests/common/published_configs.h — config.json files of target families as published, each read by more than one
// test file: by its family's test (tests/families/<family>.cpp) and by generic tests that edit them
// (tests/io/hf_config.cpp: Llama-3.1-8B and Qwen3-8B; tests/ops/rope.cpp: gpt-oss-20b's YaRN;
// tests/families/qwen3_next.cpp: Qwen3.5-9B beside Qwen3-Next's keys). Configs only one file reads stay in that file.
// defines: kLlama31_8B, kQwen3_8B, kGptOss20B, gpt_oss_20b, qwen3_5_9b
#pragma once
#include <nlohmann/json.hpp>

namespace dflash::test {

// meta-llama/Llama-3.1-8B-Instruct
inline const char* const kLlama31_8B = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": [128001, 128008, 128009],
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.42.3",
  "use_cache": true,
  "vocab_size": 128256
})";

// Qwen/Qwen3-8B
inline const char* const kQwen3_8B = R"({
  "architectures": ["Qwen3ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 12288,
  "max_position_embeddings": 40960,
  "max_window_layers": 36,
  "model_type": "qwen3",
  "num_attention_heads": 32,
  "num_hidden_layers": 36,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "sliding_window": null,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

// openai/gpt-oss-20b config.json as published (layer_types: 12 x [sliding, full], written out below)
inline const char* const kGptOss20B = R"({
  "architectures": ["GptOssForCausalLM"], "attention_bias": true, "attention_dropout": 0.0, "eos_token_id": 200002,
  "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880, "initial_context_length": 4096,
  "initializer_range": 0.02, "intermediate_size": 2880, "max_position_embeddings": 131072, "model_type": "gpt_oss",
  "num_attention_heads": 64, "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 8,
  "num_local_experts": 32, "output_router_logits": false, "pad_token_id": 199999,
  "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                          "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"},
  "rms_norm_eps": 1e-05,
  "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096,
                   "rope_type": "yarn", "truncate": false},
  "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128, "swiglu_limit": 7.0,
  "tie_word_embeddings": false, "transformers_version": "4.55.0.dev0", "use_cache": true, "vocab_size": 201088})";

inline nlohmann::json gpt_oss_20b() {
  nlohmann::json j = nlohmann::json::parse(kGptOss20B);
  j["layer_types"] = nlohmann::json::array();
  for (int l = 0; l < 24; ++l) j["layer_types"].push_back(l % 2 ? "full_attention" : "sliding_attention");
  return j;
}

// Qwen/Qwen3.5-9B's shape (transformers' Qwen3_5TextConfig defaults, "Qwen3.5-9B style") as an image-text checkpoint
// writes it: the language model under text_config, M-RoPE keys in rope_parameters.
inline nlohmann::json qwen3_5_9b() {
  nlohmann::json t = {
      {"model_type", "qwen3_5_text"}, {"hidden_size", 4096}, {"intermediate_size", 12288}, {"num_hidden_layers", 32},
      {"num_attention_heads", 16}, {"num_key_value_heads", 4}, {"head_dim", 256}, {"linear_num_key_heads", 16},
      {"linear_num_value_heads", 32}, {"linear_key_head_dim", 128}, {"linear_value_head_dim", 128},
      {"linear_conv_kernel_dim", 4}, {"full_attention_interval", 4}, {"vocab_size", 248320}, {"rms_norm_eps", 1e-6},
      {"max_position_embeddings", 262144}, {"eos_token_id", 248044}, {"hidden_act", "silu"},
      {"tie_word_embeddings", false},
      {"rope_parameters", {{"mrope_interleaved", true}, {"mrope_section", {11, 11, 10}}, {"rope_type", "default"},
                           {"rope_theta", 10000000}, {"partial_rotary_factor", 0.25}}}};
  return {{"architectures", {"Qwen3_5ForConditionalGeneration"}}, {"model_type", "qwen3_5"},
          {"tie_word_embeddings", false}, {"text_config", t}, {"vision_config", {{"depth", 27}}}};
}

}  // namespace dflash::test
