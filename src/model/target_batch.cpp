// model/target_batch.cpp — Target::forward_batch (several sequences, each with its own KV cache: batched generation,
// eval/generate.h) and Target::forward_packed (several sequences without caches: a batch's prefill), each one pass
// whose projections and MLP are single GEMMs over the stacked rows; stack_rows, the stacking both use.
#include "model/target.h"

#include <algorithm>

namespace dflash {

StackedRows stack_rows(std::span<const std::vector<int32_t>> seqs, std::span<KVCache* const> caches, int64_t vocab,
                       const char* what) {
  const int64_t n = static_cast<int64_t>(seqs.size());
  DFLASH_CHECK(n > 0, what, ": no sequence");
  DFLASH_CHECK(caches.empty() || static_cast<int64_t>(caches.size()) == n, what, ": ", n, " sequences but ",
               caches.size(), " caches");
  StackedRows r;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t T = static_cast<int64_t>(seqs[i].size()), r0 = static_cast<int64_t>(r.ids.size());
    DFLASH_CHECK(T > 0, what, ": sequence ", i, " has no token");
    KVCache* cache = caches.empty() ? nullptr : caches[i];
    DFLASH_CHECK(caches.empty() || cache != nullptr, what, ": sequence ", i, " has no KV cache");
    const int64_t start = cache ? cache->len : 0;
    if (cache)
      DFLASH_CHECK(start + T <= cache->capacity, "target: KV cache of ", cache->capacity, " positions cannot take ", T,
                   " more after ", start, " (sequence ", i, ")");
    for (int64_t t = 0; t < T; ++t) {
      const int32_t id = seqs[i][static_cast<size_t>(t)];
      DFLASH_CHECK(id >= 0 && id < vocab, what, ": token id ", id, " outside [0, ", vocab, ")");
      r.ids.push_back(id);
      r.pos.push_back(static_cast<int32_t>(start + t));
    }
    r.segs.push_back({r0, r0 + T, start, cache});
  }
  return r;
}

int64_t check_layer_ids(const ModelConfig& cfg, std::span<const int64_t> layer_ids) {
  int64_t last = -1;
  for (int64_t l : layer_ids) {
    DFLASH_CHECK(l >= 0 && l < cfg.num_hidden_layers, "target layer id ", l, " outside [0, ", cfg.num_hidden_layers,
                 ")");
    last = std::max(last, l);
  }
  return last;
}

Target::Output Target::forward_batch(Context& ctx, std::span<const std::vector<int32_t>> seqs,
                                     std::span<KVCache* const> caches, std::span<const int64_t> layer_ids,
                                     bool want_final) const {
  DFLASH_CHECK(caches.size() == seqs.size(), "target forward_batch: ", seqs.size(), " sequences but ", caches.size(),
               " caches");
  check_layer_ids(cfg_, layer_ids);
  const StackedRows r = stack_rows(seqs, caches, cfg_.vocab_size, "target forward_batch");
  const int64_t R = static_cast<int64_t>(r.ids.size());
  // Every layer runs, whatever layer_ids and want_final ask: each layer's cache must receive the new positions.
  Output out = run(ctx, ctx.to_device(cpu_tensor_i32(r.ids, {R})), ctx.to_device(cpu_tensor_i32(r.pos, {R})), r.segs,
                   layer_ids, cfg_.num_hidden_layers, want_final);
  for (const SeqSegment& s : r.segs) s.cache->len += s.end - s.begin;
  return out;
}

Target::Output Target::forward_packed(Context& ctx, std::span<const std::vector<int32_t>> seqs,
                                      std::span<const int64_t> layer_ids, bool want_final) const {
  const int64_t last = check_layer_ids(cfg_, layer_ids);
  const StackedRows r = stack_rows(seqs, {}, cfg_.vocab_size, "target forward_packed");
  const int64_t R = static_cast<int64_t>(r.ids.size());
  return run(ctx, ctx.to_device(cpu_tensor_i32(r.ids, {R})), ctx.to_device(cpu_tensor_i32(r.pos, {R})), r.segs,
             layer_ids, want_final ? cfg_.num_hidden_layers : last + 1, want_final);
}

}  // namespace dflash
