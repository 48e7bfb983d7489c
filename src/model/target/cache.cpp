// model/target/cache.cpp — the target's per-sequence cache over all layers (model/target/cache.h); each layer's part
// belongs to its token-mixer kind (model/target/mixer.h).
#include "model/target/cache.h"

#include <vector>

#include "model/target/mixer.h"

namespace dflash {

KVCache KVCache::create(Context& ctx, const ModelConfig& cfg, int64_t capacity) {
  const std::vector<Context*> layer_ctx(static_cast<size_t>(cfg.num_hidden_layers), &ctx);
  return create(layer_ctx, cfg, capacity);
}

KVCache KVCache::create(std::span<Context* const> layer_ctx, const ModelConfig& cfg, int64_t capacity) {
  DFLASH_CHECK(static_cast<int64_t>(layer_ctx.size()) == cfg.num_hidden_layers, "KVCache::create: ",
               layer_ctx.size(), " contexts for ", cfg.num_hidden_layers, " layers");
  KVCache c;
  c.capacity = capacity;
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
    const LayerSpec spec = cfg.layer(l);
    const TokenMixerKind& kind = token_mixer(spec.mixer);
    c.layers.push_back(kind.make_cache(*layer_ctx[static_cast<size_t>(l)], cfg, spec, capacity));
    c.layers.back().kind = &kind;
  }
  return c;
}

void KVCache::truncate(int64_t new_len) {
  DFLASH_CHECK(new_len >= 0 && new_len <= len, "KVCache::truncate to ", new_len, " of ", len);
  for (size_t l = 0; l < layers.size(); ++l) {
    const TokenMixerKind* kind = layers[l].kind;
    DFLASH_CHECK(new_len == len || !kind || !kind->truncate, "KVCache::truncate to ", new_len, " of ", len,
                 ": layer ", l, "'s ", kind->name, " state must be rolled back (truncate(ctx, new_len))");
  }
  len = new_len;
}

void KVCache::truncate(Context& ctx, int64_t new_len) {
  const std::vector<Context*> layer_ctx(layers.size(), &ctx);
  truncate(layer_ctx, new_len);
}

void KVCache::truncate(std::span<Context* const> layer_ctx, int64_t new_len) {
  DFLASH_CHECK(new_len >= 0 && new_len <= len, "KVCache::truncate to ", new_len, " of ", len);
  DFLASH_CHECK(layer_ctx.size() == layers.size(), "KVCache::truncate: ", layer_ctx.size(), " contexts for ",
               layers.size(), " layers");
  for (size_t l = 0; l < layers.size(); ++l) {
    LayerCache& c = layers[l];
    if (c.kind && c.kind->truncate) c.kind->truncate(*layer_ctx[l], c, len, new_len);
  }
  len = new_len;
}

}  // namespace dflash
