// model/target_batch.cpp — Target::forward_batch: several sequences, each with its own KV cache, in one pass whose
// projections and MLP are single GEMMs over the stacked rows (batched generation, eval/generate.h).
#include <cmath>

#include "model/target.h"

namespace dflash {

Target::Output Target::forward_batch(Context& ctx, std::span<const std::vector<int32_t>> seqs,
                                     std::span<KVCache* const> caches, std::span<const int64_t> layer_ids,
                                     bool want_final) const {
  const int64_t n = static_cast<int64_t>(seqs.size());
  DFLASH_CHECK(static_cast<int64_t>(caches.size()) == n, "target forward_batch: ", n, " sequences but ",
               caches.size(), " caches");
  DFLASH_CHECK(n > 0, "target forward_batch: no sequence");
  const int64_t H = cfg_.hidden_size, d = cfg_.head_dim, I = cfg_.intermediate_size, V = cfg_.vocab_size;
  const int64_t nh = cfg_.num_attention_heads, nkv = cfg_.num_key_value_heads, Lt = cfg_.num_hidden_layers;
  const DType dt = ctx.compute_dtype();
  for (int64_t l : layer_ids) DFLASH_CHECK(l >= 0 && l < Lt, "target layer id ", l, " outside [0, ", Lt, ")");
  // Every layer runs, whatever layer_ids and want_final ask: each layer's cache must receive the new positions.
  const int64_t run_layers = Lt;

  // Stacked ids and per-row positions; row offsets of each sequence.
  std::vector<int64_t> off(static_cast<size_t>(n + 1), 0);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t T = static_cast<int64_t>(seqs[i].size());
    DFLASH_CHECK(T > 0, "target forward_batch: sequence ", i, " has no token");
    DFLASH_CHECK(caches[i] != nullptr, "target forward_batch: sequence ", i, " has no KV cache");
    DFLASH_CHECK(caches[i]->len + T <= caches[i]->capacity, "target: KV cache of ", caches[i]->capacity,
                 " positions cannot take ", T, " more after ", caches[i]->len, " (sequence ", i, ")");
    off[i + 1] = off[i] + T;
  }
  const int64_t R = off[n];
  std::vector<int32_t> ids_host(static_cast<size_t>(R)), pos_host(static_cast<size_t>(R));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t start = caches[i]->len;
    for (int64_t t = 0; t < off[i + 1] - off[i]; ++t) {
      const int32_t id = seqs[i][static_cast<size_t>(t)];
      DFLASH_CHECK(id >= 0 && id < V, "target forward_batch: token id ", id, " outside [0, ", V, ")");
      ids_host[static_cast<size_t>(off[i] + t)] = id;
      pos_host[static_cast<size_t>(off[i] + t)] = static_cast<int32_t>(start + t);
    }
  }
  Tensor ids = ctx.to_device(cpu_tensor_i32(ids_host, {R}));
  Tensor pos = ctx.to_device(cpu_tensor_i32(pos_host, {R}));

  Output out;
  out.features = ctx.empty(dt, {R, static_cast<int64_t>(layer_ids.size()) * H});
  Tensor h = ctx.empty(dt, {R, H});
  ctx.embedding(w_.embed, ids, h);
  Tensor x = ctx.empty(dt, {R, H});
  Tensor q = ctx.empty(dt, {R, nh, d});
  Tensor k = ctx.empty(dt, {R, nkv, d});
  Tensor v = ctx.empty(dt, {R, nkv, d});
  Tensor o = ctx.empty(dt, {R, nh, d});
  Tensor g = ctx.empty(dt, {R, I});
  Tensor u = ctx.empty(dt, {R, I});
  Tensor none;
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  for (int64_t l = 0; l < run_layers; ++l) {
    const TargetLayer& L = w_.layers[l];
    ctx.rmsnorm(h, L.in_norm, eps, x, none);
    ctx.linear(x, L.wq, L.bq.defined() ? &L.bq : nullptr, q.reshape({R, nh * d}));
    ctx.linear(x, L.wk, L.bk.defined() ? &L.bk : nullptr, k.reshape({R, nkv * d}));
    ctx.linear(x, L.wv, L.bv.defined() ? &L.bv : nullptr, v.reshape({R, nkv * d}));
    if (cfg_.qk_norm) {
      Tensor q2 = q.reshape({R * nh, d}), k2 = k.reshape({R * nkv, d});
      ctx.rmsnorm(q2, L.q_norm, eps, q2, none);
      ctx.rmsnorm(k2, L.k_norm, eps, k2, none);
    }
    ctx.rope(q, pos, w_.inv_freq, false);
    ctx.rope(k, pos, w_.inv_freq, false);
    for (int64_t i = 0; i < n; ++i) {  // attention: per sequence, over its own cache
      KVCache& c = *caches[i];
      const int64_t start = c.len, T = off[i + 1] - off[i];
      ctx.copy(c.k[l].slice(start, start + T), k.slice(off[i], off[i + 1]));
      ctx.copy(c.v[l].slice(start, start + T), v.slice(off[i], off[i + 1]));
      ctx.attention_causal(q.slice(off[i], off[i + 1]), c.k[l].slice(0, start + T), c.v[l].slice(0, start + T),
                           o.slice(off[i], off[i + 1]), start, scale);
    }
    ctx.linear(o.reshape({R, nh * d}), L.wo, nullptr, h, 1.0f);  // h += o Wo^T
    ctx.rmsnorm(h, L.post_norm, eps, x, none);
    ctx.linear(x, L.w_gate, nullptr, g);
    ctx.linear(x, L.w_up, nullptr, u);
    ctx.silu_mul(g, u, g);
    ctx.linear(g, L.w_down, nullptr, h, 1.0f);  // h += down(...)
    for (size_t f = 0; f < layer_ids.size(); ++f)
      if (layer_ids[f] == l) ctx.copy_columns(out.features, h, static_cast<int64_t>(f) * H);
  }
  for (int64_t i = 0; i < n; ++i) caches[i]->len += off[i + 1] - off[i];
  if (want_final) {
    out.final_hidden = ctx.empty(dt, {R, H});
    ctx.rmsnorm(h, w_.final_norm, eps, out.final_hidden, none);
  }
  return out;
}

}  // namespace dflash
