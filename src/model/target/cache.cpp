// model/target/cache.cpp — the target's per-sequence cache over all layers (model/target/cache.h); each layer's part
// belongs to its token-mixer kind (model/target/mixer.h).
#include "model/target/cache.h"

#include "model/target/mixer.h"

namespace dflash {

KVCache KVCache::create(Context& ctx, const ModelConfig& cfg, int64_t capacity) {
  KVCache c;
  c.capacity = capacity;
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
    const LayerSpec spec = cfg.layer(l);
    const TokenMixerKind& kind = token_mixer(spec.mixer);
    c.layers.push_back(kind.make_cache(ctx, cfg, spec, capacity));
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
  DFLASH_CHECK(new_len >= 0 && new_len <= len, "KVCache::truncate to ", new_len, " of ", len);
  for (LayerCache& c : layers)
    if (c.kind && c.kind->truncate) c.kind->truncate(ctx, c, len, new_len);
  len = new_len;
}

}  // namespace dflash
