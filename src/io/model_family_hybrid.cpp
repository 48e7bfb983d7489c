// io/model_family_hybrid.cpp — the Qwen3-Next and Qwen3.5 / Qwen3.6 families (io/model_family_hybrid.h): their
// configuration classes' keys and defaults (transformers 5.17 configuration_qwen3_next.py, configuration_qwen3_5.py,
// configuration_qwen3_5_moe.py) and the per-layer plan.
#include "io/model_family_hybrid.h"

#include <cstring>

#include "core/error.h"

namespace dflash {

namespace {

// The keys every hybrid family shares: attention (head_dim 256, gated, q/k norm, partial rotary), zero-centred norms,
// the Gated DeltaNet's heads and convolution, and the mixer of every layer.
void read_hybrid_common(const JsonFields& f, ModelConfig& c) {
  c.head_dim = f.opt_int("head_dim", 256);
  c.attention_bias = f.opt_bool("attention_bias", false);
  c.qk_norm = true;
  c.zero_centred_norms = true;
  const std::string act = f.opt_str("hidden_act", "silu");
  DFLASH_CHECK(act == "silu", f.src, ": ", f.prefix, "hidden_act: '", act, "' is not supported (silu)");
  // partial_rotary_factor: in rope_parameters (transformers >= 5 writes it there), else at the top level (older files,
  // Qwen3-Next's published config); the configuration classes default it to 0.25.
  double factor = f.opt_num("partial_rotary_factor", 0.25);
  if (const nlohmann::json* rp = f.get("rope_parameters"); rp && rp->is_object())
    factor = JsonFields{*rp, f.src, f.prefix + "rope_parameters."}.opt_num("partial_rotary_factor", factor);
  DFLASH_CHECK(factor > 0 && factor <= 1, f.src, ": ", f.prefix, "partial_rotary_factor: ", factor,
               " must be in (0, 1]");
  c.rotary_dim = static_cast<int64_t>(static_cast<double>(c.head_dim) * factor);  // int(head_dim * factor)
  DFLASH_CHECK(c.rotary_dim >= 2 && c.rotary_dim % 2 == 0, f.src, ": ", f.prefix, "partial_rotary_factor ", factor,
               " of head_dim ", c.head_dim, " gives ", c.rotary_dim, " rotary dims; they must be a positive even number");

  LinearAttnConfig& a = c.linear_attn;
  a.num_key_heads = f.opt_int("linear_num_key_heads", 16);
  a.num_value_heads = f.opt_int("linear_num_value_heads", 32);
  a.key_head_dim = f.opt_int("linear_key_head_dim", 128);
  a.value_head_dim = f.opt_int("linear_value_head_dim", 128);
  a.conv_kernel = f.opt_int("linear_conv_kernel_dim", 4);
  DFLASH_CHECK(a.num_key_heads > 0 && a.num_value_heads > 0 && a.num_value_heads % a.num_key_heads == 0, f.src, ": ",
               f.prefix, "linear_num_value_heads ", a.num_value_heads, " must be a positive multiple of ",
               "linear_num_key_heads ", a.num_key_heads);
  DFLASH_CHECK(a.key_head_dim > 0 && a.value_head_dim > 0, f.src, ": ", f.prefix,
               "linear_key_head_dim / linear_value_head_dim must be positive, got ", a.key_head_dim, " / ",
               a.value_head_dim);
  DFLASH_CHECK(a.conv_kernel >= 1 && a.conv_kernel <= 64, f.src, ": ", f.prefix, "linear_conv_kernel_dim ",
               a.conv_kernel, " must be in [1, 64]");

  // layer_types (kept in c.layer_types, "attention" read as "full_attention"), else every full_attention_interval-th
  // layer is full attention
  c.layer_types.assign(static_cast<size_t>(c.num_hidden_layers), LayerType::FullAttention);
  if (const nlohmann::json* lt = f.get("layer_types")) {
    DFLASH_CHECK(lt->is_array() && static_cast<int64_t>(lt->size()) == c.num_hidden_layers, f.src, ": ", f.prefix,
                 "layer_types: expected a list of ", c.num_hidden_layers, " strings (one per layer), got ", lt->dump());
    for (size_t l = 0; l < lt->size(); ++l) {
      const nlohmann::json& e = (*lt)[l];
      const std::string t = e.is_string() ? e.get<std::string>() : e.dump();
      DFLASH_CHECK(t == "linear_attention" || t == "full_attention" || t == "attention", f.src, ": ", f.prefix,
                   "layer_types[", l, "]: '", t, "' is not linear_attention or full_attention");
      if (t == "linear_attention") c.layer_types[l] = LayerType::LinearAttention;
    }
  } else {
    const int64_t interval = f.opt_int("full_attention_interval", 4);
    DFLASH_CHECK(interval >= 1, f.src, ": ", f.prefix, "full_attention_interval: must be >= 1, got ", interval);
    for (int64_t l = 0; l < c.num_hidden_layers; ++l)
      if ((l + 1) % interval != 0) c.layer_types[static_cast<size_t>(l)] = LayerType::LinearAttention;
  }
}

// Routed experts and the shared expert (Qwen3NextSparseMoeBlock), with the configuration class's defaults.
void read_hybrid_moe(const JsonFields& f, ModelConfig& c, int64_t experts, int64_t top_k) {
  MoeConfig& m = c.moe;
  m.num_experts = f.opt_int("num_experts", experts);
  m.top_k = f.opt_int("num_experts_per_tok", top_k);
  m.expert_width = f.opt_int("moe_intermediate_size", 512);
  m.shared_expert_width = f.opt_int("shared_expert_intermediate_size", 512);
  DFLASH_CHECK(m.num_experts >= 0, f.src, ": ", f.prefix, "num_experts: must be >= 0, got ", m.num_experts);
  if (m.num_experts > 0) {
    DFLASH_CHECK(m.top_k >= 1 && m.top_k <= m.num_experts, f.src, ": ", f.prefix, "num_experts_per_tok: ", m.top_k,
                 " must be in [1, num_experts = ", m.num_experts, "]");
    DFLASH_CHECK(m.expert_width > 0, f.src, ": ", f.prefix, "moe_intermediate_size: must be positive, got ",
                 m.expert_width);
    DFLASH_CHECK(m.shared_expert_width >= 0, f.src, ": ", f.prefix,
                 "shared_expert_intermediate_size: must be >= 0, got ", m.shared_expert_width);
  }
}

LayerSpec hybrid_layer(const ModelConfig& c, int64_t l) {
  LayerSpec s;
  const bool linear = l < static_cast<int64_t>(c.layer_types.size()) &&
                      c.layer_types[static_cast<size_t>(l)] == LayerType::LinearAttention;
  s.mixer = linear ? TokenMixer::LinearAttention : TokenMixer::Attention;
  s.attention.bias = c.attention_bias;
  s.attention.qk_norm = true;
  s.attention.output_gate = true;
  s.mlp = ChannelMixer::Dense;
  s.mlp_width = c.intermediate_size;
  return s;
}

}  // namespace

void read_qwen3_next(const JsonFields& f, ModelConfig& c) {
  read_hybrid_common(f, c);
  read_hybrid_moe(f, c, 512, 10);
  c.moe.norm_topk_prob = f.opt_bool("norm_topk_prob", true);
  read_sparse_layers(f, c, c.moe);
}

LayerSpec qwen3_next_layer(const ModelConfig& c, int64_t l) {
  LayerSpec s = hybrid_layer(c, l);
  if (is_sparse_layer(c.moe, l)) {  // Qwen3NextDecoderLayer
    s.mlp = ChannelMixer::MoE;
    s.mlp_width = c.moe.expert_width;
  }
  return s;
}

void read_qwen3_5(const JsonFields& f, ModelConfig& c) {
  read_hybrid_common(f, c);
  c.moe = MoeConfig{};  // Qwen3_5TextConfig deletes the MoE keys
}

LayerSpec qwen3_5_layer(const ModelConfig& c, int64_t l) { return hybrid_layer(c, l); }

void read_qwen3_5_moe(const JsonFields& f, ModelConfig& c) {
  read_hybrid_common(f, c);
  read_hybrid_moe(f, c, 256, 8);
  DFLASH_CHECK(c.moe.num_experts > 0, f.src, ": ", f.prefix, "num_experts: a Qwen3.5-MoE model needs experts, got 0");
  c.moe.norm_topk_prob = true;  // Qwen3_5MoeTopKRouter always renormalises (norm_topk_prob is not a key)
}

LayerSpec qwen3_5_moe_layer(const ModelConfig& c, int64_t l) {
  LayerSpec s = hybrid_layer(c, l);  // Qwen3_5MoeDecoderLayer: every layer is sparse
  s.mlp = ChannelMixer::MoE;
  s.mlp_width = c.moe.expert_width;
  return s;
}

WeightNames hybrid_names(bool image_text) {
  WeightNames n;
  if (image_text) {
    n.embed = "model.language_model.embed_tokens.weight";
    n.final_norm = "model.language_model.norm.weight";
    n.layer = "model.language_model.layers.";
    n.ignored = {"model.visual.", "mtp."};
  } else {
    n.ignored = {"mtp.", "model.visual."};
  }
  return n;
}

DrafterDefaults hybrid_drafter(const ModelConfig& c) {
  DrafterDefaults d;
  d.num_heads = 32;
  d.head_dim = 128;
  d.num_kv_heads = c.has_moe() ? 4 : 8;
  return d;
}

SplitLinearAttnProjections split_grouped_qkvz(const Tensor& qkvz, const Tensor& ba, const LinearAttnConfig& a) {
  const int64_t nk = a.num_key_heads, dk = a.key_head_dim, nv = a.num_value_heads, r = nv / nk;
  const int64_t vd = r * a.value_head_dim, group = 2 * dk + 2 * vd, kd = a.key_dim(), H = qkvz.shape.back();
  DFLASH_CHECK(qkvz.ndim() == 2 && qkvz.shape[0] == nk * group && ba.ndim() == 2 && ba.shape[0] == 2 * nv &&
                   ba.shape[1] == H && ba.dtype == qkvz.dtype,
               "split_grouped_qkvz: qkvz ", shape_str(qkvz.shape), " and ba ", shape_str(ba.shape), " for ", nk,
               " key heads of ", dk, " and ", nv, " value heads of ", a.value_head_dim);
  SplitLinearAttnProjections out;
  out.qkv = cpu_empty(qkvz.dtype, {a.conv_dim(), H});
  out.z = cpu_empty(qkvz.dtype, {a.value_dim(), H});
  out.ba = cpu_empty(ba.dtype, {2 * nv, H});
  const size_t row = qkvz.nbytes() / static_cast<size_t>(qkvz.shape[0]);
  // n rows from row s of `from` to row d of `to`
  auto copy_rows = [row](const Tensor& to, int64_t d, const Tensor& from, int64_t s, int64_t n) {
    std::memcpy(static_cast<uint8_t*>(to.data) + d * row, static_cast<const uint8_t*>(from.data) + s * row,
                static_cast<size_t>(n) * row);
  };
  for (int64_t g = 0; g < nk; ++g) {
    const int64_t s = g * group;
    copy_rows(out.qkv, g * dk, qkvz, s, dk);                    // q_g
    copy_rows(out.qkv, kd + g * dk, qkvz, s + dk, dk);          // k_g
    copy_rows(out.qkv, 2 * kd + g * vd, qkvz, s + 2 * dk, vd);  // v_g
    copy_rows(out.z, g * vd, qkvz, s + 2 * dk + vd, vd);        // z_g
    copy_rows(out.ba, g * r, ba, g * 2 * r, r);                 // b_g
    copy_rows(out.ba, nv + g * r, ba, g * 2 * r + r, r);        // a_g
  }
  return out;
}

}  // namespace dflash
