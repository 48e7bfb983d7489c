// io/model_family_minimax.cpp — the MiniMax-M2 family (io/model_family_minimax.h): MiniMaxM2Config's keys and
// defaults (transformers 5 configuration_minimax_m2.py), the published config.json's own keys, the plan and names.
#include "io/model_family_minimax.h"

#include "core/error.h"

namespace dflash {

void read_minimax_m2(const JsonFields& f, ModelConfig& c) {
  const std::string& src = f.src;
  const std::string& px = f.prefix;
  // MiniMaxM2Config's defaults where the file is silent (the MiniMax-M2 shapes)
  c.head_dim = f.opt_int("head_dim", 128);
  if (!f.get("num_key_value_heads")) c.num_key_value_heads = 8;
  DFLASH_CHECK(c.num_key_value_heads > 0 && c.num_attention_heads % c.num_key_value_heads == 0, src, ": ", px,
               "num_key_value_heads ", c.num_key_value_heads, " must divide num_attention_heads ",
               c.num_attention_heads);
  if (!f.get("max_position_embeddings")) c.max_position_embeddings = 196608;
  const nlohmann::json* rp = f.get("rope_parameters");
  const bool theta_given = f.get("rope_theta") || (rp && rp->is_object() && rp->contains("rope_theta"));
  if (!theta_given) c.rope_theta = 5000000.0;  // MiniMaxM2Config.default_theta
  c.bos_token_id = f.j.contains("bos_token_id") ? f.opt_int("bos_token_id", -1) : 200034;
  if (!f.j.contains("eos_token_id")) c.eos_token_ids = {200020};
  const std::string act = f.opt_str("hidden_act", "silu");
  DFLASH_CHECK(act == "silu", src, ": ", px, "hidden_act: '", act, "' is not supported (silu)");
  DFLASH_CHECK(!f.opt_bool("attention_bias", false), src, ": ", px, "attention_bias: true is not supported "
               "(MiniMaxM2Attention's projections have no biases)");
  c.attention_bias = false;

  // attention: q/k RMSNorm over all heads at once
  DFLASH_CHECK(f.opt_bool("use_qk_norm", true), src, ": ", px, "use_qk_norm: false is not supported (MiniMax-M2 "
               "norms q and k: transformers' MiniMaxM2Attention always does)");
  const std::string qkn = f.opt_str("qk_norm_type", "per_layer");
  DFLASH_CHECK(qkn == "per_layer", src, ": ", px, "qk_norm_type: '", qkn, "' is not supported (\"per_layer\": one "
               "RMSNorm over all heads' q and one over k, as MiniMax-M2 publishes)");
  c.qk_norm = true;

  // partial rotary: rotary_dim (the published key), or partial_rotary_factor (top level or in rope_parameters, as
  // transformers' rotary embedding reads it); both given must agree; neither: all of head_dim
  int64_t rd = f.opt_int("rotary_dim", 0);
  double factor = f.opt_num("partial_rotary_factor", 0.0);
  if (rp && rp->is_object())
    factor = JsonFields{*rp, src, px + "rope_parameters."}.opt_num("partial_rotary_factor", factor);
  if (factor != 0.0) {
    DFLASH_CHECK(factor > 0 && factor <= 1, src, ": ", px, "partial_rotary_factor: ", factor, " must be in (0, 1]");
    const int64_t from_factor = static_cast<int64_t>(static_cast<double>(c.head_dim) * factor);
    DFLASH_CHECK(rd == 0 || rd == from_factor, src, ": ", px, "rotary_dim ", rd, " disagrees with partial_rotary_factor ",
                 factor, " x head_dim ", c.head_dim, " = ", from_factor);
    rd = from_factor;
  }
  if (rd == 0) rd = c.head_dim;
  DFLASH_CHECK(rd >= 2 && rd <= c.head_dim && rd % 2 == 0, src, ": ", px, "rotary_dim: ", rd,
               " must be an even number in [2, head_dim = ", c.head_dim, "]");
  c.rotary_dim = rd == c.head_dim ? 0 : rd;

  // every layer full softmax attention (MiniMax-01 / M1's attn_type_list 0 is lightning attention)
  if (const nlohmann::json* al = f.get("attn_type_list")) {
    DFLASH_CHECK(al->is_array(), src, ": ", px, "attn_type_list: expected a list, got ", al->dump());
    for (size_t l = 0; l < al->size(); ++l)
      DFLASH_CHECK((*al)[l].is_number_integer() && (*al)[l].get<int64_t>() == 1, src, ": ", px, "attn_type_list[",
                   l, "]: ", (*al)[l].dump(), " is not supported (1: softmax attention; MiniMax-01's lightning "
                   "attention is not)");
  }
  if (const nlohmann::json* sw = f.get("sliding_window"); sw && !sw->is_null())
    DFLASH_CHECK(sw->is_number_integer() && sw->get<int64_t>() == 0, src, ": ", px, "sliding_window: ", sw->dump(),
                 " is not supported (MiniMax-M2's attention is full causal)");

  // MoE: every layer; sigmoid router with the score-correction bias, top-k renormalised
  DFLASH_CHECK(f.get("intermediate_size") != nullptr, src, " missing ", px, "intermediate_size");
  DFLASH_CHECK(c.intermediate_size > 0, src, ": ", px, "intermediate_size: must be positive, got ",
               c.intermediate_size);
  const std::string scoring = f.opt_str("scoring_func", "sigmoid");
  DFLASH_CHECK(scoring == "sigmoid", src, ": ", px, "scoring_func: '", scoring, "' is not supported (sigmoid)");
  const int64_t shared = f.opt_int("shared_intermediate_size", 0);
  DFLASH_CHECK(shared == 0, src, ": ", px, "shared_intermediate_size: ", shared, " is not supported (a shared "
               "expert; MiniMax-M2 has none)");
  const double rsf = f.opt_num("routed_scaling_factor", 1.0);
  DFLASH_CHECK(rsf == 1.0, src, ": ", px, "routed_scaling_factor: ", rsf, " is not supported (MiniMax-M2 scales "
               "the renormalised top-k weights by nothing)");
  MoeConfig& m = c.moe;
  m.num_experts = f.opt_int("num_local_experts", 256);
  m.top_k = f.opt_int("num_experts_per_tok", 8);
  m.expert_width = c.intermediate_size;
  m.router = RouterKind::SigmoidTopK;
  m.norm_topk_prob = true;  // MiniMaxM2TopKRouter always renormalises
  // the bias is a buffer of every MiniMaxM2SparseMoeBlock (transformers adds it always); the published checkpoints
  // carry it and say use_routing_bias: true
  m.score_correction_bias = f.opt_bool("use_routing_bias", true);
  DFLASH_CHECK(m.num_experts >= 1, src, ": ", px, "num_local_experts: must be >= 1, got ", m.num_experts);
  DFLASH_CHECK(m.top_k >= 1 && m.top_k <= m.num_experts, src, ": ", px, "num_experts_per_tok: ", m.top_k,
               " must be in [1, num_local_experts = ", m.num_experts, "]");

  // the multi-token-prediction modules follow the decoder's layers in the published checkpoints (vLLM's
  // get_spec_layer_idx_from_weight_name): not the language model
  const int64_t mtp = f.opt_int("num_mtp_modules", 0);
  DFLASH_CHECK(mtp >= 0, src, ": ", px, "num_mtp_modules: must be >= 0, got ", mtp);
  for (int64_t i = 0; i < mtp; ++i) c.ignored_weights.push_back(cat("model.layers.", c.num_hidden_layers + i, "."));
}

LayerSpec minimax_m2_layer(const ModelConfig& c, int64_t) {
  LayerSpec s;
  s.attention.qk_norm = true;
  s.attention.qk_norm_all_heads = true;
  s.mlp = ChannelMixer::MoE;
  s.mlp_width = c.moe.expert_width;
  return s;
}

WeightNames minimax_m2_names() {
  WeightNames n;
  n.router = "block_sparse_moe.gate.weight";
  n.router_score_bias = "block_sparse_moe.e_score_correction_bias";
  n.expert = "block_sparse_moe.experts.";
  n.expert_gate = "w1.weight";
  n.expert_up = "w3.weight";
  n.expert_down = "w2.weight";
  return n;
}

}  // namespace dflash
