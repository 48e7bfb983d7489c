// model/target/mixer.h — the token mixers of the target's layers as one table: each kind (causal attention, Gated
// DeltaNet linear attention, multi-head latent attention) is one descriptor, and the layer loop, the cache and `dflash info` reach every kind
// through it and never name one.
// defines: MixerWeights, mixer_weights, SeqSegment, MixerArgs, TokenMixerKind, causal_sequences, token_mixer,
//          token_mixers
//
// A new kind is its own file (a descriptor: a `const TokenMixerKind` with external linkage; a header beside it when
// its weights struct is wanted elsewhere, e.g. by a hand-built target) and one row of the table in
// model/target/mixer.cpp; its TokenMixer value and options come from the plan that io/ reads from config.json
// (io/hf_config.h LayerSpec).
#pragma once
#include <any>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "backend/context.h"        // Context, Tensor
#include "core/error.h"             // DFLASH_CHECK
#include "io/hf_config.h"           // ModelConfig, LayerSpec, TokenMixer
#include "model/target/cache.h"     // KVCache, LayerCache
#include "model/target/weights.h"   // WeightSource, WeightNames

namespace dflash {

// One layer's token-mixer weights, as its kind's own struct (AttentionWeights: model/target/attention.h,
// LinearAttnWeights: model/target/linear_attention.h, LatentAttnWeights: model/target/latent_attention.h). Immutable once loaded; copies share the tensors.
using MixerWeights = std::any;

// w's weights as kind struct W. Throws Error naming `kind` when w holds none or another kind's.
template <class W>
const W& mixer_weights(const MixerWeights& w, const char* kind) {
  const W* p = std::any_cast<W>(&w);
  DFLASH_CHECK(p != nullptr, "target layer: its token mixer holds no ", kind, " weights");
  return *p;
}

// Rows [begin, end) of a forward's stacked input are one sequence at positions start, start + 1, ...: with a cache
// they are appended to it (start = cache->len before the forward) and continue from its memory; without one they
// start at position 0 from nothing (start = 0).
struct SeqSegment {
  int64_t begin, end, start;
  KVCache* cache;
};

// What one layer's token mixer reads besides its weights. R = the rows of all segments, stacked in their order.
struct MixerArgs {
  const ModelConfig& cfg;
  const LayerSpec& spec;             // the layer's plan; spec.mixer is the descriptor's kind
  int64_t layer;                     // l, the layer's index: its part of each cache is cache->layers[l]
  const Tensor& x;                   // [R, H] act: RMSNorm_in(h)
  const Tensor& pos;                 // [R] I32 on the device: each row's position
  const Tensor& inv_freq;            // [rope_dim / 2] F32 on the device: the target's RoPE frequencies
  std::span<const SeqSegment> segs;  // a partition of rows 0..R-1, in order
};

// One token-mixer kind. Every entry is non-null but truncate, info_key and info_keys, whose null means what they say.
struct TokenMixerKind {
  TokenMixer kind;
  const char* name;  // in messages: "attention", "linear attention"

  // The layer's weights under `prefix` ("model.layers.{l}."), Hugging Face names from `names`, on src's device in
  // its compute dtype (tensors the kind keeps in F32 say so). A random source draws in call order, so the order of
  // the kind's calls is part of a random target's identity: keep it. Throws Error naming the tensor and the file for
  // a missing one or another shape.
  MixerWeights (*load)(WeightSource& src, const std::string& prefix, const WeightNames& names, const ModelConfig& cfg,
                       const LayerSpec& spec);
  // What w lacks for the plan `spec`, as a phrase for Target's error ("the weights of its attention are missing");
  // empty when complete. Catches hand-built layers (model/target.h TargetLayer) whose weights and plan disagree.
  std::string (*missing)(const MixerWeights& w, const LayerSpec& spec);

  // h [R, H] act += mixer(x) for every segment, in one call: the prefill with capture (segments without a cache:
  // each sequence causal within itself), the cached decode step and a speculative verification (segments with one:
  // the new rows appended to cache->layers[l] at positions start.., recording the rollback when the cache keeps
  // it), or both mixed in one batch. w holds this kind's weights (Target checks it with `missing`).
  void (*forward)(Context& ctx, const MixerWeights& w, const MixerArgs& a, const Tensor& h);

  // Parameters of one layer's mixer (every weight, bias, norm and sink), each held in the compute dtype.
  int64_t (*params)(const ModelConfig& cfg, const LayerSpec& spec);

  // A fresh sequence's part of the cache for one layer, on ctx's device, room for `capacity` positions (the
  // positional tensors are uninitialised, the recurrent ones zero). `kind` is set by KVCache::create.
  LayerCache (*make_cache)(Context& ctx, const ModelConfig& cfg, const LayerSpec& spec, int64_t capacity);
  // Brings the part c of a cache holding `len` positions to its first new_len (0 <= new_len <= len, checked by the
  // caller) where shortening len is not enough: the rollback of recurrent memory. KVCache::truncate(ctx, ..) calls
  // it for every layer of the kind, new_len == len included (the kind drops what it recorded). Throws Error when the
  // rollback is not possible. nullptr: the kind keeps positional memory only, which forgets by shortening.
  void (*truncate)(Context& ctx, LayerCache& c, int64_t len, int64_t new_len);

  // The mixer of a layer in words, for `dflash info`: "attention (qk-norm, sliding window 128)".
  std::string (*describe)(const ModelConfig& cfg, const LayerSpec& spec);
  // `dflash info --json` gives the kind's config keys as an object under this key (with "layers": how many layers
  // are of the kind) when some layer is; nullptr: the kind's keys are the config's top-level ones.
  const char* info_key;
  std::vector<std::pair<const char*, int64_t>> (*info_keys)(const ModelConfig& cfg);  // config.json's names
};

// The attention kinds' step between their projections and Context::attention_causal_batch (model/target/attention.cpp):
// for each segment of `a`, the sequence its rows attend over: with a cache, k and v's rows [begin, end) ([R, nkv, d]
// act, the cache's layout) written into cache->layers[a.layer] at positions start.. and the cache's first start + T
// rows; without one, its own rows of k and v.
std::vector<CausalSeq> causal_sequences(Context& ctx, const MixerArgs& a, const Tensor& k, const Tensor& v);

// The descriptor of `kind`. Throws Error for a kind missing from the table.
const TokenMixerKind& token_mixer(TokenMixer kind);
// Every descriptor, in the table's order.
std::span<const TokenMixerKind* const> token_mixers();

}  // namespace dflash
