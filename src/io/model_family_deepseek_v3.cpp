// io/model_family_deepseek_v3.cpp — the DeepSeek-V3 family (io/model_family_deepseek_v3.h): DeepseekV3Config's keys
// and defaults (transformers 5 configuration_deepseek_v3.py), the published config.json's own keys, the plan and names.
#include "io/model_family_deepseek_v3.h"

#include <cmath>

#include "core/error.h"

namespace dflash {

double yarn_get_mscale(double scale, double mscale) { return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

void read_deepseek_v3(const JsonFields& f, ModelConfig& c) {
  const std::string& src = f.src;
  const std::string& px = f.prefix;
  const std::string act = f.opt_str("hidden_act", "silu");
  DFLASH_CHECK(act == "silu", src, ": ", px, "hidden_act: '", act, "' is not supported (silu)");
  DFLASH_CHECK(!f.opt_bool("attention_bias", false), src, ": ", px, "attention_bias: true is not supported (the "
               "published DeepSeek-V3 / Kimi-K2 projections have no biases)");
  c.attention_bias = false;
  if (!f.get("num_key_value_heads")) c.num_key_value_heads = c.num_attention_heads;
  DFLASH_CHECK(c.num_key_value_heads == c.num_attention_heads, src, ": ", px, "num_key_value_heads: ",
               c.num_key_value_heads, " is not supported (multi-head latent attention expands its latent to every "
               "one of the num_attention_heads ", c.num_attention_heads, " heads)");
  if (!f.get("max_position_embeddings")) c.max_position_embeddings = 4096;
  if (!f.get("intermediate_size")) c.intermediate_size = 18432;
  c.bos_token_id = f.j.contains("bos_token_id") ? f.opt_int("bos_token_id", -1) : 0;
  if (!f.j.contains("eos_token_id")) c.eos_token_ids = {1};

  // multi-head latent attention; q_lora_rank null: q_proj
  MlaConfig& m = c.mla;
  const auto q_rank = f.j.find("q_lora_rank");
  m.q_lora_rank = q_rank != f.j.end() && q_rank->is_null() ? 0 : f.opt_int("q_lora_rank", 1536);
  m.kv_lora_rank = f.opt_int("kv_lora_rank", 512);
  m.qk_nope_head_dim = f.opt_int("qk_nope_head_dim", 128);
  m.qk_rope_head_dim = f.opt_int("qk_rope_head_dim", 64);
  m.v_head_dim = f.opt_int("v_head_dim", 128);
  m.rope_interleave = f.opt_bool("rope_interleave", true);
  DFLASH_CHECK(m.q_lora_rank >= 0, src, ": ", px, "q_lora_rank: must be positive or null, got ", m.q_lora_rank);
  DFLASH_CHECK(m.kv_lora_rank > 0, src, ": ", px, "kv_lora_rank: must be positive, got ", m.kv_lora_rank);
  DFLASH_CHECK(m.qk_nope_head_dim > 0 && m.v_head_dim > 0, src, ": ", px, "qk_nope_head_dim ", m.qk_nope_head_dim,
               " and v_head_dim ", m.v_head_dim, " must be positive");
  DFLASH_CHECK(m.qk_rope_head_dim >= 2 && m.qk_rope_head_dim % 2 == 0, src, ": ", px,
               "qk_rope_head_dim: must be a positive even number, got ", m.qk_rope_head_dim);
  DFLASH_CHECK(m.v_head_dim <= m.qk_head_dim(), src, ": ", px, "v_head_dim ", m.v_head_dim, " wider than "
               "qk_nope_head_dim + qk_rope_head_dim = ", m.qk_head_dim(), " is not supported (v is padded to the "
               "query's head dim)");
  c.head_dim = m.qk_rope_head_dim;  // DeepseekV3Config.head_dim: the RoPE's dim (rope_dim())
  c.rotary_dim = 0;
  const std::string& kind = c.rope_scaling.kind;
  DFLASH_CHECK(kind == "none" || kind == "yarn", src, ": ", px, "rope_scaling: rope type '", kind, "' is not "
               "supported (default or yarn, as published)");

  // MoE after the first first_k_dense_replace layers
  const std::string scoring = f.opt_str("scoring_func", "sigmoid");
  DFLASH_CHECK(scoring == "sigmoid", src, ": ", px, "scoring_func: '", scoring, "' is not supported (sigmoid)");
  const std::string method = f.opt_str("topk_method", "noaux_tc");
  DFLASH_CHECK(method == "noaux_tc", src, ": ", px, "topk_method: '", method, "' is not supported (noaux_tc: the "
               "score-correction bias and group-limited choice of DeepseekV3MoE)");
  const int64_t freq = f.opt_int("moe_layer_freq", 1);
  DFLASH_CHECK(freq == 1, src, ": ", px, "moe_layer_freq: ", freq, " is not supported (1: every layer from "
               "first_k_dense_replace on is MoE, as transformers builds them)");
  MoeConfig& e = c.moe;
  e.num_experts = f.opt_int("n_routed_experts", f.opt_int("num_local_experts", 256));
  e.top_k = f.opt_int("num_experts_per_tok", 8);
  e.expert_width = f.opt_int("moe_intermediate_size", 2048);
  e.norm_topk_prob = f.opt_bool("norm_topk_prob", true);
  e.router = RouterKind::SigmoidTopK;
  e.score_correction_bias = true;  // a buffer of every DeepseekV3TopkRouter
  e.n_group = f.opt_int("n_group", 8);
  e.topk_group = f.opt_int("topk_group", 4);
  e.routed_scaling_factor = f.opt_num("routed_scaling_factor", 2.5);
  e.shared_expert_width = f.opt_int("n_shared_experts", 1) * e.expert_width;
  e.shared_expert_gate = false;
  e.decoder_sparse_step = 1;
  const int64_t first_dense = f.opt_int("first_k_dense_replace", 3);
  DFLASH_CHECK(first_dense >= 0 && first_dense <= c.num_hidden_layers, src, ": ", px, "first_k_dense_replace: ",
               first_dense, " must be in [0, num_hidden_layers = ", c.num_hidden_layers, "]");
  for (int64_t l = 0; l < first_dense; ++l) e.mlp_only_layers.push_back(l);
  DFLASH_CHECK(e.num_experts >= 1, src, ": ", px, "n_routed_experts: must be >= 1, got ", e.num_experts);
  DFLASH_CHECK(e.top_k >= 1 && e.top_k <= e.num_experts, src, ": ", px, "num_experts_per_tok: ", e.top_k,
               " must be in [1, n_routed_experts = ", e.num_experts, "]");
  DFLASH_CHECK(e.expert_width > 0, src, ": ", px, "moe_intermediate_size: must be positive, got ", e.expert_width);
  DFLASH_CHECK(e.shared_expert_width >= 0, src, ": ", px, "n_shared_experts: must be >= 0");
  DFLASH_CHECK(e.n_group >= 1 && e.num_experts % e.n_group == 0, src, ": ", px, "n_group: ", e.n_group,
               " must divide n_routed_experts = ", e.num_experts);
  DFLASH_CHECK(e.topk_group >= 1 && e.topk_group <= e.n_group, src, ": ", px, "topk_group: ", e.topk_group,
               " must be in [1, n_group = ", e.n_group, "]");
  DFLASH_CHECK(e.n_group == 1 || (e.num_experts / e.n_group >= 2 && e.topk_group * (e.num_experts / e.n_group) >= e.top_k),
               src, ": ", px, "n_group ", e.n_group, " / topk_group ", e.topk_group, ": the kept groups of ",
               e.num_experts / e.n_group, " experts (a group's score sums its two largest) cannot give ",
               "num_experts_per_tok = ", e.top_k);
  if (e.n_group == 1) e.topk_group = 1;  // one group: every expert is a candidate
  DFLASH_CHECK(e.routed_scaling_factor > 0, src, ": ", px, "routed_scaling_factor: must be positive, got ",
               e.routed_scaling_factor);

  // the multi-token-prediction layers follow the decoder's (transformers' _keys_to_ignore_on_load_unexpected)
  const int64_t mtp = f.opt_int("num_nextn_predict_layers", 0);
  DFLASH_CHECK(mtp >= 0, src, ": ", px, "num_nextn_predict_layers: must be >= 0, got ", mtp);
  for (int64_t i = 0; i < mtp; ++i) c.ignored_weights.push_back(cat("model.layers.", c.num_hidden_layers + i, "."));
}

LayerSpec deepseek_v3_layer(const ModelConfig& c, int64_t l) {
  LayerSpec s;
  s.mixer = TokenMixer::LatentAttention;
  double scale = 1.0 / std::sqrt(static_cast<double>(c.mla.qk_head_dim()));
  const RopeScaling& rs = c.rope_scaling;
  if (rs.kind == "yarn" && rs.mscale_all_dim != 0) {  // DeepseekV3Attention.scaling
    const double ms = yarn_get_mscale(rs.factor, rs.mscale_all_dim);
    scale *= ms * ms;
  }
  s.attention.scale = scale;
  if (is_sparse_layer(c.moe, l)) {
    s.mlp = ChannelMixer::MoE;
    s.mlp_width = c.moe.expert_width;
  } else {
    s.mlp = ChannelMixer::Dense;
    s.mlp_width = c.intermediate_size;
  }
  return s;
}

WeightNames deepseek_v3_names() {
  WeightNames n;
  n.shared_expert = "mlp.shared_experts.";
  return n;
}

DrafterDefaults deepseek_v3_drafter(const ModelConfig& c) {
  DrafterDefaults d;
  d.intermediate_size = c.intermediate_size;
  d.num_kv_heads = c.num_attention_heads % 8 == 0 ? 8 : 0;  // (a tiny target's: its own heads)
  d.head_dim = 128;
  return d;
}

}  // namespace dflash
