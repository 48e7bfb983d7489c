// io/model_family_gemma4.cpp — the Gemma 4 text models (io/model_family_gemma4.h): Gemma4TextConfig's keys and
// defaults (transformers 5.17 configuration_gemma4.py) and the per-layer plan (modeling_gemma4.py).
#include "io/model_family_gemma4.h"

#include <cmath>

#include "core/error.h"

namespace dflash {

namespace {

// rope_parameters[layer_type] (absent: Gemma4TextConfig's defaults) as {rope_type, rope_theta, partial_rotary_factor,
// factor}.
struct TypeRope {
  std::string type;
  double theta, partial, factor;
};

TypeRope type_rope(const JsonFields& f, const char* layer_type, const TypeRope& def) {
  const nlohmann::json* rp = f.get("rope_parameters");
  if (!rp) return def;
  DFLASH_CHECK(rp->is_object(), f.src, ": ", f.prefix, "rope_parameters: expected an object per layer type, got ",
               rp->dump());
  const JsonFields all{*rp, f.src, f.prefix + "rope_parameters."};
  const nlohmann::json* r = all.get(layer_type);
  if (!r) return def;
  DFLASH_CHECK(r->is_object(), f.src, ": ", all.prefix, layer_type, ": expected an object, got ", r->dump());
  const JsonFields t{*r, f.src, all.prefix + layer_type + "."};
  return {t.opt_str("rope_type", "default"), t.opt_num("rope_theta", def.theta),
          t.opt_num("partial_rotary_factor", 1.0), t.opt_num("factor", 1.0)};
}

// The full layers' geometry as transformers 5.17 writes it when it saves a Gemma 4 config: per_layer_config
// {"<layer>": {"head_dim": d, "num_key_value_heads": n}} for each full-attention layer, global_head_dim and
// num_global_key_value_heads then left out. Read into global_head_dim and num_global_kv_heads (one geometry for every
// full layer, as the published models have); where those keys are present too they must agree. Without
// attention_k_eq_v a full layer's kv heads are num_key_value_heads. Throws Error naming the entry otherwise.
void read_per_layer_config(const JsonFields& f, ModelConfig& c) {
  const nlohmann::json* plc = f.get("per_layer_config");
  if (!plc || plc->is_null()) return;
  const std::string where = f.src + ": " + f.prefix + "per_layer_config";
  DFLASH_CHECK(plc->is_object(), where, ": expected an object of layer index -> {head_dim, num_key_value_heads}");
  int64_t gd = 0, gkv = 0, full_listed = 0;
  for (const auto& [key, v] : plc->items()) {
    const std::string at = where + "." + key;
    DFLASH_CHECK(!key.empty() && key.find_first_not_of("0123456789") == std::string::npos && key.size() < 10 &&
                     std::stoll(key) < c.num_hidden_layers,
                 at, ": not a layer index of the ", c.num_hidden_layers, "-layer model");
    DFLASH_CHECK(v.is_object(), at, ": expected an object, got ", v.dump());
    for (const auto& [k, x] : v.items())
      DFLASH_CHECK((k == "head_dim" || k == "num_key_value_heads") && x.is_number_integer() && x.get<int64_t>() > 0,
                   at, ".", k, ": ", x.dump(), " is not supported (a positive head_dim or num_key_value_heads)");
    const int64_t l = std::stoll(key);
    const int64_t d = v.value("head_dim", int64_t{0}), n = v.value("num_key_value_heads", int64_t{0});
    if (c.layer_types[static_cast<size_t>(l)] == LayerType::SlidingAttention) {
      DFLASH_CHECK((d == 0 || d == c.head_dim) && (n == 0 || n == c.num_key_value_heads), at,
                   ": a sliding layer with its own geometry is not supported (head_dim ", c.head_dim,
                   ", num_key_value_heads ", c.num_key_value_heads, " for every sliding layer)");
      continue;
    }
    ++full_listed;
    DFLASH_CHECK(d > 0, at, ": a full-attention layer's entry needs head_dim");
    DFLASH_CHECK(gd == 0 || d == gd, at, ".head_dim ", d, ": full layers of different head dims are not supported");
    gd = d;
    const int64_t kv = n > 0 ? n : c.num_key_value_heads;
    DFLASH_CHECK(gkv == 0 || kv == gkv, at, ".num_key_value_heads ", kv,
                 ": full layers of different kv heads are not supported");
    gkv = kv;
  }
  int64_t full = 0;
  for (LayerType t : c.layer_types) full += t == LayerType::FullAttention ? 1 : 0;
  if (full_listed == 0) return;
  DFLASH_CHECK(full_listed == full, where, ": lists ", full_listed, " of the ", full,
               " full-attention layers (a full layer left out would have the sliding layers' geometry: not supported)");
  DFLASH_CHECK(!f.get("global_head_dim") || c.global_head_dim == gd, where, ": head_dim ", gd,
               " differs from global_head_dim ", c.global_head_dim);
  c.global_head_dim = gd;
  if (c.attention_k_eq_v) {
    DFLASH_CHECK(!f.get("num_global_key_value_heads") || c.num_global_kv_heads == gkv, where,
                 ": num_key_value_heads ", gkv, " differs from num_global_key_value_heads ", c.num_global_kv_heads);
    c.num_global_kv_heads = gkv;
  } else {
    DFLASH_CHECK(gkv == c.num_key_value_heads, where, ": full layers with ", gkv, " kv heads where the sliding ones "
                 "have ", c.num_key_value_heads, " need attention_k_eq_v (not supported otherwise)");
  }
}

}  // namespace

void read_gemma4(const JsonFields& f, ModelConfig& c) {
  const std::string& src = f.src;
  const std::string& p = f.prefix;
  c.head_dim = f.opt_int("head_dim", 256);
  if (!f.get("num_key_value_heads")) c.num_key_value_heads = 4;
  if (!f.get("max_position_embeddings")) c.max_position_embeddings = 131072;
  if (!f.get("bos_token_id") && c.bos_token_id < 0) c.bos_token_id = 2;
  if (c.eos_token_ids.empty()) c.eos_token_ids = {1};
  // Gemma4TextConfig / Gemma4Config tie the embeddings by default; the shared reader's default is false (a key at the
  // top level of an image-text config that the text config lacks was already read there)
  if (!f.get("tie_word_embeddings") && !c.tie_word_embeddings) c.tie_word_embeddings = true;
  DFLASH_CHECK(c.num_attention_heads % c.num_key_value_heads == 0, src, ": ", p, "num_key_value_heads ",
               c.num_key_value_heads, " must divide num_attention_heads ", c.num_attention_heads);
  const std::string act = f.opt_str("hidden_activation", "gelu_pytorch_tanh");
  DFLASH_CHECK(act == "gelu_pytorch_tanh", src, ": ", p, "hidden_activation: '", act,
               "' is not supported (gelu_pytorch_tanh, as every published Gemma 4)");
  c.mlp_act = MlpAct::GeluTanh;
  c.qk_norm = true;
  DFLASH_CHECK(!f.opt_bool("attention_bias", false), src, ": ", p,
               "attention_bias: true is not supported (the published Gemma 4 models have no attention biases)");
  // the options of the small Gemma 4 models (E2B / E4B) that the published 31B and 26B-A4B do not use
  const int64_t ple = f.opt_int("hidden_size_per_layer_input", 0);
  DFLASH_CHECK(ple == 0, src, ": ", p, "hidden_size_per_layer_input: ", ple,
               " is not supported (per-layer input embeddings are not run; 0 or null: none)");
  const int64_t shared = f.opt_int("num_kv_shared_layers", 0);
  DFLASH_CHECK(shared == 0, src, ": ", p, "num_kv_shared_layers: ", shared,
               " is not supported (KV sharing across layers is not run; 0: every layer has its own keys and values)");
  const std::string bidir = f.opt_str("use_bidirectional_attention", "");
  DFLASH_CHECK(bidir.empty() || bidir == "vision", src, ": ", p, "use_bidirectional_attention: '", bidir,
               "' is not supported (null, or \"vision\": text tokens attend causally)");
  // global (full-attention) layers: their own head dim; with attention_k_eq_v their own kv heads and no v_proj
  c.global_head_dim = f.opt_int("global_head_dim", 512);
  c.attention_k_eq_v = f.opt_bool("attention_k_eq_v", false);
  if (c.attention_k_eq_v) c.num_global_kv_heads = f.opt_int("num_global_key_value_heads", 0);
  // layer_types (absent: 5 sliding then 1 full), the last layer always full (Gemma4TextConfig.__post_init__)
  c.layer_types.clear();
  if (const nlohmann::json* lt = f.get("layer_types")) {
    DFLASH_CHECK(lt->is_array() && static_cast<int64_t>(lt->size()) == c.num_hidden_layers, src, ": ", p,
                 "layer_types: expected a list of ", c.num_hidden_layers, " strings (one per layer), got ", lt->dump());
    for (size_t l = 0; l < lt->size(); ++l) {
      const nlohmann::json& e = (*lt)[l];
      DFLASH_CHECK(e.is_string() && (e == "sliding_attention" || e == "full_attention"), src, ": ", p, "layer_types[",
                   l, "]: ", e.dump(), " is not \"sliding_attention\" or \"full_attention\"");
      c.layer_types.push_back(e == "sliding_attention" ? LayerType::SlidingAttention : LayerType::FullAttention);
    }
  } else {
    for (int64_t l = 0; l < c.num_hidden_layers; ++l)
      c.layer_types.push_back((l + 1) % 6 ? LayerType::SlidingAttention : LayerType::FullAttention);
  }
  c.layer_types.back() = LayerType::FullAttention;
  read_per_layer_config(f, c);
  DFLASH_CHECK(c.global_head_dim > 0 && c.global_head_dim % 2 == 0, src, ": ", p,
               "global_head_dim: must be a positive even number, got ", c.global_head_dim);
  if (c.attention_k_eq_v) {
    DFLASH_CHECK(c.num_global_kv_heads != 0, src, " missing ", p,
                 "num_global_key_value_heads (needed with attention_k_eq_v; or the full layers' num_key_value_heads "
                 "in per_layer_config)");
    DFLASH_CHECK(c.num_global_kv_heads > 0 && c.num_attention_heads % c.num_global_kv_heads == 0, src, ": ", p,
                 "num_global_key_value_heads ", c.num_global_kv_heads, " must be positive and divide "
                 "num_attention_heads ", c.num_attention_heads);
  }
  c.sliding_window = f.opt_int("sliding_window", 512);
  DFLASH_CHECK(c.sliding_window > 0, src, ": ", p, "sliding_window: must be positive, got ", c.sliding_window);
  // RoPE per layer type: sliding layers "default" at their theta over head_dim (the config's RoPE); full layers
  // "proportional" over global_head_dim (RopeAlt)
  const std::string rp = p + "rope_parameters.";
  const TypeRope sl = type_rope(f, "sliding_attention", {"default", 10000.0, 1.0, 1.0});
  DFLASH_CHECK(sl.type == "default" && sl.partial == 1.0 && sl.factor == 1.0, src, ": ", rp,
               "sliding_attention: rope_type '", sl.type, "' with partial_rotary_factor ", sl.partial, " and factor ",
               sl.factor, " is not supported (\"default\", full rotary, no scaling)");
  c.rope_theta = sl.theta;
  c.rope_scaling = RopeScaling{};
  c.rotary_dim = 0;
  const TypeRope fu = type_rope(f, "full_attention", {"proportional", 1000000.0, 0.25, 1.0});
  DFLASH_CHECK(fu.type == "proportional" && fu.factor == 1.0, src, ": ", rp, "full_attention: rope_type '", fu.type,
               "' with factor ", fu.factor, " is not supported (\"proportional\" without scaling)");
  DFLASH_CHECK(fu.partial > 0 && fu.partial <= 1 && fu.theta > 0, src, ": ", rp,
               "full_attention: partial_rotary_factor ", fu.partial, " must be in (0, 1] and rope_theta positive");
  c.rope_alt.theta = fu.theta;
  c.rope_alt.dim = c.global_head_dim;
  // rope_angles = int(partial_rotary_factor * head_dim // 2)
  c.rope_alt.rotated = 2 * static_cast<int64_t>(std::floor(fu.partial * static_cast<double>(c.global_head_dim) / 2));
  if (const nlohmann::json* cap = f.get("final_logit_softcapping")) {
    c.final_logit_softcap = f.opt_num("final_logit_softcapping", 0.0);
    DFLASH_CHECK(cap->is_number() && c.final_logit_softcap > 0, src, ": ", p,
                 "final_logit_softcapping: must be positive or null, got ", cap->dump());
  }
  // Gemma4TextScaledWordEmbedding: torch.tensor(hidden_size ** 0.5) (float32), cast to the weights' dtype
  c.embed_scale = static_cast<double>(static_cast<float>(std::sqrt(static_cast<double>(c.hidden_size))));
  c.moe = MoeConfig{};
  if (f.opt_bool("enable_moe_block", false)) {  // Gemma4TextRouter + Gemma4TextExperts beside the dense MLP
    MoeConfig& m = c.moe;
    DFLASH_CHECK(f.get("num_experts") && f.get("top_k_experts") && f.get("moe_intermediate_size"), src, ": ", p,
                 "enable_moe_block needs num_experts, top_k_experts and moe_intermediate_size");
    m.num_experts = f.opt_int("num_experts", 0);
    m.top_k = f.opt_int("top_k_experts", 0);
    m.expert_width = f.opt_int("moe_intermediate_size", 0);
    DFLASH_CHECK(m.num_experts >= 1 && m.top_k >= 1 && m.top_k <= m.num_experts && m.expert_width > 0, src, ": ", p,
                 "num_experts ", m.num_experts, ", top_k_experts ", m.top_k, ", moe_intermediate_size ",
                 m.expert_width, ": need 1 <= top_k_experts <= num_experts and a positive width");
    m.norm_topk_prob = true;  // the top-k weights always renormalised, then times per_expert_scale
    m.router_scales = true;
    m.act = ExpertAct::GeluTanh;
    m.dense_beside_width = c.intermediate_size;
  }
}

LayerSpec gemma4_layer(const ModelConfig& c, int64_t l) {
  LayerSpec s;
  const bool sliding = c.layer_types[static_cast<size_t>(l)] == LayerType::SlidingAttention;
  s.attention.qk_norm = true;
  s.attention.v_norm = true;
  s.attention.scale = 1.0;
  if (sliding) {
    s.attention.sliding_window = c.sliding_window;
  } else {
    s.attention.head_dim = c.global_head_dim;
    s.attention.k_eq_v = c.attention_k_eq_v;
    if (c.attention_k_eq_v) s.attention.num_kv_heads = c.num_global_kv_heads;
    s.attention.rope_alt = true;
  }
  s.mlp = c.moe.num_experts > 0 ? ChannelMixer::MoE : ChannelMixer::Dense;  // enable_moe_block: every layer
  s.mlp_width = c.moe.num_experts > 0 ? c.moe.expert_width : c.intermediate_size;
  s.sandwich_norms = true;
  s.layer_scalar = true;
  return s;
}

WeightNames gemma4_names(bool image_text) {
  WeightNames n;
  n.post_norm = "pre_feedforward_layernorm.weight";  // the norm before the MLP (sandwich norms: model_family.h)
  n.router = "router.proj.weight";
  n.expert = "experts.";
  if (image_text) {
    n.embed = "model.language_model.embed_tokens.weight";
    n.final_norm = "model.language_model.norm.weight";
    n.layer = "model.language_model.layers.";
  }
  n.ignored = {"model.vision_tower.", "model.embed_vision.", "model.audio_tower.", "model.embed_audio."};
  return n;
}

DrafterDefaults gemma4_drafter(const ModelConfig& c) {
  DrafterDefaults d;
  d.num_heads = 64;
  d.num_kv_heads = 8;
  d.head_dim = 128;
  d.intermediate_size = 2 * c.hidden_size;
  d.rope_theta = c.rope_alt.theta;
  return d;
}

}  // namespace dflash
