// io/model_family.cpp — the supported target families, one entry each (io/model_family.h). Each reads the keys of
// its transformers configuration class that the shared reader (io/hf_config.cpp) does not, with that class's
// defaults, and says what every layer is.
#include "io/model_family.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "io/model_family_deepseek_v3.h"
#include "io/model_family_gemma4.h"
#include "io/model_family_hybrid.h"
#include "io/model_family_minimax.h"

namespace dflash {

namespace {

// The dense plan: attention with the config's bias / qk-norm flags, SwiGLU of intermediate_size.
LayerSpec dense_layer(const ModelConfig& c, int64_t) {
  LayerSpec s;
  s.attention.bias = c.attention_bias;
  s.attention.qk_norm = c.qk_norm;
  s.mlp = ChannelMixer::Dense;
  s.mlp_width = c.intermediate_size;
  return s;
}

// ---- Llama (transformers LlamaConfig) -----------------------------------------------------------------------------
void read_llama(const JsonFields& f, ModelConfig& c) {
  c.head_dim = f.opt_int("head_dim", c.hidden_size / c.num_attention_heads);
  c.max_position_embeddings = f.opt_int("max_position_embeddings", 2048);
  c.attention_bias = f.opt_bool("attention_bias", false);
  c.bos_token_id = f.j.contains("bos_token_id") ? f.opt_int("bos_token_id", -1) : 1;  // LlamaConfig: bos 1, eos 2
  if (!f.j.contains("eos_token_id")) c.eos_token_ids = {2};
}

// ---- Qwen2 (Qwen2Config): q/k/v biases always ---------------------------------------------------------------------
void read_qwen2(const JsonFields& f, ModelConfig& c) {
  c.head_dim = f.opt_int("head_dim", c.hidden_size / c.num_attention_heads);
  c.attention_bias = true;  // Qwen2Attention has q/k/v biases whatever attention_bias says
}

// ---- Qwen3 (Qwen3Config): per-head q/k RMSNorm; an absent head_dim is 128 ---------------------------------------
void read_qwen3(const JsonFields& f, ModelConfig& c) {
  c.head_dim = f.opt_int("head_dim", f.j.contains("head_dim") ? c.hidden_size / c.num_attention_heads : 128);
  c.attention_bias = f.opt_bool("attention_bias", false);
  c.qk_norm = true;
}

// ---- Qwen3-MoE (Qwen3MoeConfig, Qwen3MoeSparseMoeBlock) -----------------------------------------------------------
void read_qwen3_moe(const JsonFields& f, ModelConfig& c) {
  // Qwen3MoeAttention: head_dim = getattr(config, "head_dim", H / nh); the published configs give it (128).
  c.head_dim = f.opt_int("head_dim", c.hidden_size / c.num_attention_heads);
  c.attention_bias = f.opt_bool("attention_bias", false);
  c.qk_norm = true;
  MoeConfig& m = c.moe;
  // transformers 5 writes the count as num_local_experts (an alias of num_experts in Qwen3MoeConfig's attribute map)
  m.num_experts = f.opt_int("num_experts", f.opt_int("num_local_experts", 128));
  m.top_k = f.opt_int("num_experts_per_tok", 8);
  m.expert_width = f.opt_int("moe_intermediate_size", 768);
  m.norm_topk_prob = f.opt_bool("norm_topk_prob", false);
  DFLASH_CHECK(m.num_experts >= 0, f.src, ": num_experts: must be >= 0, got ", m.num_experts);
  if (m.num_experts > 0) {
    DFLASH_CHECK(m.top_k >= 1 && m.top_k <= m.num_experts, f.src, ": num_experts_per_tok: ", m.top_k,
                 " must be in [1, num_experts = ", m.num_experts, "]");
    DFLASH_CHECK(m.expert_width > 0, f.src, ": moe_intermediate_size: must be positive, got ", m.expert_width);
  }
  read_sparse_layers(f, c, m);
}

LayerSpec qwen3_moe_layer(const ModelConfig& c, int64_t l) {
  LayerSpec s = dense_layer(c, l);
  if (is_sparse_layer(c.moe, l)) {
    s.mlp = ChannelMixer::MoE;
    s.mlp_width = c.moe.expert_width;
  }
  return s;
}

}  // namespace

void read_sparse_layers(const JsonFields& f, const ModelConfig& c, MoeConfig& m) {
  m.decoder_sparse_step = f.opt_int("decoder_sparse_step", 1);
  m.mlp_only_layers = f.opt_int_list("mlp_only_layers");
  DFLASH_CHECK(m.decoder_sparse_step >= 1, f.src, ": decoder_sparse_step: must be >= 1, got ", m.decoder_sparse_step);
  for (int64_t l : m.mlp_only_layers)
    DFLASH_CHECK(l >= 0 && l < c.num_hidden_layers, f.src, ": mlp_only_layers: layer ", l, " is not in [0, ",
                 c.num_hidden_layers, ")");
}

bool is_sparse_layer(const MoeConfig& m, int64_t l) {
  const bool dense_only = std::find(m.mlp_only_layers.begin(), m.mlp_only_layers.end(), l) != m.mlp_only_layers.end();
  return !dense_only && m.num_experts > 0 && (l + 1) % m.decoder_sparse_step == 0;
}

namespace {

// ---- gpt-oss (GptOssConfig, GptOssAttention, GptOssMLP) -----------------------------------------------------------
// Keys absent from config.json take GptOssConfig's defaults (the gpt-oss-120b shapes), including those the shared
// reader defaults otherwise: rms_norm_eps 1e-5, max_position_embeddings 131072, rope_theta 150000 and YaRN (factor 32
// over 4096 positions, beta 32 / 1, truncate false), 8 kv heads.
void read_gpt_oss(const JsonFields& f, ModelConfig& c) {
  c.head_dim = f.opt_int("head_dim", 64);
  if (!f.get("num_key_value_heads")) c.num_key_value_heads = 8;
  DFLASH_CHECK(c.num_attention_heads % c.num_key_value_heads == 0, f.src, ": num_key_value_heads (default 8) must "
               "divide num_attention_heads ", c.num_attention_heads);
  if (!f.get("rms_norm_eps")) c.rms_norm_eps = 1e-5;
  if (!f.get("max_position_embeddings")) c.max_position_embeddings = 131072;
  const nlohmann::json* rp = f.get("rope_parameters");
  const bool theta_given = f.get("rope_theta") || (rp && rp->is_object() && rp->contains("rope_theta"));
  if (!theta_given) c.rope_theta = 150000.0;
  if (!rp && !f.get("rope_scaling")) {
    c.rope_scaling.kind = "yarn";
    c.rope_scaling.factor = 32.0;
    c.rope_scaling.original_max_position_embeddings = 4096;
    c.rope_scaling.truncate = false;
  }
  // intermediate_size is the experts' width; the shared reader leaves it optional (families without dense layers)
  DFLASH_CHECK(f.get("intermediate_size") != nullptr, f.src, " missing ", f.prefix, "intermediate_size");
  DFLASH_CHECK(c.intermediate_size > 0, f.src, ": intermediate_size: must be positive, got ", c.intermediate_size);
  c.attention_bias = f.opt_bool("attention_bias", true);  // q/k/v and o_proj
  c.sliding_window = f.opt_int("sliding_window", 128);
  DFLASH_CHECK(c.sliding_window > 0, f.src, ": sliding_window: must be positive, got ", c.sliding_window);
  if (const nlohmann::json* lt = f.get("layer_types")) {
    DFLASH_CHECK(lt->is_array() && static_cast<int64_t>(lt->size()) == c.num_hidden_layers, f.src, ": ", f.prefix,
                 "layer_types: expected a list of ", c.num_hidden_layers, " strings (one per layer), got ", lt->dump());
    c.layer_types.clear();
    for (const auto& e : *lt) {
      DFLASH_CHECK(e.is_string() && (e == "sliding_attention" || e == "full_attention"), f.src, ": ", f.prefix,
                   "layer_types: entry ", e.dump(), " is not \"sliding_attention\" or \"full_attention\"");
      c.layer_types.push_back(e == "sliding_attention" ? LayerType::SlidingAttention : LayerType::FullAttention);
    }
  } else {  // GptOssConfig: sliding, full, sliding, ...
    c.layer_types.clear();
    for (int64_t l = 0; l < c.num_hidden_layers; ++l)
      c.layer_types.push_back(l % 2 == 0 ? LayerType::SlidingAttention : LayerType::FullAttention);
  }
  MoeConfig& m = c.moe;
  m.num_experts = f.opt_int("num_local_experts", 128);
  m.top_k = f.opt_int("num_experts_per_tok", 4);
  m.expert_width = c.intermediate_size;  // every layer is MoE; intermediate_size is the experts' width
  m.router = RouterKind::TopKSoftmax;  // GptOssTopKRouter: softmax over the top-k logits ...
  m.norm_topk_prob = true;  // ... == the softmax over all, renormalised over the top k
  m.router_bias = true;
  m.expert_bias = true;
  m.act = ExpertAct::ClampedSwiGLU;  // GptOssExperts._apply_gate (alpha 1.702, limit swiglu_limit)
  DFLASH_CHECK(m.num_experts >= 1, f.src, ": num_local_experts: must be >= 1, got ", m.num_experts);
  DFLASH_CHECK(m.top_k >= 1 && m.top_k <= m.num_experts, f.src, ": num_experts_per_tok: ", m.top_k,
               " must be in [1, num_local_experts = ", m.num_experts, "]");
  // the GLU's clamp: transformers' GptOssExperts fixes 7.0 (its MXFP4 kernels read swiglu_limit); so does dflash
  // (backend/context.h kClampedSwiGLULimit)
  const double limit = f.opt_num("swiglu_limit", 7.0);
  DFLASH_CHECK(limit == 7.0, f.src, ": swiglu_limit: ", limit, " is not supported (the gpt-oss GLU clamps at 7.0, as "
               "transformers' GptOssExperts)");
}

LayerSpec gpt_oss_layer(const ModelConfig& c, int64_t l) {
  LayerSpec s;
  s.attention.bias = c.attention_bias;
  s.attention.out_bias = c.attention_bias;
  s.attention.sinks = true;
  s.attention.sliding_window =
      c.layer_types[static_cast<size_t>(l)] == LayerType::SlidingAttention ? c.sliding_window : 0;
  s.mlp = ChannelMixer::MoE;
  s.mlp_width = c.moe.expert_width;
  return s;
}

// The published gpt-oss drafters (z-lab/gpt-oss-20b-DFlash, -120b-DFlash) have an MLP of 7680 at H 2880: 8 H / 3.
// (Their target_layer_ids, [1, 6, 11, 16, 21] of 24 and [1, 9, 17, 25, 33] of 36, are the spec's default rule.)
DrafterDefaults gpt_oss_drafter(const ModelConfig& c) {
  DrafterDefaults d;
  d.intermediate_size = 8 * c.hidden_size / 3;
  return d;
}

WeightNames gpt_oss_names() {
  WeightNames n;
  n.router = "mlp.router.weight";
  n.router_bias = "mlp.router.bias";
  n.experts_layout = ExpertsLayout::InterleavedColumns;
  return n;
}

}  // namespace

const std::vector<ModelFamily>& model_families() {
  static const std::vector<ModelFamily> families = {
      {Arch::Llama, "llama", "LlamaForCausalLM", "Llama", "Llama-3.1-8B-Instruct, Llama-3.x", read_llama, dense_layer,
       nullptr, WeightNames{}},
      {Arch::Qwen2, "qwen2", "Qwen2ForCausalLM", "Qwen2", "Qwen2.5-7B-Instruct, Qwen2-7B-Instruct", read_qwen2,
       dense_layer, nullptr, WeightNames{}},
      {Arch::Qwen3, "qwen3", "Qwen3ForCausalLM", "Qwen3", "Qwen3-4B, Qwen3-8B, Qwen3-32B", read_qwen3, dense_layer,
       nullptr, WeightNames{}},
      {Arch::Qwen3Moe, "qwen3_moe", "Qwen3MoeForCausalLM", "Qwen3-MoE",
       "Qwen3-30B-A3B, Qwen3-Coder-30B-A3B-Instruct, Qwen3-235B-A22B", read_qwen3_moe, qwen3_moe_layer,
       nullptr, WeightNames{}},
      {Arch::GptOss, "gpt_oss", "GptOssForCausalLM", "gpt-oss", "gpt-oss-20b, gpt-oss-120b", read_gpt_oss,
       gpt_oss_layer, nullptr, gpt_oss_names(), gpt_oss_drafter},
      // hybrid linear attention (io/model_family_hybrid.cpp)
      {Arch::Qwen3Next, "qwen3_next", "Qwen3NextForCausalLM", "Qwen3-Next",
       "Qwen3-Coder-Next, Qwen3-Next-80B-A3B", read_qwen3_next, qwen3_next_layer, nullptr, hybrid_names(false),
       hybrid_drafter},
      {Arch::Qwen3_5, "qwen3_5_text", "Qwen3_5ForCausalLM", "Qwen3.5", "Qwen3.5 / Qwen3.6 dense, text only",
       read_qwen3_5, qwen3_5_layer, nullptr, hybrid_names(false), hybrid_drafter},
      {Arch::Qwen3_5Vl, "qwen3_5", "Qwen3_5ForConditionalGeneration", "Qwen3.5 (image-text checkpoint)",
       "Qwen3.5-4B, Qwen3.5-9B, Qwen3.5-27B, Qwen3.6-27B", read_qwen3_5, qwen3_5_layer, nullptr, hybrid_names(true),
       hybrid_drafter},
      {Arch::Qwen3_5Moe, "qwen3_5_moe_text", "Qwen3_5MoeForCausalLM", "Qwen3.5-MoE", "Qwen3.5 / Qwen3.6 MoE, text only",
       read_qwen3_5_moe, qwen3_5_moe_layer, nullptr, hybrid_names(false), hybrid_drafter},
      {Arch::Qwen3_5MoeVl, "qwen3_5_moe", "Qwen3_5MoeForConditionalGeneration", "Qwen3.5-MoE (image-text checkpoint)",
       "Qwen3.5-35B-A3B, Qwen3.5-122B-A10B, Qwen3.6-35B-A3B", read_qwen3_5_moe, qwen3_5_moe_layer, nullptr,
       hybrid_names(true), hybrid_drafter},
      // Gemma 4 (io/model_family_gemma4.cpp)
      {Arch::Gemma4, "gemma4_text", "Gemma4ForCausalLM", "Gemma 4", "Gemma 4 dense and MoE, text only", read_gemma4,
       gemma4_layer, nullptr, gemma4_names(false), gemma4_drafter},
      {Arch::Gemma4Vl, "gemma4", "Gemma4ForConditionalGeneration", "Gemma 4 (image-text checkpoint)",
       "gemma-4-31B-it, gemma-4-26B-A4B-it", read_gemma4, gemma4_layer, nullptr, gemma4_names(true), gemma4_drafter},
      // io/model_family_minimax.cpp
      {Arch::MiniMaxM2, "minimax_m2", "MiniMaxM2ForCausalLM", "MiniMax-M2",
       "MiniMax-M2, MiniMax-M2.1, MiniMax-M2.5, MiniMax-M2.7", read_minimax_m2, minimax_m2_layer, nullptr,
       minimax_m2_names()},
      // io/model_family_deepseek_v3.cpp
      {Arch::DeepseekV3, "deepseek_v3", "DeepseekV3ForCausalLM", "DeepSeek-V3",
       "DeepSeek-V3, DeepSeek-V3.1, DeepSeek-R1, Kimi-K2", read_deepseek_v3, deepseek_v3_layer, nullptr,
       deepseek_v3_names(), deepseek_v3_drafter, "kimi_k2"},
  };
  return families;
}

const ModelFamily* family_by_architecture(const std::string& name) {
  for (const ModelFamily& f : model_families())
    if (name == f.architecture) return &f;
  return nullptr;
}

const ModelFamily* family_by_model_type(const std::string& model_type) {
  for (const ModelFamily& f : model_families())
    if (model_type == f.model_type || (f.model_type_alias && model_type == f.model_type_alias)) return &f;
  return nullptr;
}

const ModelFamily& family_of(Arch a) {
  for (const ModelFamily& f : model_families())
    if (f.arch == a) return f;
  DFLASH_FAIL("family_of: no family for arch ", static_cast<int>(a));
}

std::string supported_architectures() {
  std::string s;
  for (const ModelFamily& f : model_families()) s += (s.empty() ? "" : ", ") + std::string(f.architecture);
  return s;
}

std::string supported_model_types() {
  std::string s;
  for (const ModelFamily& f : model_families()) {
    s += (s.empty() ? "" : ", ") + std::string(f.model_type);
    if (f.model_type_alias) s += ", " + std::string(f.model_type_alias);
  }
  return s;
}

Tensor gate_up_rows_first(const Tensor& t) {
  const int64_t E = t.shape[0], N2 = t.shape[1], I = N2 / 2;
  const size_t row = t.nbytes() / static_cast<size_t>(E * N2);
  Tensor out = cpu_empty(t.dtype, t.shape);
  const auto* in = static_cast<const uint8_t*>(t.data);
  auto* o = static_cast<uint8_t*>(out.data);
  for (int64_t e = 0; e < E; ++e)
    for (int64_t r = 0; r < N2; ++r) {
      const int64_t src = r < I ? 2 * r : 2 * (r - I) + 1;  // row r of the output: gate r or up r - I
      std::memcpy(o + (e * N2 + r) * row, in + (e * N2 + src) * row, row);
    }
  return out;
}

Tensor columns_to_rows(const Tensor& t) {
  const int64_t E = t.shape[0], A = t.shape[1], B = t.shape[2];
  Tensor out = cpu_empty(DType::F32, {E, B, A});
  const float* in = t.ptr<float>();
  float* o = out.ptr<float>();
  for (int64_t e = 0; e < E; ++e)
    for (int64_t a = 0; a < A; ++a)
      for (int64_t b = 0; b < B; ++b) o[(e * B + b) * A + a] = in[(e * A + a) * B + b];
  return out;
}

}  // namespace dflash
