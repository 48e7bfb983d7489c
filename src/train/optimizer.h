// train/optimizer.h — learning-rate schedule, global grad-norm clipping and the AdamW step (spec 2.5).
// defines: OptimConfig, lr_at, StepResult, global_grad_sq, optimizer_step
#pragma once
#include <cstdint>
#include <string>

#include "model/params.h"

namespace dflash {

struct OptimConfig {
  double lr = 6e-4;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  double max_grad_norm = 1.0;   // <= 0 disables clipping
  double warmup_ratio = 0.04;   // fraction of total steps with linear warmup
  std::string schedule = "cosine";  // "cosine" (to 0 after warmup) or "constant" (after warmup)
};

// Learning rate for the 0-based optimizer step `step` of `total` steps: lr * (step+1)/W during the W =
// ceil(warmup_ratio * total) warmup steps, then lr * 0.5 * (1 + cos(pi * (step - W) / (total - W))) (cosine)
// or lr (constant).
double lr_at(const OptimConfig& c, int64_t step, int64_t total);

// Sum over every parameter of sum(grad^2) (this worker's gradients). Synchronises.
double global_grad_sq(Context& ctx, const ParamSet& ps);

struct StepResult {
  double grad_norm = 0;   // global L2 norm before clipping
  double clip_scale = 1;  // the factor applied to the gradients
};

// One AdamW step (torch.optim.AdamW semantics, step_index 1-based for the bias correction) on every parameter,
// after clipping with torch.nn.utils.clip_grad_norm_'s rule: scale = min(1, max_norm / (norm + 1e-6)), where
// norm = sqrt(grad_sq) is the GLOBAL norm (the caller sums grad_sq over workers). Zeroes the gradients.
StepResult optimizer_step(Context& ctx, ParamSet& ps, const OptimConfig& c, double lr, int64_t step_index,
                          double grad_sq);

}  // namespace dflash
