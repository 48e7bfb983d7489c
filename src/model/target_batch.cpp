// model/target_batch.cpp — Target::forward_batch (several sequences, each with its own KV cache: batched generation,
// eval/generate.h) and Target::forward_packed (several sequences without caches: a batch's prefill), each one pass
// whose projections and MLP are single GEMMs over the stacked rows.
#include "model/target.h"

#include <algorithm>

namespace dflash {

Target::Output Target::forward_batch(Context& ctx, std::span<const std::vector<int32_t>> seqs,
                                     std::span<KVCache* const> caches, std::span<const int64_t> layer_ids,
                                     bool want_final) const {
  const int64_t n = static_cast<int64_t>(seqs.size());
  DFLASH_CHECK(static_cast<int64_t>(caches.size()) == n, "target forward_batch: ", n, " sequences but ",
               caches.size(), " caches");
  DFLASH_CHECK(n > 0, "target forward_batch: no sequence");
  const int64_t V = cfg_.vocab_size, Lt = cfg_.num_hidden_layers;
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
  std::vector<SeqSegment> segs;
  for (int64_t i = 0; i < n; ++i) segs.push_back({off[i], off[i + 1], caches[i]->len, caches[i]});
  Output out = run(ctx, ctx.to_device(cpu_tensor_i32(ids_host, {R})), ctx.to_device(cpu_tensor_i32(pos_host, {R})),
                   segs, layer_ids, run_layers, want_final);
  for (int64_t i = 0; i < n; ++i) caches[i]->len += off[i + 1] - off[i];
  return out;
}

Target::Output Target::forward_packed(Context& ctx, std::span<const std::vector<int32_t>> seqs,
                                      std::span<const int64_t> layer_ids, bool want_final) const {
  const int64_t n = static_cast<int64_t>(seqs.size()), V = cfg_.vocab_size, Lt = cfg_.num_hidden_layers;
  DFLASH_CHECK(n > 0, "target forward_packed: no sequence");
  int64_t last = -1;
  for (int64_t l : layer_ids) {
    DFLASH_CHECK(l >= 0 && l < Lt, "target layer id ", l, " outside [0, ", Lt, ")");
    last = std::max(last, l);
  }
  std::vector<int32_t> ids_host, pos_host;
  std::vector<SeqSegment> segs;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t T = static_cast<int64_t>(seqs[i].size()), r0 = static_cast<int64_t>(ids_host.size());
    DFLASH_CHECK(T > 0, "target forward_packed: sequence ", i, " has no token");
    for (int64_t t = 0; t < T; ++t) {
      const int32_t id = seqs[i][static_cast<size_t>(t)];
      DFLASH_CHECK(id >= 0 && id < V, "target forward_packed: token id ", id, " outside [0, ", V, ")");
      ids_host.push_back(id);
      pos_host.push_back(static_cast<int32_t>(t));
    }
    segs.push_back({r0, r0 + T, 0, nullptr});
  }
  const int64_t R = static_cast<int64_t>(ids_host.size());
  return run(ctx, ctx.to_device(cpu_tensor_i32(ids_host, {R})), ctx.to_device(cpu_tensor_i32(pos_host, {R})), segs,
             layer_ids, want_final ? Lt : last + 1, want_final);
}

}  // namespace dflash
