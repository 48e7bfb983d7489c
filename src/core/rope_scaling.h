// core/rope_scaling.h — the RoPE scaling of a model (config.json's rope_scaling), below both the backend (RoPE
// frequencies: backend/context.h rope_inv_freq) and io (parsing and writing it: io/hf_config.h).
// defines: RopeScaling
#pragma once
#include <cstdint>
#include <string>

namespace dflash {

// rope_scaling of config.json. kind "none" = plain RoPE; "llama3" = Llama-3.1 frequency-dependent scaling
// (factor, low_freq_factor, high_freq_factor, original_max_position_embeddings); "linear" = positions / factor;
// "yarn" = YaRN (arXiv 2309.00071; transformers' _compute_yarn_parameters: factor, original_max_position_embeddings,
// beta_fast, beta_slow, truncate, and attention_factor or mscale / mscale_all_dim). Any other rope_type is refused
// by name.
struct RopeScaling {
  std::string kind = "none";
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
  // yarn only, with transformers' defaults (beta_fast 32, beta_slow 1, truncate true); 0 = a key not given
  double beta_fast = 32.0, beta_slow = 1.0;
  bool truncate = true;
  double attention_factor = 0.0, mscale = 0.0, mscale_all_dim = 0.0;
  // YaRN's attention factor: the attention_factor given, else get_mscale(factor, mscale) /
  // get_mscale(factor, mscale_all_dim) when both are given, else get_mscale(factor) = 0.1 ln(factor) + 1 (1 for
  // factor <= 1); 1 for every other kind. transformers multiplies cos and sin by it, i.e. q and k, so the attention
  // scores grow by its square: dflash folds that square into the softmax scale (model/target/attention.cpp,
  // model/drafter.cpp) and leaves the RoPE op plain.
  double attention_scaling() const;
};

}  // namespace dflash
