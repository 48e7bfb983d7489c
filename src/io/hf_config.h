// io/hf_config.h — a Hugging Face config.json of a Llama / Qwen2 / Qwen3 dense decoder as one typed struct.
// defines: Arch, RopeScaling, ModelConfig, load_model_config, parse_model_config, default_target_layer_ids,
//          validate_target_layer_ids, kAutoMaskTokenId, validate_mask_token_id
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace dflash {

enum class Arch { Llama, Qwen2, Qwen3 };
const char* arch_name(Arch a);

// rope_scaling of config.json. kind "none" = plain RoPE; "llama3" = Llama-3.1 frequency-dependent scaling
// (factor, low_freq_factor, high_freq_factor, original_max_position_embeddings); "linear" = positions / factor.
// Any other rope_type is refused by name.
struct RopeScaling {
  std::string kind = "none";
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

struct ModelConfig {
  Arch arch = Arch::Qwen3;
  std::string model_type;            // as in config.json: "llama", "qwen2", "qwen3"
  int64_t hidden_size = 0;           // H
  int64_t intermediate_size = 0;     // I
  int64_t num_hidden_layers = 0;     // Lt
  int64_t num_attention_heads = 0;   // nh
  int64_t num_key_value_heads = 0;   // nkv (GQA), defaults to nh
  int64_t head_dim = 0;              // d, defaults to H / nh
  int64_t vocab_size = 0;            // V
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool attention_bias = false;       // q/k/v biases (Qwen2 always; Llama if attention_bias true)
  bool qk_norm = false;              // per-head RMSNorm on q and k (Qwen3)
  std::vector<int64_t> eos_token_ids;
  int64_t bos_token_id = -1;
  std::string torch_dtype = "bfloat16";
};

// Parses `<dir>/config.json` (or a path to the file). Throws Error naming the file and the missing or
// ill-typed field; refuses unknown `architectures` / `model_type` by name.
ModelConfig load_model_config(const std::string& dir_or_file);
ModelConfig parse_model_config(const nlohmann::json& j, const std::string& source_name);

// Spec 1: nf == 1 -> [Lt/2]; else ids[i] = round(1 + i*(Lt-4)/(nf-1)).
std::vector<int64_t> default_target_layer_ids(int64_t num_target_layers, int64_t nf);

// The rule for target layer ids, whether given (--target-layer-ids, a config file) or read from an exported
// drafter: at least one; each a decoder layer in [0, num_target_layers) (num_target_layers <= 0: not checked);
// no layer twice; and in strictly increasing order. The order is not a free choice: it is the order of the column
// blocks of F = concat(h_after_layer(ids[i])) that fc.weight is trained on, and SGLang / vLLM rebuild F in the
// order of the exported list, so the trained order, the exported order and the served order must be one order —
// ascending, as every default and every public DFlash drafter has it. Throws Error naming the list and the first
// id that breaks the rule (a duplicate, an id out of range, an id after a larger one, with the sorted list).
void validate_target_layer_ids(const std::vector<int64_t>& ids, int64_t num_target_layers);

// The value of --mask-token-id that means "the tokenizer's mask token" (the only negative value accepted).
inline constexpr int64_t kAutoMaskTokenId = -1;
// Checks a mask token id as given by the user: kAutoMaskTokenId, or an id >= 0 (< vocab_size when vocab_size > 0).
// Throws Error naming `option` and the value for anything else.
void validate_mask_token_id(int64_t id, int64_t vocab_size = 0, const char* option = "--mask-token-id");

}  // namespace dflash
