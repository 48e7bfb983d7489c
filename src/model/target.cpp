// model/target.cpp — loading a target (checkpoint or random) into its layers and the one layer loop (model/target.h).
#include "model/target.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "io/model_family.h"
#include "io/safetensors.h"
#include "model/target/weights.h"

namespace dflash {

namespace {

// Layer l's weights from src, in the order in_norm, post_norm, token mixer, channel mixer (a random target draws its
// values in this call order, so the order is part of its identity: weights.h; keep it fixed).
TargetLayer load_layer(WeightSource& src, const ModelConfig& cfg, const WeightNames& n, int64_t l) {
  const std::string p = cat(n.layer, l, ".");
  const int64_t H = cfg.hidden_size;
  TargetLayer L;
  L.spec = cfg.layer(l);
  L.in_norm = src.norm(p + n.in_norm, {H});
  L.post_norm = src.norm(p + n.post_norm, {H});
  L.mixer = token_mixer(L.spec.mixer).load(src, p, n, cfg, L.spec);
  if (L.spec.mlp == ChannelMixer::Dense) {
    L.mlp = load_dense_mlp(src, p, n, H, L.spec.mlp_width);
  } else {
    L.moe = load_moe(src, p, n, H, cfg.moe);
    if (cfg.moe.shared_expert_width > 0)
      L.shared = load_shared_expert(src, p, n, H, cfg.moe.shared_expert_width, cfg.moe.shared_expert_gate);
    if (cfg.moe.dense_beside_width > 0) {  // Gemma 4: the dense MLP beside the experts, and the block's norms
      L.mlp = load_dense_mlp(src, p, n, H, cfg.moe.dense_beside_width);
      L.moe_in_norm = src.norm(p + n.moe_in_norm, {H});
      L.dense_out_norm = src.norm(p + n.dense_out_norm, {H});
      L.moe_out_norm = src.norm(p + n.moe_out_norm, {H});
      Tensor ones = cpu_empty(DType::F32, {H});
      for (int64_t i = 0; i < H; ++i) ones.ptr<float>()[i] = 1.0f;
      L.ones = src.ctx().to_device(ones, src.ctx().compute_dtype());
    }
  }
  if (L.spec.sandwich_norms) {
    L.mixer_out_norm = src.norm(p + n.mixer_out_norm, {H});
    L.mlp_out_norm = src.norm(p + n.mlp_out_norm, {H});
  }
  if (L.spec.layer_scalar && !src.random()) {  // a random target's scalar is 1
    L.layer_scalar = static_cast<double>(src.host_f32(p + n.layer_scalar, {1}).ptr<float>()[0]);
  }
  return L;
}

std::vector<TargetLayer> load_layers(WeightSource& src, const ModelConfig& cfg, int64_t first = 0, int64_t end = -1) {
  const WeightNames& n = family_of(cfg.arch).names;
  std::vector<TargetLayer> layers;
  if (end < 0) end = cfg.num_hidden_layers;
  for (int64_t l = first; l < end; ++l) layers.push_back(load_layer(src, cfg, n, l));
  return layers;
}

// The RoPE frequencies of the config's layers, and of the layers with AttentionSpec::rope_alt when it has them.
void set_rope(Context& ctx, const ModelConfig& cfg, TargetWeights& w) {
  w.inv_freq = ctx.to_device(rope_inv_freq(cfg.rope_dim(), cfg.rope_theta, cfg.rope_scaling));
  if (cfg.rope_alt.defined())
    w.inv_freq_alt =
        ctx.to_device(rope_inv_freq_proportional(cfg.rope_alt.dim, cfg.rope_alt.rotated, cfg.rope_alt.theta));
}

void check_stage(const ModelConfig& cfg, TargetStage st) {
  DFLASH_CHECK(st.first >= 0 && st.first < st.end && st.end <= cfg.num_hidden_layers, "target stage of layers [",
               st.first, ", ", st.end, ") outside [0, ", cfg.num_hidden_layers, ")");
}

// The embedding and lm_head (tied or not) from an opened checkpoint.
TargetHead read_head(const WeightStore& ws, const ModelConfig& cfg, Context& ctx, const std::string& dir) {
  const WeightNames& n = family_of(cfg.arch).names;
  const Shape shape = {cfg.vocab_size, cfg.hidden_size};
  TargetHead h;
  h.embed = ctx.to_device(ws.f32(n.embed, shape), ctx.compute_dtype());
  if (cfg.tie_word_embeddings || !ws.has(n.lm_head)) {
    DFLASH_CHECK(cfg.tie_word_embeddings, dir, ": ", n.lm_head, " is missing and tie_word_embeddings is false");
    h.lm_head = h.embed;
  } else {
    h.lm_head = ctx.to_device(ws.f32(n.lm_head, shape), ctx.compute_dtype());
  }
  return h;
}

}  // namespace

std::shared_ptr<const Target> Target::load(const std::string& dir, Context& ctx) {
  ModelConfig cfg = load_model_config(dir);
  CheckpointWeights src(dir, ctx, cfg.linear_format == WeightFormat::FP8 ? &cfg.fp8 : nullptr, &cfg.int4);
  TargetHead head = read_head(src.store(), cfg, ctx, dir);
  TargetWeights w;
  w.embed = head.embed;
  w.lm_head = head.lm_head;
  w.final_norm = src.norm(family_of(cfg.arch).names.final_norm, {cfg.hidden_size});
  w.layers = load_layers(src, cfg);
  set_rope(ctx, cfg, w);
  return std::make_shared<const Target>(std::move(cfg), std::move(w));
}

std::shared_ptr<const Target> Target::load_stage(const std::string& dir, Context& ctx, TargetStage st) {
  ModelConfig cfg = load_model_config(dir);
  check_stage(cfg, st);
  const WeightNames& n = family_of(cfg.arch).names;
  CheckpointWeights src(dir, ctx, cfg.linear_format == WeightFormat::FP8 ? &cfg.fp8 : nullptr, &cfg.int4);
  const WeightStore& ws = src.store();
  const Shape shape = {cfg.vocab_size, cfg.hidden_size};
  TargetWeights w;
  w.first_layer = st.first;
  w.stage = true;
  if (st.first == 0) w.embed = ctx.to_device(ws.f32(n.embed, shape), ctx.compute_dtype());
  if (st.end == cfg.num_hidden_layers) {
    w.final_norm = src.norm(n.final_norm, {cfg.hidden_size});
    const bool tied = cfg.tie_word_embeddings || !ws.has(n.lm_head);
    DFLASH_CHECK(!tied || cfg.tie_word_embeddings, dir, ": ", n.lm_head, " is missing and tie_word_embeddings is false");
    w.lm_head = tied && w.embed.defined() ? w.embed
                                          : ctx.to_device(ws.f32(tied ? n.embed : n.lm_head, shape), ctx.compute_dtype());
  }
  w.layers = load_layers(src, cfg, st.first, st.end);
  set_rope(ctx, cfg, w);
  return std::make_shared<const Target>(std::move(cfg), std::move(w));
}

std::shared_ptr<const Target> Target::random_stage(const ModelConfig& cfg, Context& ctx, uint64_t seed,
                                                   TargetStage st) {
  check_stage(cfg, st);
  const std::shared_ptr<const Target> all = random(cfg, ctx, seed);
  TargetWeights w;
  w.first_layer = st.first;
  w.stage = true;
  if (st.first == 0) w.embed = all->w_.embed;
  if (st.end == cfg.num_hidden_layers) {
    w.final_norm = all->w_.final_norm;
    w.lm_head = all->w_.lm_head;
  }
  w.inv_freq = all->w_.inv_freq;
  w.inv_freq_alt = all->w_.inv_freq_alt;
  w.layers.assign(all->w_.layers.begin() + st.first, all->w_.layers.begin() + st.end);
  return std::make_shared<const Target>(cfg, std::move(w));
}

TargetHead load_target_head(const std::string& dir, Context& ctx) {
  return read_head(WeightStore::open(dir), load_model_config(dir), ctx, dir);
}

TargetHead random_target_head(const ModelConfig& cfg, Context& ctx, uint64_t seed) {
  RandomTargetWeights r(ctx, seed);
  TargetHead h;
  h.embed = r.matrix("embed", {cfg.vocab_size, cfg.hidden_size});
  h.lm_head = cfg.tie_word_embeddings ? h.embed : r.matrix("lm_head", {cfg.vocab_size, cfg.hidden_size});
  return h;
}

std::shared_ptr<const Target> Target::random(const ModelConfig& cfg, Context& ctx, uint64_t seed) {
  TargetHead head = random_target_head(cfg, ctx, seed);
  RandomTargetWeights src(ctx, seed, 2, cfg.linear_format == WeightFormat::FP8 ? &cfg.fp8 : nullptr);  // 0, 1: the head's
  TargetWeights w;
  w.embed = head.embed;
  w.lm_head = head.lm_head;
  w.final_norm = src.norm("final_norm", {cfg.hidden_size});
  w.layers = load_layers(src, cfg);
  set_rope(ctx, cfg, w);
  return std::make_shared<const Target>(cfg, std::move(w));
}

namespace {

// The parameters of layer s that are loaded through WeightSource::linear (kept FP8 when the checkpoint is): the token
// mixer's projections (q, k, v, o and the output gate rows; the Gated DeltaNet's qkv, z and out) and the dense or
// shared-expert SwiGLU's three.
int64_t fp8_projection_params(const ModelConfig& cfg, const LayerSpec& s) {
  const int64_t H = cfg.hidden_size, d = cfg.head_dim_of(s), nh = cfg.num_attention_heads, nkv = cfg.kv_heads_of(s);
  int64_t n = 0;
  if (s.mixer == TokenMixer::LinearAttention) {
    n += H * (cfg.linear_attn.conv_dim() + 2 * cfg.linear_attn.value_dim());
  } else if (s.mixer == TokenMixer::LatentAttention) {  // every projection but the two norms
    const MlaConfig& m = cfg.mla;
    n += token_mixer(s.mixer).params(cfg, s) - m.kv_lora_rank - m.q_lora_rank;
  } else {
    n += 2 * H * nh * d + (s.attention.k_eq_v ? 1 : 2) * H * nkv * d + (s.attention.output_gate ? H * nh * d : 0);
  }
  if (s.mlp == ChannelMixer::Dense) n += 3 * H * s.mlp_width;
  if (s.mlp == ChannelMixer::MoE) {
    n += 3 * H * cfg.moe.shared_expert_width;
    // routed experts stay FP8 when no block straddles two experts (load_fp8_experts), else they are bf16
    const int64_t bn = cfg.fp8.block_n > 0 ? cfg.fp8.block_n : H;
    if (s.mlp_width % bn == 0 && H % bn == 0) n += cfg.moe.num_experts * 3 * H * s.mlp_width;
  }
  return n;
}

}  // namespace

TargetParams& TargetParams::operator+=(const TargetParams& o) {
  total += o.total;
  active += o.active;
  embedding += o.embedding;
  mxfp4 += o.mxfp4;
  fp8 += o.fp8;
  fp8_scale_bytes += o.fp8_scale_bytes;
  int4 += o.int4;
  int4_scales += o.int4_scales;
  return *this;
}

TargetParams target_layer_params(const ModelConfig& cfg, int64_t l) {
  DFLASH_CHECK(l >= 0 && l < cfg.num_hidden_layers, "target layer ", l, " outside [0, ", cfg.num_hidden_layers, ")");
  TargetParams p;
  const int64_t H = cfg.hidden_size;
  const LayerSpec s = cfg.layer(l);
  // + the two norms (four with sandwich norms, and the layer scalar)
  const int64_t attn = token_mixer(s.mixer).params(cfg, s) + (s.sandwich_norms ? 4 : 2) * H + (s.layer_scalar ? 1 : 0);
  MlpParams m = mlp_params(cfg, s);
  if (s.mlp == ChannelMixer::MoE && cfg.moe.shared_expert_width > 0) {
    const int64_t se = shared_expert_params(H, cfg.moe.shared_expert_width, cfg.moe.shared_expert_gate);
    m.total += se;
    m.active += se;
  }
  p.total = attn + m.total;
  p.active = attn + m.active;
  p.mxfp4 = m.mxfp4;
  p.int4 = m.int4;
  p.int4_scales = m.int4_scales;
  if (cfg.linear_format == WeightFormat::FP8) p.fp8 = fp8_projection_params(cfg, s);
  if (p.fp8 > 0) {  // one F32 scale per block (per channel: per row of K = H, the usual K)
    const int64_t bn = cfg.fp8.block_n > 0 ? cfg.fp8.block_n : H, bk = cfg.fp8.block_k > 0 ? cfg.fp8.block_k : H;
    p.fp8_scale_bytes = 4 * ((p.fp8 + bn * bk - 1) / (bn * bk));
  }
  return p;
}

TargetParams target_params(const ModelConfig& cfg) {
  TargetParams p;
  const int64_t H = cfg.hidden_size;
  p.embedding = cfg.vocab_size * H;
  p.total = p.embedding * (cfg.tie_word_embeddings ? 1 : 2) + H;  // embedding, lm_head, final norm
  p.active = cfg.vocab_size * H + H;                             // lm_head (the embedding is a lookup), final norm
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) p += target_layer_params(cfg, l);
  return p;
}

Target::Target(ModelConfig cfg, TargetWeights w) : cfg_(std::move(cfg)), w_(std::move(w)) {
  DFLASH_CHECK(!w_.stage ? w_.first_layer == 0 && static_cast<int64_t>(w_.layers.size()) == cfg_.num_hidden_layers
                         : !w_.layers.empty() && w_.first_layer >= 0 &&
                               w_.first_layer + static_cast<int64_t>(w_.layers.size()) <= cfg_.num_hidden_layers,
               "target: ", w_.layers.size(), " layers given from layer ", w_.first_layer, ", config says ",
               cfg_.num_hidden_layers);
  for (size_t i = 0; i < w_.layers.size(); ++i) {
    TargetLayer& L = w_.layers[i];
    const int64_t l = w_.first_layer + static_cast<int64_t>(i);
    L.spec = cfg_.layer(l);  // the config's plan is the one truth (hand-built layers too)
    const std::string missing = token_mixer(L.spec.mixer).missing(L.mixer, L.spec);
    DFLASH_CHECK(missing.empty(), "target layer ", l, ": ", missing);
    const bool experts = L.moe.gate_up.w.defined() || L.moe.gate_up_fp8.defined();
    DFLASH_CHECK(L.spec.mlp == ChannelMixer::Dense ? L.mlp.w_gate.defined() : experts,
                 "target layer ", l, ": the weights of its ", L.spec.mlp == ChannelMixer::Dense ? "dense MLP" : "experts",
                 " are missing");
  }
}

Target::Output Target::forward(Context& ctx, const Tensor& ids_in, std::span<const int64_t> layer_ids,
                               bool want_final, KVCache* cache) const {
  const int64_t T = ids_in.numel(), Lt = cfg_.num_hidden_layers;
  const int64_t start = cache ? cache->len : 0;
  if (cache)
    DFLASH_CHECK(start + T <= cache->capacity, "target: KV cache of ", cache->capacity, " positions cannot take ",
                 T, " more after ", start);
  const int64_t last = check_layer_ids(cfg_, layer_ids);
  // Later layers can be skipped only when nothing needs them: not the final hidden, and not a KV cache (whose
  // every layer must hold the new positions).
  const int64_t run_layers = (want_final || cache) ? Lt : last + 1;
  std::vector<int32_t> pos_host(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) pos_host[t] = static_cast<int32_t>(start + t);
  const SeqSegment seg{0, T, start, cache};
  Output out = run(ctx, ctx.to_device(ids_in), ctx.to_device(cpu_tensor_i32(pos_host, {T})), {&seg, 1}, layer_ids,
                   run_layers, want_final);
  if (cache) cache->len = start + T;
  return out;
}

Target::Output Target::forward_at(Context& ctx, const Tensor& ids, const std::vector<int32_t>& pos,
                                  std::span<const int64_t> layer_ids, bool want_final) const {
  const int64_t T = ids.numel();
  DFLASH_CHECK(static_cast<int64_t>(pos.size()) == T, "target forward_at: ", pos.size(), " positions for ", T,
               " tokens");
  check_layer_ids(cfg_, layer_ids);
  const SeqSegment seg{0, T, 0, nullptr};
  return run(ctx, ctx.to_device(ids), ctx.to_device(cpu_tensor_i32(pos, {T})), {&seg, 1}, layer_ids,
             cfg_.num_hidden_layers, want_final);
}

Target::Output Target::run(Context& ctx, const Tensor& ids, const Tensor& pos, std::span<const SeqSegment> segs,
                           std::span<const int64_t> layer_ids, int64_t run_layers, bool want_final) const {
  DFLASH_CHECK(whole(), "target: this is stage [", stage().first, ", ", stage().end, ") of a split target; it runs "
               "forward_stage or run_stage only");
  Output out;
  StageState s = run_stage(ctx, ids, pos, segs, nullptr, layer_ids, run_layers, want_final, &out.final_hidden,
                           &out.router_topk);
  out.features = s.features;
  return out;
}

void Target::embed(Context& ctx, const Tensor& ids, const Tensor& h) const {
  ctx.embedding(w_.embed, ids, h);
  if (cfg_.embed_scale > 0) {
    // h *= s, s rounded to the compute dtype as transformers' Gemma4TextScaledWordEmbedding casts it to the weights'
    const float f = static_cast<float>(cfg_.embed_scale);
    const DType dt = ctx.compute_dtype();
    const float s = dt == DType::BF16 ? round_bf16(f) : dt == DType::F16 ? f16_to_f32(f32_to_f16(f)) : f;
    ctx.add(h, h, s - 1.0f);  // h + (s - 1) h, one rounding
  }
}

// RMSNorm with the family's weight convention (zero-centred: 1 + w)
static void family_norm(Context& ctx, const ModelConfig& cfg, const Tensor& in, const Tensor& w, const Tensor& y) {
  const float eps = static_cast<float>(cfg.rms_norm_eps);
  if (cfg.zero_centred_norms) {
    ctx.rmsnorm_gated(in, w, nullptr, eps, true, y);
  } else {
    ctx.rmsnorm(in, w, eps, y, Tensor());
  }
}

void Target::final_norm(Context& ctx, const Tensor& h, const Tensor& y) const {
  family_norm(ctx, cfg_, h, w_.final_norm, y);
}

void Target::run_layers(Context& ctx, const Tensor& h, const Tensor& pos, std::span<const SeqSegment> segs,
                        std::span<const int64_t> layer_ids, int64_t l0, int64_t l1, Output& out) const {
  const int64_t H = cfg_.hidden_size;
  Tensor x = ctx.empty(ctx.compute_dtype(), {h.rows(), H});
  for (int64_t l = l0; l < l1; ++l) {
    const TargetLayer& L = w_.layers[static_cast<size_t>(l - w_.first_layer)];
    const Tensor& inv_freq = L.spec.attention.rope_alt ? w_.inv_freq_alt : w_.inv_freq;
    // with sandwich norms each mixer adds into a zeroed buffer y, normed before the residual add
    const Tensor y = L.spec.sandwich_norms ? ctx.zeros(ctx.compute_dtype(), {h.rows(), H}) : h;
    family_norm(ctx, cfg_, h, L.in_norm, x);
    token_mixer(L.spec.mixer).forward(ctx, L.mixer, {cfg_, L.spec, l, x, pos, inv_freq, segs}, y);
    if (L.spec.sandwich_norms) {
      family_norm(ctx, cfg_, y, L.mixer_out_norm, y);
      ctx.add(h, y);
      ctx.zero(y);
    }
    family_norm(ctx, cfg_, h, L.post_norm, x);
    if (L.spec.mlp == ChannelMixer::Dense) {
      dense_mlp_forward(ctx, L.mlp, x, y, cfg_.mlp_act);
      out.router_topk.emplace_back();
    } else if (L.moe_in_norm.defined()) {  // Gemma 4: dense MLP and experts side by side on the residual stream h
      dense_mlp_forward(ctx, L.mlp, x, y, cfg_.mlp_act);
      family_norm(ctx, cfg_, y, L.dense_out_norm, y);
      Tensor xr = ctx.empty(ctx.compute_dtype(), {h.rows(), H}), y2 = ctx.zeros(ctx.compute_dtype(), {h.rows(), H});
      family_norm(ctx, cfg_, h, L.ones, xr);         // the router's input: RMSNorm(h) (its scales are folded)
      family_norm(ctx, cfg_, h, L.moe_in_norm, x);   // the experts' input
      out.router_topk.push_back(moe_forward(ctx, L.moe, cfg_.moe, x, y2, &xr));
      family_norm(ctx, cfg_, y2, L.moe_out_norm, y2);
      ctx.add(y, y2);
    } else {
      out.router_topk.push_back(moe_forward(ctx, L.moe, cfg_.moe, x, y));
      if (L.shared.defined()) shared_expert_forward(ctx, L.shared, x, y);
    }
    if (L.spec.sandwich_norms) {
      family_norm(ctx, cfg_, y, L.mlp_out_norm, y);
      ctx.add(h, y);
    }
    if (L.spec.layer_scalar && L.layer_scalar != 1.0) ctx.add(h, h, static_cast<float>(L.layer_scalar - 1.0));
    for (size_t f = 0; f < layer_ids.size(); ++f)
      if (layer_ids[f] == l) ctx.copy_columns(out.features, h, static_cast<int64_t>(f) * H);
  }
}

Target::StageState Target::run_stage(Context& ctx, const Tensor& ids, const Tensor& pos,
                                     std::span<const SeqSegment> segs, const StageState* in,
                                     std::span<const int64_t> layer_ids, int64_t run_end, bool want_final,
                                     Tensor* final_hidden, std::vector<Tensor>* router_topk) const {
  const int64_t R = pos.numel(), H = cfg_.hidden_size, Lt = cfg_.num_hidden_layers;
  const int64_t nfH = static_cast<int64_t>(layer_ids.size()) * H;
  const DType dt = ctx.compute_dtype();
  const TargetStage st = stage();
  Output out;
  StageState s;
  s.h = ctx.empty(dt, {R, H});
  out.features = s.features = ctx.empty(dt, {R, nfH});
  if (st.first == 0) {
    DFLASH_CHECK(ids.numel() == R, "target: ", ids.numel(), " ids for ", R, " positions");
    embed(ctx, ids, s.h);
  } else {
    DFLASH_CHECK(in != nullptr, "target stage [", st.first, ", ", st.end, "): no state from the stage before");
    DFLASH_CHECK(in->h.shape == s.h.shape && in->features.shape == s.features.shape, "target stage [", st.first, ", ",
                 st.end, "): the state from the stage before is ", shape_str(in->h.shape), " + ",
                 shape_str(in->features.shape), ", expected ", shape_str(s.h.shape), " + ",
                 shape_str(s.features.shape));
    ctx.copy(s.h, in->h);
    if (nfH > 0) ctx.copy(s.features, in->features);
  }
  const int64_t l1 = std::min(st.end, run_end);
  if (l1 > st.first) run_layers(ctx, s.h, pos, segs, layer_ids, st.first, l1, out);
  if (router_topk) router_topk->insert(router_topk->end(), out.router_topk.begin(), out.router_topk.end());
  if (want_final && st.end == Lt) {
    DFLASH_CHECK(final_hidden != nullptr, "target stage [", st.first, ", ", st.end, "): want_final without an output");
    *final_hidden = ctx.empty(dt, {R, H});
    final_norm(ctx, s.h, *final_hidden);
  }
  return s;
}

Target::StageState Target::forward_stage(Context& ctx, const Tensor& ids, const StageState* in,
                                         std::span<const int64_t> layer_ids, bool want_final,
                                         Tensor* final_hidden) const {
  const int64_t T = ids.numel(), Lt = cfg_.num_hidden_layers;
  const int64_t last = check_layer_ids(cfg_, layer_ids);
  std::vector<int32_t> pos_host(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) pos_host[static_cast<size_t>(t)] = static_cast<int32_t>(t);
  const SeqSegment seg{0, T, 0, nullptr};
  return run_stage(ctx, stage().first == 0 ? ctx.to_device(ids) : ids, ctx.to_device(cpu_tensor_i32(pos_host, {T})),
                   {&seg, 1}, in, layer_ids, want_final ? Lt : last + 1, want_final, final_hidden);
}

void target_logits(Context& ctx, const ModelConfig& cfg, const Tensor& lm_head, const Tensor& hidden,
                   const Tensor& out) {
  ctx.linear(hidden, lm_head, nullptr, out);
  if (cfg.final_logit_softcap > 0) ctx.softcap(out, static_cast<float>(cfg.final_logit_softcap));
}

void Target::logits(Context& ctx, const Tensor& hidden, const Tensor& out) const {
  target_logits(ctx, cfg_, w_.lm_head, hidden, out);
}

KVCache Target::make_cache(Context& ctx, int64_t capacity, bool rollback) const {
  KVCache c = KVCache::create(ctx, cfg_, capacity);
  c.keep_rollback = rollback;
  return c;
}

}  // namespace dflash
