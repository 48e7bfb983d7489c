#include "model/drafter.h"

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "core/rng.h"
#include "io/json_fields.h"  // fields_to_json, fields_from_json
#include "io/model_family.h"
#include "model/draft_loss.h"  // loss_head: the loss weights (decay or D-PACE) and the lm_head + loss

namespace dflash {

// ---- config --------------------------------------------------------------------------------------------------

const char* draft_arch_name(DraftArch a) { return a == DraftArch::DFlash2 ? "dflash2" : "dflash"; }

DraftArch parse_draft_arch(const std::string& s, const char* field) {
  if (s == "dflash") return DraftArch::DFlash;
  if (s == "dflash2") return DraftArch::DFlash2;
  DFLASH_FAIL(field, ": '", s, "' is not a drafter architecture (dflash, dflash2)");
}

void DrafterConfig::validate() const {
  auto pos = [](int64_t v, const char* name) { DFLASH_CHECK(v > 0, "drafter config: ", name, " must be > 0, got ", v); };
  pos(hidden_size, "hidden_size");
  pos(intermediate_size, "intermediate_size");
  pos(num_layers, "num_layers");
  pos(num_heads, "num_heads");
  pos(num_kv_heads, "num_kv_heads");
  pos(head_dim, "head_dim");
  pos(vocab_size, "vocab_size");
  pos(block_size, "block_size");
  DFLASH_CHECK(num_heads % num_kv_heads == 0, "drafter config: num_heads ", num_heads,
               " is not a multiple of num_kv_heads ", num_kv_heads);
  DFLASH_CHECK(head_dim % 2 == 0, "drafter config: head_dim must be even for RoPE, got ", head_dim);
  validate_target_layer_ids(target_layer_ids, num_target_layers);  // distinct, ascending, in range (hf_config.h)
  DFLASH_CHECK(layer_types.empty() || static_cast<int64_t>(layer_types.size()) == num_layers, "drafter config: ",
               layer_types.size(), " layer_types for ", num_layers, " layers");
  bool sliding = false;
  for (size_t l = 0; l < layer_types.size(); ++l) {
    DFLASH_CHECK(layer_types[l] == "full_attention" || layer_types[l] == "sliding_attention", "drafter config: layer_types[",
                 l, "] is \"", layer_types[l], "\" (expected full_attention or sliding_attention)");
    sliding |= layer_types[l] == "sliding_attention";
  }
  DFLASH_CHECK(!sliding || (sliding_window > 0 && sliding_window < (int64_t{1} << 30)), "drafter config: sliding_window ",
               sliding_window, " must be a positive number of tokens for the sliding_attention layers");
  if (dflash2()) {
    DFLASH_CHECK(conv_group_size > 0, "drafter config: conv_group_size ", conv_group_size, " must be > 0");
    DFLASH_CHECK(hidden_size % conv_group_size == 0, "drafter config: conv_group_size ", conv_group_size,
                 " does not divide hidden_size ", hidden_size);
    DFLASH_CHECK(conv_kernel_size >= 1 && conv_kernel_size <= block_size, "drafter config: conv_kernel_size ",
                 conv_kernel_size, " must be in [1, block_size = ", block_size, "]");
    DFLASH_CHECK(selector_rank > 0, "drafter config: selector_rank ", selector_rank, " must be > 0");
    DFLASH_CHECK(selector_top_k >= 1 && selector_top_k <= vocab_size, "drafter config: selector_top_k ",
                 selector_top_k, " must be in [1, vocab_size = ", vocab_size, "]");
  }
  DFLASH_CHECK(mask_token_id >= 0 && mask_token_id < vocab_size, "drafter config: mask_token_id ", mask_token_id,
               " is not a row of the target's ", vocab_size, "-row embedding (spec 1: the mask token must be an "
               "existing row; set it with --mask-token-id or use a tokenizer that defines one)");
}

namespace {

// h = embed[ids], times the target's embedding scale when it has one (rounded to the compute dtype, as the target).
void embed_blocks(Context& ctx, const Tensor& embed, const Tensor& ids, const Tensor& h, double scale) {
  ctx.embedding(embed, ids, h);
  if (scale <= 0) return;
  const float f = static_cast<float>(scale);
  const DType dt = ctx.compute_dtype();
  const float s = dt == DType::BF16 ? round_bf16(f) : dt == DType::F16 ? f16_to_f32(f32_to_f16(f)) : f;
  ctx.add(h, h, s - 1.0f);  // h + (s - 1) h, one rounding
}

}  // namespace

float DrafterConfig::softmax_scale() const {
  const double af = rope_scaling.attention_scaling();  // YaRN: cos and sin times af in transformers' RoPE
  return 1.0f / std::sqrt(static_cast<float>(head_dim)) * static_cast<float>(af * af);
}

int64_t default_intermediate_size(const ModelConfig& t) {
  if (const auto family = family_of(t.arch).drafter)  // gpt-oss: 8 H / 3, as published
    if (const int64_t width = family(t).intermediate_size; width > 0) return width;
  return t.has_moe() ? 3 * t.hidden_size : t.intermediate_size;
}

DrafterConfig DrafterConfig::for_target(const ModelConfig& t, int64_t num_layers, int64_t block_size,
                                        std::vector<int64_t> layer_ids, int32_t mask_token_id) {
  DrafterConfig c;
  c.hidden_size = t.hidden_size;
  c.intermediate_size = default_intermediate_size(t);
  c.num_layers = num_layers;
  c.num_heads = t.num_attention_heads;
  c.num_kv_heads = t.num_key_value_heads;
  c.head_dim = t.head_dim;
  // The family's own drafter shape where the published drafters do not copy the target's attention (a hybrid
  // target's gated head_dim-256 attention: 32 heads of 128; io/model_family.h DrafterDefaults)
  if (const auto family = family_of(t.arch).drafter) {
    const DrafterDefaults d = family(t);
    if (d.num_heads > 0) c.num_heads = d.num_heads;
    if (d.num_kv_heads > 0) c.num_kv_heads = d.num_kv_heads;
    if (d.head_dim > 0) c.head_dim = d.head_dim;
  }
  c.vocab_size = t.vocab_size;
  c.block_size = block_size;
  c.target_layer_ids = std::move(layer_ids);
  c.num_target_layers = t.num_hidden_layers;
  c.mask_token_id = mask_token_id;
  c.rms_norm_eps = t.rms_norm_eps;
  c.rope_theta = t.rope_theta;
  c.rope_scaling = t.rope_scaling;
  c.max_position_embeddings = t.max_position_embeddings;
  if (const auto family = family_of(t.arch).drafter)  // Gemma 4: the full-attention layers' theta, as published
    if (const double theta = family(t).rope_theta; theta > 0) c.rope_theta = theta;
  c.embed_scale = t.embed_scale;
  return c;
}

std::vector<std::string> resolve_layer_types(const std::vector<std::string>& given, int64_t num_layers,
                                             int64_t sliding_window) {
  DFLASH_CHECK(sliding_window >= 0, "--sliding-window ", sliding_window, " must be >= 0 (0 = no sliding layers)");
  if (given.empty())
    return sliding_window > 0 ? std::vector<std::string>(static_cast<size_t>(num_layers), "sliding_attention")
                              : std::vector<std::string>{};
  DFLASH_CHECK(static_cast<int64_t>(given.size()) == num_layers, "--layer-types names ", given.size(),
               " layer types for ", num_layers, " draft layers (one per layer)");
  std::vector<std::string> out;
  bool sliding = false;
  for (const std::string& t : given) {
    if (t == "full" || t == "full_attention") {
      out.push_back("full_attention");
    } else if (t == "sliding" || t == "sliding_attention") {
      out.push_back("sliding_attention");
      sliding = true;
    } else {
      DFLASH_FAIL("--layer-types: '", t, "' is not one of full_attention (full), sliding_attention (sliding)");
    }
  }
  DFLASH_CHECK(!sliding || sliding_window > 0, "--layer-types has sliding_attention layers: give their window with "
               "--sliding-window W");
  if (!sliding) out.clear();
  return out;
}

bool DrafterConfig::any_sliding() const {
  return std::find(layer_types.begin(), layer_types.end(), "sliding_attention") != layer_types.end();
}

int DrafterConfig::window_of(int64_t l) const {
  const bool sliding = l >= 0 && l < static_cast<int64_t>(layer_types.size()) && layer_types[l] == "sliding_attention";
  return sliding ? static_cast<int>(sliding_window) : 0;
}

namespace {

// DrafterConfig's checkpoint keys, for both directions (io/json_fields.h fields_to_json / fields_from_json):
// f(key, member, required). rope_scaling is RopeScaling's own mapping (io/hf_config.h).
const auto drafter_config_fields = [](auto& c, auto&& f) {
  f("hidden_size", c.hidden_size, true);
  f("intermediate_size", c.intermediate_size, true);
  f("num_layers", c.num_layers, true);
  f("num_heads", c.num_heads, true);
  f("num_kv_heads", c.num_kv_heads, true);
  f("head_dim", c.head_dim, true);
  f("vocab_size", c.vocab_size, true);
  f("block_size", c.block_size, true);
  f("target_layer_ids", c.target_layer_ids, true);
  f("num_target_layers", c.num_target_layers, true);
  f("mask_token_id", c.mask_token_id, true);
  f("rms_norm_eps", c.rms_norm_eps, true);
  f("rope_theta", c.rope_theta, true);
  f("rope_scaling", c.rope_scaling, true);
  f("max_position_embeddings", c.max_position_embeddings, true);
  f("layer_types", c.layer_types, false);  // absent in checkpoints written before sliding windows
  f("sliding_window", c.sliding_window, false);
  f("embed_scale", c.embed_scale, false);  // absent before Gemma targets: 0
};

}  // namespace

// DFlash2's keys follow the fields, only in a DFlash2 drafter's config: a DFlash checkpoint keeps the keys it always
// had (and one without "arch" is DFlash).
void to_json(nlohmann::json& j, const DrafterConfig& c) {
  fields_to_json(j, c, drafter_config_fields);
  if (c.dflash2())
    j.update({{"arch", draft_arch_name(c.arch)},
              {"conv_kernel_size", c.conv_kernel_size},
              {"conv_group_size", c.conv_group_size},
              {"selector_rank", c.selector_rank},
              {"selector_top_k", c.selector_top_k}});
}
void from_json(const nlohmann::json& j, DrafterConfig& c) {
  fields_from_json(j, c, drafter_config_fields);
  c.arch = parse_draft_arch(j.value("arch", std::string("dflash")), "drafter config arch");
  if (c.dflash2()) {
    j.at("conv_kernel_size").get_to(c.conv_kernel_size);
    j.at("conv_group_size").get_to(c.conv_group_size);
    j.at("selector_rank").get_to(c.selector_rank);
    j.at("selector_top_k").get_to(c.selector_top_k);
  }
}

// ---- parameters ------------------------------------------------------------------------------------------

struct Drafter::LayerParams {
  Param *in_norm, *post_norm, *wq, *wk, *wv, *wo, *q_norm, *k_norm, *gate, *up, *down;
  // DFlash2's convolutions around the attention and the MLP (null for DFlash)
  Param *attn_base = nullptr, *attn_proj = nullptr, *mlp_base = nullptr, *mlp_proj = nullptr;
};

struct Drafter::LayerActs {
  Tensor h_in;                     // the layer input [NB, H] (a view; its owner keeps it alive)
  Tensor xn, rstd_in;              // RMSNorm_in(h_in) [NB, H], [NB]
  Tensor q_pre, rstd_q, q;         // [NB, nh*d] before q_norm; [NB*nh]; [NB, nh, d] after norm + RoPE
  Tensor kc_pre, rstd_kc, kc, vc;  // context keys/values [S, nkv*d], [S*nkv], [S, nkv, d], [S, nkv, d]
  Tensor kb_pre, rstd_kb, kb, vb;  // block keys/values   [NB, nkv*d], [NB*nkv], [NB, nkv, d], [NB, nkv, d]
  Tensor o, lse;                   // attention output [NB, nh, d], [NB, nh]
  Tensor h_mid, rstd_post, xn2;    // after the attention residual [NB, H]; [NB]; RMSNorm_post(h_mid) [NB, H]
  Tensor gate, up, act;            // [NB, I]
  // DFlash2: the dynamic coefficients of the attention and MLP convolutions [NB, 2 T G]; the convolved inputs of
  // the attention and the MLP, the o_proj and down_proj outputs before their convolutions [NB, H]
  Tensor delta_attn, delta_mlp, x_attn, x_mlp, attn_out, mlp_out;
};

namespace {
std::string lp(int64_t l, const char* rest) { return cat("layers.", l, ".", rest); }
}  // namespace

Drafter::LayerParams Drafter::layer(int64_t l) const {
  auto& ps = const_cast<ParamSet&>(params_);
  LayerParams P{&ps.get(lp(l, "input_layernorm.weight")),   &ps.get(lp(l, "post_attention_layernorm.weight")),
                &ps.get(lp(l, "self_attn.q_proj.weight")),  &ps.get(lp(l, "self_attn.k_proj.weight")),
                &ps.get(lp(l, "self_attn.v_proj.weight")),  &ps.get(lp(l, "self_attn.o_proj.weight")),
                &ps.get(lp(l, "self_attn.q_norm.weight")),  &ps.get(lp(l, "self_attn.k_norm.weight")),
                &ps.get(lp(l, "mlp.gate_proj.weight")),     &ps.get(lp(l, "mlp.up_proj.weight")),
                &ps.get(lp(l, "mlp.down_proj.weight"))};
  if (cfg_.dflash2()) {
    P.attn_base = &ps.get(lp(l, "attention_conv.base_kernel"));
    P.attn_proj = &ps.get(lp(l, "attention_conv.kernel_projection.weight"));
    P.mlp_base = &ps.get(lp(l, "mlp_conv.base_kernel"));
    P.mlp_proj = &ps.get(lp(l, "mlp_conv.kernel_projection.weight"));
  }
  return P;
}

DynConvArgs Drafter::conv_args(const Param& base, const Tensor& u, const Tensor& delta, int side) const {
  return DynConvArgs{u, delta, base.compute, side, cfg_.block_size, cfg_.conv_group_size};
}

std::vector<DrafterParamSpec> drafter_param_specs(const DrafterConfig& c) {
  const int64_t H = c.hidden_size, I = c.intermediate_size, d = c.head_dim;
  const int64_t nh = c.num_heads, nkv = c.num_kv_heads, nf = c.nf();
  std::vector<DrafterParamSpec> v;
  auto linear = [&](std::string name, Shape s) { v.push_back({std::move(name), std::move(s), ParamInit::Normal}); };
  auto norm = [&](std::string name, int64_t n) { v.push_back({std::move(name), {n}, ParamInit::Ones}); };
  linear("fc.weight", {H, nf * H});
  norm("hidden_norm.weight", H);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    norm(lp(l, "input_layernorm.weight"), H);
    linear(lp(l, "self_attn.q_proj.weight"), {nh * d, H});
    linear(lp(l, "self_attn.k_proj.weight"), {nkv * d, H});
    linear(lp(l, "self_attn.v_proj.weight"), {nkv * d, H});
    linear(lp(l, "self_attn.o_proj.weight"), {H, nh * d});
    norm(lp(l, "self_attn.q_norm.weight"), d);
    norm(lp(l, "self_attn.k_norm.weight"), d);
    norm(lp(l, "post_attention_layernorm.weight"), H);
    linear(lp(l, "mlp.gate_proj.weight"), {I, H});
    linear(lp(l, "mlp.up_proj.weight"), {I, H});
    linear(lp(l, "mlp.down_proj.weight"), {H, I});
  }
  norm("norm.weight", H);
  if (c.dflash2()) {
    // DFlash2's parameters come after DFlash's, so that both start from the same backbone for one seed. Each
    // convolution starts as the identity (base tap 0 = 1, other taps and the projection 0), the selector's
    // transition as nothing (successor codebook 0): SpecForge's dflash2.py initialisation; the predecessor codebook
    // and the hidden projection ~ N(0, init_std).
    const int64_t Tn = c.conv_kernel_size, r = c.selector_rank, V = c.vocab_size;
    for (int64_t l = 0; l < c.num_layers; ++l)
      for (const char* conv : {"attention_conv", "mlp_conv"}) {
        v.push_back({lp(l, cat(conv, ".base_kernel").c_str()), {2, Tn, H}, ParamInit::ConvIdentity});
        v.push_back({lp(l, cat(conv, ".kernel_projection.weight").c_str()), {c.conv_coefficients(), H},
                     ParamInit::Zeros});
      }
    linear("candidate_selector.hidden_projection.weight", {r, H});
    linear("candidate_selector.predecessor_codebook", {V, r});
    v.push_back({"candidate_selector.successor_codebook", {V, r}, ParamInit::Zeros});
  }
  return v;
}

Drafter::Drafter(Context& ctx, DrafterConfig cfg, uint64_t seed, double init_std) : cfg_(std::move(cfg)) {
  cfg_.validate();
  const int64_t d = cfg_.head_dim;
  // values depend on (seed, parameter index) only, drawn where the parameter lives (Context::fill_normal)
  uint64_t index = 0;
  for (DrafterParamSpec& p : drafter_param_specs(cfg_)) {
    const uint64_t k = index++;
    switch (p.init) {
      case ParamInit::Normal: {
        Tensor t = ctx.empty(ctx.param_dtype(), std::move(p.shape));
        ctx.fill_normal(t, init_std, seed, RngPurpose::Init, k);
        params_.adopt(ctx, p.name, std::move(t));
        break;
      }
      case ParamInit::Ones:
        params_.add(ctx, p.name, cpu_tensor(std::vector<float>(static_cast<size_t>(p.shape[0]), 1.0f),
                                            p.shape));
        break;
      case ParamInit::Zeros:
        params_.adopt(ctx, p.name, ctx.zeros(ctx.param_dtype(), std::move(p.shape)));
        break;
      case ParamInit::ConvIdentity: {  // [2, T, H]: tap 0 of both sides 1, the others 0
        const int64_t Tn = p.shape[1], H = p.shape[2];
        std::vector<float> b(static_cast<size_t>(2 * Tn * H), 0.0f);
        for (int64_t sd = 0; sd < 2; ++sd) std::fill_n(b.begin() + sd * Tn * H, H, 1.0f);
        params_.add(ctx, p.name, cpu_tensor(b, p.shape));
        break;
      }
    }
  }
  inv_freq_ = ctx.to_device(rope_inv_freq(d, cfg_.rope_theta, cfg_.rope_scaling));
}

// ---- one layer -----------------------------------------------------------------------------------------------

void Drafter::layer_forward(Context& ctx, int64_t l, const DraftInputs& in, const Tensor& Ht, const Tensor& h_in,
                            LayerActs& a, const Tensor& h_out) const {
  const LayerParams P = layer(l);
  const int64_t NB = h_in.rows(), S = in.S, H = cfg_.hidden_size, d = cfg_.head_dim, I = cfg_.intermediate_size;
  const int64_t nh = cfg_.num_heads, nkv = cfg_.num_kv_heads;
  const DType dt = ctx.compute_dtype(), st = ctx.param_dtype();
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  const bool conv = cfg_.dflash2();
  a.h_in = h_in;
  a.xn = ctx.empty(dt, {NB, H});
  a.rstd_in = ctx.empty(st, {NB});
  ctx.rmsnorm(h_in, P.in_norm->compute, eps, a.xn, a.rstd_in);
  // DFlash2: the attention reads conv_pre(xn); both sides' coefficients come from xn
  Tensor x = a.xn;
  if (conv) {
    a.delta_attn = ctx.empty(dt, {NB, cfg_.conv_coefficients()});
    ctx.linear(a.xn, P.attn_proj->compute, nullptr, a.delta_attn);
    a.x_attn = ctx.empty(dt, {NB, H});
    ctx.dynamic_conv(conv_args(*P.attn_base, a.xn, a.delta_attn, 0), a.x_attn, nullptr);
    x = a.x_attn;
  }
  // queries from the block tokens
  a.q_pre = ctx.empty(dt, {NB, nh * d});
  ctx.linear(x, P.wq->compute, nullptr, a.q_pre);
  a.q = ctx.empty(dt, {NB, nh, d});
  a.rstd_q = ctx.empty(st, {NB * nh});
  const RopeArgs rope_q{in.block_pos, inv_freq_, nh};  // the RoPE, applied by the per-head norms
  ctx.rmsnorm(a.q_pre.reshape({NB * nh, d}), P.q_norm->compute, eps, a.q.reshape({NB * nh, d}), a.rstd_q, &rope_q);
  // keys/values of the context (Ht; same Wk/Wv as the block) unless already given (the inference cache)
  if (!a.kc.defined()) {
    a.kc_pre = ctx.empty(dt, {S, nkv * d});
    ctx.linear(Ht, P.wk->compute, nullptr, a.kc_pre);
    a.kc = ctx.empty(dt, {S, nkv, d});
    a.rstd_kc = ctx.empty(st, {S * nkv});
    const RopeArgs rope_kc{in.ctx_pos, inv_freq_, nkv};
    ctx.rmsnorm(a.kc_pre.reshape({S * nkv, d}), P.k_norm->compute, eps, a.kc.reshape({S * nkv, d}), a.rstd_kc,
                &rope_kc);
    a.vc = ctx.empty(dt, {S, nkv, d});
    ctx.linear(Ht, P.wv->compute, nullptr, a.vc.reshape({S, nkv * d}));
  }
  // keys/values of the block tokens
  a.kb_pre = ctx.empty(dt, {NB, nkv * d});
  ctx.linear(x, P.wk->compute, nullptr, a.kb_pre);
  a.kb = ctx.empty(dt, {NB, nkv, d});
  a.rstd_kb = ctx.empty(st, {NB * nkv});
  const RopeArgs rope_kb{in.block_pos, inv_freq_, nkv};
  ctx.rmsnorm(a.kb_pre.reshape({NB * nkv, d}), P.k_norm->compute, eps, a.kb.reshape({NB * nkv, d}), a.rstd_kb,
              &rope_kb);
  a.vb = ctx.empty(dt, {NB, nkv, d});
  ctx.linear(x, P.wv->compute, nullptr, a.vb.reshape({NB, nkv * d}));
  // DFlash attention
  DFlashAttnArgs at{a.q, a.kc, a.vc, a.kb, a.vb, in.anchors, in.valid, static_cast<int>(cfg_.block_size),
                    cfg_.softmax_scale(), cfg_.window_of(l)};
  a.o = ctx.empty(dt, {NB, nh, d});
  a.lse = ctx.empty(st, {NB, nh});
  ctx.dflash_attention(at, a.o, a.lse);
  a.h_mid = ctx.empty(dt, {NB, H});
  if (conv) {  // h_mid = h_in + conv_post(o Wo^T)
    a.attn_out = ctx.empty(dt, {NB, H});
    ctx.linear(a.o.reshape({NB, nh * d}), P.wo->compute, nullptr, a.attn_out);
    ctx.dynamic_conv(conv_args(*P.attn_base, a.attn_out, a.delta_attn, 1), a.h_mid, &h_in);
  } else {
    ctx.linear(a.o.reshape({NB, nh * d}), P.wo->compute, nullptr, a.h_mid, 1.0f, &h_in);  // h_in + o Wo^T
  }
  // MLP
  a.xn2 = ctx.empty(dt, {NB, H});
  a.rstd_post = ctx.empty(st, {NB});
  ctx.rmsnorm(a.h_mid, P.post_norm->compute, eps, a.xn2, a.rstd_post);
  Tensor x2 = a.xn2;
  if (conv) {
    a.delta_mlp = ctx.empty(dt, {NB, cfg_.conv_coefficients()});
    ctx.linear(a.xn2, P.mlp_proj->compute, nullptr, a.delta_mlp);
    a.x_mlp = ctx.empty(dt, {NB, H});
    ctx.dynamic_conv(conv_args(*P.mlp_base, a.xn2, a.delta_mlp, 0), a.x_mlp, nullptr);
    x2 = a.x_mlp;
  }
  a.gate = ctx.empty(dt, {NB, I});
  a.up = ctx.empty(dt, {NB, I});
  a.act = ctx.empty(dt, {NB, I});
  ctx.linear(x2, P.gate->compute, nullptr, a.gate);
  ctx.linear(x2, P.up->compute, nullptr, a.up);
  ctx.silu_mul(a.gate, a.up, a.act);
  if (conv) {  // h_out = h_mid + conv_post(down(act))
    a.mlp_out = ctx.empty(dt, {NB, H});
    ctx.linear(a.act, P.down->compute, nullptr, a.mlp_out);
    ctx.dynamic_conv(conv_args(*P.mlp_base, a.mlp_out, a.delta_mlp, 1), h_out, &a.h_mid);
  } else {
    ctx.linear(a.act, P.down->compute, nullptr, h_out, 1.0f, &a.h_mid);  // h_mid + down(act)
  }
}

void Drafter::layer_backward(Context& ctx, int64_t l, const DraftInputs& in, const Tensor& Ht, const LayerActs& a,
                             const Tensor& dh, const Tensor& dHt) {
  const LayerParams P = layer(l);
  const int64_t NB = dh.rows(), S = in.S, H = cfg_.hidden_size, d = cfg_.head_dim;
  const int64_t nh = cfg_.num_heads, nkv = cfg_.num_kv_heads;
  const DType dt = ctx.compute_dtype();
  const bool conv = cfg_.dflash2();
  // DFlash2: the gradient of a conv_post output, dy (= dh: the residual passes it on unchanged), into the
  // sublayer's output; the coefficients' gradient goes to d_delta, the base kernel's to its grad
  auto conv_post_backward = [&](const Param& base, const Tensor& u, const Tensor& delta, const Tensor& d_delta) {
    Tensor du = ctx.empty(dt, {NB, H});
    ctx.dynamic_conv_backward(conv_args(base, u, delta, 1), dh, du, d_delta, base.grad);
    return du;
  };
  // DFlash2: d/dx of x' = conv_pre(x) (dx' given) plus the coefficients' path delta = x Wp^T, into d_x (written)
  auto conv_pre_backward = [&](const Param& base, const Param& proj, const Tensor& x, const Tensor& delta,
                               const Tensor& d_delta, const Tensor& dxc, const Tensor& d_x) {
    ctx.dynamic_conv_backward(conv_args(base, x, delta, 0), dxc, d_x, d_delta, base.grad);
    ctx.linear_dx(d_delta, proj.compute, d_x, 1.0f);
    ctx.linear_dw(d_delta, x, proj.grad, nullptr);
  };
  // MLP: h_out = h_mid + down(silu(gate) * up),  gate/up = x2 W^T,  x2 = RMSNorm_post(h_mid) (DFlash2: conv_pre of
  // it, and conv_post around down). The [NB, I] gradients take the memory of the activations they replace (each is
  // read for the last time just before; silu_mul_backward allows its outputs to alias its inputs): three [NB, I]
  // buffers less at the peak of the backward (0.56 GiB at NB 8192, I 12288). `a` is not read again after this
  // layer's backward.
  Tensor d_delta_mlp = conv ? ctx.empty(dt, {NB, cfg_.conv_coefficients()}) : Tensor{};
  const Tensor d_down = conv ? conv_post_backward(*P.mlp_base, a.mlp_out, a.delta_mlp, d_delta_mlp) : dh;
  ctx.linear_dw(d_down, a.act, P.down->grad, nullptr);
  const Tensor d_act = a.act;
  ctx.linear_dx(d_down, P.down->compute, d_act);
  const Tensor d_gate = a.gate, d_up = a.up;
  ctx.silu_mul_backward(d_act, a.gate, a.up, d_gate, d_up);
  const Tensor& x2 = conv ? a.x_mlp : a.xn2;
  Tensor d_x2 = ctx.empty(dt, {NB, H});
  ctx.linear_dx(d_gate, P.gate->compute, d_x2);
  ctx.linear_dx(d_up, P.up->compute, d_x2, 1.0f);
  ctx.linear_dw(d_gate, x2, P.gate->grad, nullptr);
  ctx.linear_dw(d_up, x2, P.up->grad, nullptr);
  Tensor d_xn2 = d_x2;
  if (conv) {
    d_xn2 = ctx.empty(dt, {NB, H});
    conv_pre_backward(*P.mlp_base, *P.mlp_proj, a.xn2, a.delta_mlp, d_delta_mlp, d_x2, d_xn2);
  }
  ctx.rmsnorm_backward(d_xn2, a.h_mid, P.post_norm->compute, a.rstd_post, dh, P.post_norm->grad, 1.0f);  // dh: d/dh_mid
  // attention: h_mid = h_in + o Wo^T (DFlash2: conv_post around it)
  Tensor d_delta_attn = conv ? ctx.empty(dt, {NB, cfg_.conv_coefficients()}) : Tensor{};
  const Tensor d_attn = conv ? conv_post_backward(*P.attn_base, a.attn_out, a.delta_attn, d_delta_attn) : dh;
  Tensor d_o = ctx.empty(dt, {NB, nh, d});
  ctx.linear_dx(d_attn, P.wo->compute, d_o.reshape({NB, nh * d}));
  ctx.linear_dw(d_attn, a.o.reshape({NB, nh * d}), P.wo->grad, nullptr);
  Tensor dq = ctx.empty(dt, {NB, nh, d});
  Tensor dkc = ctx.empty(dt, {S, nkv, d}), dvc = ctx.empty(dt, {S, nkv, d});
  Tensor dkb = ctx.empty(dt, {NB, nkv, d}), dvb = ctx.empty(dt, {NB, nkv, d});
  DFlashAttnArgs at{a.q, a.kc, a.vc, a.kb, a.vb, in.anchors, in.valid, static_cast<int>(cfg_.block_size),
                    cfg_.softmax_scale(), cfg_.window_of(l)};
  ctx.dflash_attention_backward(at, a.o, a.lse, d_o, dq, dkc, dvc, dkb, dvb);
  // the per-head RMSNorms with their RoPE (dq, dkc, dkb rotated back by -angle inside)
  const RopeArgs rope_q{in.block_pos, inv_freq_, nh}, rope_kc{in.ctx_pos, inv_freq_, nkv},
      rope_kb{in.block_pos, inv_freq_, nkv};
  Tensor dq_pre = ctx.empty(dt, {NB, nh * d});
  ctx.rmsnorm_backward(dq.reshape({NB * nh, d}), a.q_pre.reshape({NB * nh, d}), P.q_norm->compute, a.rstd_q,
                       dq_pre.reshape({NB * nh, d}), P.q_norm->grad, 0.0f, &rope_q);
  Tensor dkc_pre = ctx.empty(dt, {S, nkv * d});
  ctx.rmsnorm_backward(dkc.reshape({S * nkv, d}), a.kc_pre.reshape({S * nkv, d}), P.k_norm->compute, a.rstd_kc,
                       dkc_pre.reshape({S * nkv, d}), P.k_norm->grad, 0.0f, &rope_kc);
  Tensor dkb_pre = ctx.empty(dt, {NB, nkv * d});
  ctx.rmsnorm_backward(dkb.reshape({NB * nkv, d}), a.kb_pre.reshape({NB * nkv, d}), P.k_norm->compute, a.rstd_kb,
                       dkb_pre.reshape({NB * nkv, d}), P.k_norm->grad, 0.0f, &rope_kb);
  // projections: block side into the attention's input x (DFlash2: conv_pre(xn)), context side into Ht
  const Tensor& x = conv ? a.x_attn : a.xn;
  Tensor d_x = ctx.empty(dt, {NB, H});
  Tensor dvb2 = dvb.reshape({NB, nkv * d}), dvc2 = dvc.reshape({S, nkv * d});
  ctx.linear_dx(dq_pre, P.wq->compute, d_x);
  ctx.linear_dx(dkb_pre, P.wk->compute, d_x, 1.0f);
  ctx.linear_dx(dvb2, P.wv->compute, d_x, 1.0f);
  ctx.linear_dw(dq_pre, x, P.wq->grad, nullptr);
  ctx.linear_dw(dkb_pre, x, P.wk->grad, nullptr);
  ctx.linear_dw(dvb2, x, P.wv->grad, nullptr);
  ctx.linear_dx(dkc_pre, P.wk->compute, dHt, 1.0f);
  ctx.linear_dx(dvc2, P.wv->compute, dHt, 1.0f);
  ctx.linear_dw(dkc_pre, Ht, P.wk->grad, nullptr);
  ctx.linear_dw(dvc2, Ht, P.wv->grad, nullptr);
  Tensor d_xn = d_x;
  if (conv) {
    d_xn = ctx.empty(dt, {NB, H});
    conv_pre_backward(*P.attn_base, *P.attn_proj, a.xn, a.delta_attn, d_delta_attn, d_x, d_xn);
  }
  // input norm: xn = RMSNorm_in(h_in); dh becomes d/dh_in
  ctx.rmsnorm_backward(d_xn, a.h_in, P.in_norm->compute, a.rstd_in, dh, P.in_norm->grad, 1.0f);
}

// ---- whole sequence --------------------------------------------------------------------------------------------

DraftStepStats Drafter::forward_backward(Context& ctx, const DraftInputs& in, const Tensor& embed,
                                         const Tensor& lm_head, float kl_weight, float grad_scale, bool backward,
                                         bool recompute, float selector_alpha) {
  const int64_t S = in.S, NB = in.block_ids.numel(), H = cfg_.hidden_size, L = cfg_.num_layers;
  const DType dt = ctx.compute_dtype(), st = ctx.param_dtype();
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  DFLASH_CHECK(in.features.rows() == S && in.features.dim(-1) == cfg_.nf() * H, "drafter: features ",
               shape_str(in.features.shape), ", expected [", S, ", ", cfg_.nf() * H, "]");
  DFLASH_CHECK(NB == in.N * cfg_.block_size, "drafter: ", NB, " block tokens for N = ", in.N, ", B = ", cfg_.block_size);
  Param& fc = params_.get("fc.weight");
  Param& hnorm = params_.get("hidden_norm.weight");
  Param& fnorm = params_.get("norm.weight");
  // fused context feature Ht = RMSNorm_hidden(F fc^T), shared by every layer
  Tensor Ht_pre = ctx.empty(dt, {S, H}), Ht = ctx.empty(dt, {S, H}), rstd_h = ctx.empty(st, {S});
  ctx.linear(in.features, fc.compute, nullptr, Ht_pre);
  ctx.rmsnorm(Ht_pre, hnorm.compute, eps, Ht, rstd_h);
  // block tokens through the layers; hs[l] is the input of layer l
  std::vector<Tensor> hs(static_cast<size_t>(L + 1));
  hs[0] = ctx.empty(dt, {NB, H});
  embed_blocks(ctx, embed, in.block_ids, hs[0], cfg_.embed_scale);
  std::vector<LayerActs> acts(static_cast<size_t>(L));
  for (int64_t l = 0; l < L; ++l) {
    hs[l + 1] = ctx.empty(dt, {NB, H});
    layer_forward(ctx, l, in, Ht, hs[l], acts[l], hs[l + 1]);
    if (recompute) acts[l] = LayerActs{};  // keep only the layer input
  }
  Tensor hf = ctx.empty(dt, {NB, H}), rstd_f = ctx.empty(st, {NB});
  ctx.rmsnorm(hs[L], fnorm.compute, eps, hf, rstd_f);
  LossArgs la;
  la.h = hf;
  la.lm_head = lm_head;
  la.rows = in.rows;
  la.labels = in.labels;
  la.weights = in.weights;
  la.teacher_h = kl_weight > 0 ? in.teacher_h : Tensor{};
  la.kl_weight = kl_weight;
  la.grad_scale = grad_scale;
  const int64_t Rs = in.rows.numel(), K = cfg_.selector_top_k;
  if (cfg_.dflash2()) {  // the selector's candidates: the top-k logits of each row, from the loss head's pass
    la.topk = K;
    la.topk_ids = ctx.empty(DType::I32, {Rs, K});
    la.topk_logits = ctx.empty(st, {Rs, K});
  }
  Tensor dhf;
  if (backward) {
    dhf = ctx.zeros(dt, {NB, H});
    la.dh = dhf;
  }
  LossHeadOut lh = loss_head(ctx, la, in.dpace_alpha, cfg_.block_size);
  DraftStepStats out;
  out.ce_sum = lh.ce_sum;
  out.kl_sum = lh.kl_sum;
  out.loss_sum = out.ce_sum + (kl_weight > 0 ? kl_weight * out.kl_sum : 0.0);
  out.ce = std::move(lh.stats.ce);
  out.kl = std::move(lh.stats.kl);
  out.correct = std::move(lh.stats.correct);
  out.w = std::move(lh.w);
  Tensor g;
  if (cfg_.dflash2() && Rs > 0) {
    // The selector (spec 1.2): pair scores of the candidates after the label's predecessor, its cross-entropy where
    // the label is a candidate, weighted like the row's loss (SpecForge: selector_alpha w sel, one normaliser)
    Param& wsel = params_.get("candidate_selector.hidden_projection.weight");
    Param& pcb = params_.get("candidate_selector.predecessor_codebook");
    Param& scb = params_.get("candidate_selector.successor_codebook");
    g = ctx.empty(dt, {NB, cfg_.selector_rank});
    ctx.linear(hf, wsel.compute, nullptr, g);
    std::vector<float> sw(static_cast<size_t>(Rs));
    for (int64_t r = 0; r < Rs; ++r) sw[r] = static_cast<float>(selector_alpha * out.w[r] * grad_scale);
    SelectorArgs sa;
    sa.g = g;
    sa.rows = in.rows;
    sa.prev = in.prev;
    sa.cand = la.topk_ids;
    sa.cand_logit = la.topk_logits;
    sa.pred_cb = pcb.compute;
    sa.succ_cb = scb.compute;
    sa.labels = in.labels;
    Tensor dg;
    if (backward) {
      dg = ctx.zeros(dt, {NB, cfg_.selector_rank});
      sa.weights = ctx.to_device(cpu_tensor(sw, {Rs}));
      sa.lm_head = lm_head;
      sa.dg = dg;
      sa.dh = dhf;
      sa.d_pred_cb = pcb.grad;
      sa.d_succ_cb = scb.grad;
    }
    Tensor scores = ctx.empty(st, {Rs, K});
    SelectorStats ss = ctx.candidate_selector(sa, scores);
    for (int64_t r = 0; r < Rs; ++r) out.sel_sum += out.w[r] * ss.loss[r];
    out.loss_sum += selector_alpha * out.sel_sum;
    out.correct = std::move(ss.correct);
    out.covered = std::move(ss.covered);
    if (backward) {  // g = hf Wsel^T
      ctx.linear_dx(dg, wsel.compute, dhf, 1.0f);
      ctx.linear_dw(dg, hf, wsel.grad, nullptr);
    }
  }
  if (!backward) return out;

  Tensor dh = ctx.empty(dt, {NB, H});
  ctx.rmsnorm_backward(dhf, hs[L], fnorm.compute, rstd_f, dh, fnorm.grad);
  dhf = Tensor{};
  Tensor dHt = ctx.zeros(dt, {S, H});
  for (int64_t l = L - 1; l >= 0; --l) {
    if (recompute) {
      Tensor scratch = ctx.empty(dt, {NB, H});
      layer_forward(ctx, l, in, Ht, hs[l], acts[l], scratch);
    }
    layer_backward(ctx, l, in, Ht, acts[l], dh, dHt);
    acts[l] = LayerActs{};
    hs[l + 1] = Tensor{};
  }
  Tensor dHt_pre = ctx.empty(dt, {S, H});
  ctx.rmsnorm_backward(dHt, Ht_pre, hnorm.compute, rstd_h, dHt_pre, hnorm.grad);
  ctx.linear_dw(dHt_pre, in.features, fc.grad, nullptr);
  return out;
}

Tensor Drafter::forward_hidden(Context& ctx, const DraftInputs& in, const Tensor& embed) {
  const int64_t S = in.S, NB = in.block_ids.numel(), H = cfg_.hidden_size, L = cfg_.num_layers;
  const DType dt = ctx.compute_dtype(), st = ctx.param_dtype();
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  Tensor Ht = ctx.empty(dt, {S, H}), none;
  ctx.linear(in.features, params_.get("fc.weight").compute, nullptr, Ht);
  ctx.rmsnorm(Ht, params_.get("hidden_norm.weight").compute, eps, Ht, none);
  Tensor h = ctx.empty(dt, {NB, H}), h2 = ctx.empty(dt, {NB, H});
  embed_blocks(ctx, embed, in.block_ids, h, cfg_.embed_scale);
  for (int64_t l = 0; l < L; ++l) {
    LayerActs a;
    layer_forward(ctx, l, in, Ht, h, a, h2);
    std::swap(h, h2);
  }
  Tensor hf = ctx.empty(dt, {NB, H});
  ctx.rmsnorm(h, params_.get("norm.weight").compute, eps, hf, none);
  (void)st;
  return hf;
}

// ---- inference with a draft KV cache (spec 4) ----------------------------------------------------------------

Drafter::Cache Drafter::make_cache(Context& ctx, int64_t capacity) const {
  Cache c;
  c.capacity = capacity;
  for (int64_t l = 0; l < cfg_.num_layers; ++l) {
    c.k.push_back(ctx.empty(ctx.compute_dtype(), {capacity, cfg_.num_kv_heads, cfg_.head_dim}));
    c.v.push_back(ctx.empty(ctx.compute_dtype(), {capacity, cfg_.num_kv_heads, cfg_.head_dim}));
  }
  return c;
}

void Drafter::extend_cache(Context& ctx, Cache& c, const Tensor& features) const {
  const int64_t T = features.rows(), H = cfg_.hidden_size, d = cfg_.head_dim, nkv = cfg_.num_kv_heads;
  if (T == 0) return;
  DFLASH_CHECK(c.len + T <= c.capacity, "draft cache of ", c.capacity, " positions cannot take ", T, " more after ",
               c.len);
  const DType dt = ctx.compute_dtype();
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  Tensor Ht = ctx.empty(dt, {T, H}), none;
  ctx.linear(features, params_.get("fc.weight").compute, nullptr, Ht);
  ctx.rmsnorm(Ht, params_.get("hidden_norm.weight").compute, eps, Ht, none);
  std::vector<int32_t> ph(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) ph[t] = static_cast<int32_t>(c.len + t);
  const RopeArgs rope_k{ctx.to_device(cpu_tensor_i32(ph, {T})), inv_freq_, nkv};
  for (int64_t l = 0; l < cfg_.num_layers; ++l) {
    const LayerParams P = layer(l);
    Tensor k = c.k[l].slice(c.len, c.len + T), v = c.v[l].slice(c.len, c.len + T);
    ctx.linear(Ht, P.wk->compute, nullptr, k.reshape({T, nkv * d}));
    ctx.rmsnorm(k.reshape({T * nkv, d}), P.k_norm->compute, eps, k.reshape({T * nkv, d}), none, &rope_k);
    ctx.linear(Ht, P.wv->compute, nullptr, v.reshape({T, nkv * d}));
  }
  c.len += T;
}

Tensor Drafter::draft_block(Context& ctx, const Cache& c, int32_t bonus_token, const Tensor& embed) const {
  const int64_t B = cfg_.block_size, H = cfg_.hidden_size, p = c.len;
  const DType dt = ctx.compute_dtype();
  DraftInputs in;
  in.S = p;
  in.N = 1;
  std::vector<int32_t> ids(static_cast<size_t>(B), cfg_.mask_token_id), pos(static_cast<size_t>(B));
  ids[0] = bonus_token;
  for (int64_t i = 0; i < B; ++i) pos[i] = static_cast<int32_t>(p + i);
  in.block_ids = ctx.to_device(cpu_tensor_i32(ids, {B}));
  in.block_pos = ctx.to_device(cpu_tensor_i32(pos, {B}));
  in.anchors = ctx.to_device(cpu_tensor_i32({static_cast<int32_t>(p)}, {1}));
  Tensor valid = cpu_empty(DType::U8, {1});
  valid.ptr<uint8_t>()[0] = 1;
  in.valid = ctx.to_device(valid);
  Tensor h = ctx.empty(dt, {B, H}), h2 = ctx.empty(dt, {B, H}), none;
  embed_blocks(ctx, embed, in.block_ids, h, cfg_.embed_scale);
  for (int64_t l = 0; l < cfg_.num_layers; ++l) {
    LayerActs a;
    a.kc = c.k[l].slice(0, p);
    a.vc = c.v[l].slice(0, p);
    layer_forward(ctx, l, in, Tensor{}, h, a, h2);
    std::swap(h, h2);
  }
  Tensor hf = ctx.empty(dt, {B, H});
  ctx.rmsnorm(h, params_.get("norm.weight").compute, static_cast<float>(cfg_.rms_norm_eps), hf, none);
  return hf;
}

std::vector<int32_t> Drafter::select_path(Context& ctx, const Tensor& hidden, int32_t anchor_token,
                                          const Tensor& lm_head) const {
  DFLASH_CHECK(cfg_.dflash2(), "select_path: a ", draft_arch_name(cfg_.arch), " drafter has no candidate selector");
  const int64_t n = hidden.rows(), K = cfg_.selector_top_k;
  if (n == 0) return {};
  // The lattice of the greedy walk in one selector call: row 0 is slot 0 after the anchor's token, row
  // 1 + (t-1) K + i slot t > 0 after slot t-1's candidate i (M = 1 + (n-1) K scored rows). Everything the device needs
  // goes up in one upload (the slots' rows 0..n-1, zero labels, each lattice row's slot, the anchor) and the lattice
  // is built there from the top-k (no round trip between the top-k and the scores); the walk runs on the host.
  const int64_t M = 1 + (n - 1) * K;
  std::vector<int32_t> ints(static_cast<size_t>(2 * n + M + 1), 0);
  for (int64_t t = 0; t < n; ++t) ints[t] = static_cast<int32_t>(t);  // rows; ints[n .. 2n) labels 0
  for (int64_t m = 1; m < M; ++m) ints[2 * n + m] = static_cast<int32_t>(1 + (m - 1) / K);  // slot of lattice row m
  ints[2 * n + M] = anchor_token;
  const Tensor up = ctx.to_device(cpu_tensor_i32(ints, {static_cast<int64_t>(ints.size())}));
  const Tensor mrow = up.slice(2 * n, 2 * n + M);
  // the top-k of each slot's logits, from the loss head's chunked pass (its loss is not used here)
  LossArgs la;
  la.h = hidden;
  la.lm_head = lm_head;
  la.rows = up.slice(0, n);
  la.labels = up.slice(n, 2 * n);
  la.weights = ctx.zeros(DType::F32, {n});
  la.topk = K;
  la.topk_ids = ctx.empty(DType::I32, {n, la.topk});
  la.topk_logits = ctx.empty(ctx.param_dtype(), {n, la.topk});
  ctx.lm_head_loss(la);
  SelectorArgs sa;
  sa.rows = mrow;
  sa.prev = ctx.empty(DType::I32, {M});  // the anchor, then slot t-1's candidates in order
  ctx.copy(sa.prev.slice(0, 1), up.slice(2 * n + M, 2 * n + M + 1));
  if (M > 1) ctx.copy(sa.prev.slice(1, M), la.topk_ids.slice(0, n - 1).reshape({(n - 1) * K}));
  sa.cand = ctx.empty(DType::I32, {M, K});
  ctx.gather_rows(sa.cand, la.topk_ids, mrow);
  sa.cand_logit = ctx.empty(ctx.param_dtype(), {M, K});
  ctx.gather_rows(sa.cand_logit, la.topk_logits, mrow);
  const DType dt = ctx.compute_dtype();
  Tensor g = ctx.empty(dt, {n, cfg_.selector_rank});
  ctx.linear(hidden, params_.get("candidate_selector.hidden_projection.weight").compute, nullptr, g);
  sa.g = g;
  sa.pred_cb = params_.get("candidate_selector.predecessor_codebook").compute;
  sa.succ_cb = params_.get("candidate_selector.successor_codebook").compute;
  Tensor scores = ctx.empty(ctx.param_dtype(), {M, K});
  ctx.candidate_selector(sa, scores);
  const std::vector<float> e = to_f32_vector(ctx.to_host(scores));
  const Tensor cand = ctx.to_host(la.topk_ids, false);
  const int32_t* C = cand.ptr<int32_t>();
  std::vector<int32_t> out(static_cast<size_t>(n));
  int64_t m = 0;
  for (int64_t t = 0; t < n; ++t) {
    const float* em = e.data() + m * K;
    int64_t j = 0;
    for (int64_t i = 1; i < K; ++i)
      if (em[i] > em[j]) j = i;
    out[t] = C[t * K + j];
    m = 1 + t * K + j;  // slot t+1's row after this choice
  }
  return out;
}

}  // namespace dflash
