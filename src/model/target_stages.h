// model/target_stages.h — a target cut into consecutive stages (a target worker over several devices, train
// --target-split): which decoder layers each stage holds, balanced by their cost.
// defines: TargetStage, target_layer_cost, split_target_layers
//
// Stage s of S holds layers [first, end): stage 0 also the embedding, the last stage the final norm and lm_head.
// The cost of a layer is its parameters (what its device holds) plus the parameters one token multiplies by (its
// FLOPs / 2): model/target.h target_layer_params, i.e. the family's per-layer plan and formats. The embedding counts
// its V x H parameters in stage 0 (a lookup: memory only), lm_head and the final norm in the last stage.
#pragma once
#include <cstdint>
#include <vector>

#include "io/hf_config.h"

namespace dflash {

struct TargetStage {
  int64_t first = 0, end = 0;  // layers [first, end), end > first
  bool holds(int64_t l) const { return l >= first && l < end; }
};

// Layer l's cost as above (total + active parameters).
int64_t target_layer_cost(const ModelConfig& cfg, int64_t l);

// S consecutive stages covering layers 0 .. num_hidden_layers - 1, each at least one layer, that minimise the largest
// stage cost (the head's costs included); among equal maxima the earliest boundaries. S = 1: one stage of every
// layer. Throws Error naming --target-split when S < 1 or S > num_hidden_layers.
std::vector<TargetStage> split_target_layers(const ModelConfig& cfg, int S);

}  // namespace dflash
