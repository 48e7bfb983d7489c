// model/drafter_init.h — starting a drafter from the target's own weights instead of random ones.
// defines: DrafterInit, resolve_init_layers, init_drafter_from_target
//
// The drafter has the target's hidden size, heads and MLP width (DrafterConfig::for_target), so a target decoder
// layer fits a draft layer as it is. Two independent choices:
// - layers: draft layer l takes every weight of target layer layers[l];
// - fc "last": fc [H, nf*H] starts as the selection of the last captured feature (identity on its H columns, zero
//   on the others), so Ht = hidden_norm(h_after_layer(max id)) at step 0.
// With both, and layers[0] = max(target_layer_ids) + 1 ("next"), draft layer 0's context keys/values at step 0
// are exactly the keys/values target layer layers[0] computes for the context (hidden_norm takes that layer's
// input_layernorm), and the draft's final norm is the target's: the drafter starts as "the next target layer,
// with the block tokens entering as plain embeddings" instead of as noise.
#pragma once
#include <span>
#include <string>
#include <vector>

#include "model/drafter.h"

namespace dflash {

class WeightStore;

struct DrafterInit {
  std::string layers;        // "" (random, spec 1), "next", or a comma list of Ld target layer indices
  std::string fc = "random"; // "random" (spec 1) or "last"
};

// The target layers behind DrafterInit::layers for a drafter of config `c`: "" -> {}; "next" -> the Ld layers
// after the last captured one, max(target_layer_ids)+1 .., shifted down so they end at the target's last layer
// when they would run past it (8-layer target, ids {1..5}, Ld 1: {6}); a list: exactly Ld indices in
// [0, num_target_layers). Error names the option and the bad value.
std::vector<int64_t> resolve_init_layers(const std::string& spec, const DrafterConfig& c);

// Overwrites the master weights of `ps` (a drafter of config `c`, freshly initialised) from the target checkpoint
// `target` (HF names): for each draft layer l and t = layers[l], model.layers.{t}.{input_layernorm,
// post_attention_layernorm, self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj}.weight and, when the target has
// them (Qwen3), self_attn.{q,k}_norm.weight (else they stay 1; Qwen2's q/k/v biases have no drafter counterpart and
// are left out); hidden_norm.weight = model.layers.{layers[0]}.input_layernorm.weight and norm.weight =
// model.norm.weight when layers is non-empty; fc.weight as `fc` says. Refreshes the compute copies. Deterministic
// (no random draw), so every drafter replica starts identical. Errors: a missing tensor or a shape mismatch,
// naming the tensor and the checkpoint; an unknown fc mode.
void init_drafter_from_target(Context& ctx, ParamSet& ps, const DrafterConfig& c, const WeightStore& target,
                              std::span<const int64_t> layers, const std::string& fc);

}  // namespace dflash
