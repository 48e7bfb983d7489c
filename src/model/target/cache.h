// model/target/cache.h — a sequence's decode memory in the target: one object over all layers, whatever each layer's
// token mixer keeps (keys and values for attention, a convolution window and a recurrent state for linear attention).
// defines: LayerCache, KVCache
//
// Each layer's part is made, written and truncated by its token-mixer kind (model/target/mixer.h: make_cache,
// forward, truncate); this file only holds the parts and walks them. Two kinds of memory, as in llama.cpp's
// llama_memory_hybrid (a KV cache and a recurrent memory over one sequence):
//   positional: rows indexed by position (k, v). Forgetting positions >= n only shortens len; the stale rows are
//               overwritten by the next forward.
//   recurrent:  constant in the sequence length (conv, state), the summary of every position so far. Forgetting
//               positions means recomputing it, from what the kind recorded of the last forward (record).
#pragma once
#include <any>
#include <cstdint>
#include <span>
#include <vector>

#include "backend/context.h"  // Context, Tensor
#include "io/hf_config.h"     // ModelConfig

namespace dflash {

struct TokenMixerKind;  // model/target/mixer.h

// One layer's part of a sequence's cache. Tensors on the cache's device; which are defined is the kind's choice.
struct LayerCache {
  const TokenMixerKind* kind = nullptr;  // the layer's token-mixer kind: the only code that reads or writes this part
  // Positional memory, [capacity, ...] in the kind's shape; rows 0..len-1 hold positions 0..len-1. Attention: k, v
  // [capacity, nkv, d] act.
  Tensor k, v;
  // Recurrent memory. Gated DeltaNet: conv [K - 1, C] act, the convolution inputs of the K - 1 positions before len
  // (zeros at len 0); state [nv, dk, dv] param dtype, the delta-rule state after position len - 1 (zeros at len 0).
  Tensor conv, state;
  // What the kind kept of the last forward to roll recurrent memory back (only when KVCache::keep_rollback), of the
  // kind's own type; empty: nothing kept.
  std::any record;
};

// A sequence's cache for one target: positions 0..len-1 are in it, at most capacity.
struct KVCache {
  std::vector<LayerCache> layers;  // [num_hidden_layers], made by each layer's kind
  int64_t len = 0, capacity = 0;
  // Record each forward so that truncate can roll recurrent memory back (speculative decoding's verification); off:
  // a forward keeps nothing beyond the memory itself (generation).
  bool keep_rollback = false;

  // An empty cache (len 0) of `capacity` positions for a target of config cfg, on ctx's device: every layer's part as
  // its kind makes it (uninitialised positional rows, zero recurrent memory). Throws Error for a layer kind missing
  // from the table (model/target/mixer.cpp).
  static KVCache create(Context& ctx, const ModelConfig& cfg, int64_t capacity);
  // The same with layer l's part on *layer_ctx[l]'s device (a split target: each layer's part where its stage runs;
  // model/target_stages.h StagedTarget). layer_ctx holds num_hidden_layers contexts (Error otherwise).
  static KVCache create(std::span<Context* const> layer_ctx, const ModelConfig& cfg, int64_t capacity);
  // Forget positions >= new_len (rejected draft tokens). Positional memory just shortens; recurrent memory rolls
  // back, which is possible only into the last forward and only when it ran with keep_rollback: new_len in
  // [its start, len]. new_len == len drops that record. Throws Error for new_len outside [0, len] or a rollback
  // that is not possible.
  void truncate(Context& ctx, int64_t new_len);
  // The same with layer l's rollback run on *layer_ctx[l] (the contexts the parts were made on: create above).
  void truncate(std::span<Context* const> layer_ctx, int64_t new_len);
  // The same without a context, for caches whose layers all forget by shortening (or new_len == len): throws Error
  // where a layer's recurrent memory would have to roll back.
  void truncate(int64_t new_len);
};

}  // namespace dflash
