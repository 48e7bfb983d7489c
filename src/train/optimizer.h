// train/optimizer.h — learning-rate schedule, global grad-norm clipping and the AdamW step (spec 2.5), replicated
// or with its state sharded over the drafter workers (ZeRO stage 1).
// defines: OptimConfig, lr_at, StepResult, global_grad_sq, optimizer_step, ShardLayout, shard_layout, OptimShard,
//          make_optim_shard, shard_grad_sq, optimizer_step_shard
//
// Sharded optimizer (ZeRO-1), per drafter worker of D (global rank g), N = ParamSet::flat_numel():
//   shard S = round_up(ceil(N / D), 64) elements (a pure function of N and D: shard_layout), padded length D*S;
//   worker g owns flat elements [g*S, (g+1)*S) (the last shard holds the padding; with tiny N a shard may hold
//   nothing but padding). Padding and the layout's gaps are zeros in every buffer and stay zeros under AdamW.
//   flat grad   [D*S] F32, full on every worker (backward writes every parameter's gradient); after the
//               reduce-scatter only the own shard holds the sum
//   flat master [D*S] F32, full on every worker (the masters are NOT sharded: every worker needs the whole model;
//               the compute copies (BF16 on CUDA) are refreshed from it after the all-gather)
//   m, v        [S] F32 each: the own shard only (the saving)
// Bytes per worker: 4*D*S (grad) + 4*D*S (master) + 2*N (BF16 compute copy, CUDA only) + 8*S (m, v), against
// 4*N + 4*N + 2*N + 8*N replicated: with D = 2, 14 N instead of 18 N; for large D about 10 N.
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

// Sum over every parameter of sum(grad^2) (this worker's gradients): one sum_squares over the flat gradient buffer
// when ps has one (flatten_grads), else one per parameter. Synchronises (once per sum_squares call).
double global_grad_sq(Context& ctx, const ParamSet& ps);

struct StepResult {
  double grad_norm = 0;   // global L2 norm before clipping
  double clip_scale = 1;  // the factor applied to the gradients
};

// One AdamW step (torch.optim.AdamW semantics, step_index 1-based for the bias correction) on every parameter,
// after clipping with torch.nn.utils.clip_grad_norm_'s rule: scale = min(1, max_norm / (norm + 1e-6)), where
// norm = sqrt(grad_sq) is the GLOBAL norm (the caller sums grad_sq over workers). Zeroes the gradients.
// Allocates the moments first if init_moments() has not run.
StepResult optimizer_step(Context& ctx, ParamSet& ps, const OptimConfig& c, double lr, int64_t step_index,
                          double grad_sq);

// ---- the sharded optimizer (ZeRO-1) ------------------------------------------------------------------------------
struct ShardLayout {
  int64_t shard = 0;  // elements per shard, a multiple of 64 (256-byte aligned shards, as NCCL likes them)
  int shards = 1;
  int64_t padded() const { return shard * shards; }
  int64_t begin(int rank) const { return shard * rank; }
};
// S = round_up(ceil(flat_numel / shards), 64), shards >= 1; flat_numel >= 0.
ShardLayout shard_layout(int64_t flat_numel, int shards);

// One worker's shard of the optimizer state: the moments of flat elements [begin(), end()) of ps's flat layout.
struct OptimShard {
  ShardLayout layout;
  int rank = 0;
  Tensor m, v;  // [layout.shard] param_dtype
  int64_t begin() const { return layout.begin(rank); }
  int64_t end() const { return layout.begin(rank + 1); }
};
// Flattens ps's gradients and masters to layout.padded() elements (ParamSet::flatten_grads / flatten_masters) and
// allocates the shard's moments (zeros). The per-parameter moments are never allocated.
OptimShard make_optim_shard(Context& ctx, ParamSet& ps, int shards, int rank);
// sum(grad^2) over the shard of the flat gradient (this worker's part of the global norm; the caller sums the
// parts over the workers). Synchronises.
double shard_grad_sq(Context& ctx, const ParamSet& ps, const OptimShard& s);
// optimizer_step on the shard of the flat master weights: the same clip rule on the GLOBAL grad_sq, the same
// element-wise AdamW (so the shard's values equal the replicated step's given the same summed gradient and
// grad_sq). Zeroes the whole flat gradient. It does not touch the other shards nor the compute copies: all-gather
// the flat masters, then ParamSet::sync_compute.
StepResult optimizer_step_shard(Context& ctx, ParamSet& ps, OptimShard& s, const OptimConfig& c, double lr,
                                int64_t step_index, double grad_sq);

}  // namespace dflash
