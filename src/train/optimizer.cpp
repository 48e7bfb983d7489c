#include "train/optimizer.h"

#include <algorithm>
#include <cmath>

namespace dflash {

double lr_at(const OptimConfig& c, int64_t step, int64_t total) {
  total = std::max<int64_t>(total, 1);
  const int64_t W = static_cast<int64_t>(std::ceil(c.warmup_ratio * static_cast<double>(total)));
  if (step < W) return c.lr * static_cast<double>(step + 1) / static_cast<double>(W);
  if (c.schedule == "constant") return c.lr;
  DFLASH_CHECK(c.schedule == "cosine", "unknown lr schedule '", c.schedule, "' (cosine or constant)");
  const double progress = static_cast<double>(step - W) / static_cast<double>(std::max<int64_t>(1, total - W));
  return c.lr * 0.5 * (1.0 + std::cos(M_PI * std::min(1.0, progress)));
}

double global_grad_sq(Context& ctx, const ParamSet& ps) {
  // one pass and one synchronisation over the flat buffer when the gradients live in one (its gaps are zero)
  if (ps.flat_grad().defined()) return ctx.sum_squares(ps.flat_grad());
  double s = 0;
  for (const auto& p : ps.all()) s += ctx.sum_squares(p.grad);
  return s;
}

namespace {
StepResult clip_for(const OptimConfig& c, int64_t step_index, double grad_sq) {
  StepResult r;
  r.grad_norm = std::sqrt(grad_sq);
  DFLASH_CHECK(std::isfinite(r.grad_norm), "gradient norm is ", r.grad_norm, " at step ", step_index,
               ": the loss diverged (lower the learning rate) or the data has a problem");
  if (c.max_grad_norm > 0) r.clip_scale = std::min(1.0, c.max_grad_norm / (r.grad_norm + 1e-6));
  return r;
}
AdamWArgs adamw_args(const OptimConfig& c, double lr, int64_t step_index, const StepResult& r) {
  AdamWArgs a;
  a.lr = static_cast<float>(lr);
  a.beta1 = static_cast<float>(c.beta1);
  a.beta2 = static_cast<float>(c.beta2);
  a.eps = static_cast<float>(c.eps);
  a.weight_decay = static_cast<float>(c.weight_decay);
  a.grad_scale = static_cast<float>(r.clip_scale);
  a.step = step_index;
  return a;
}
}  // namespace

StepResult optimizer_step(Context& ctx, ParamSet& ps, const OptimConfig& c, double lr, int64_t step_index,
                          double grad_sq) {
  const StepResult r = clip_for(c, step_index, grad_sq);
  const AdamWArgs a = adamw_args(c, lr, step_index, r);
  ps.init_moments(ctx);
  for (auto& p : ps.all()) ctx.adamw(p.master, p.grad, p.m, p.v, a, p.compute);
  ps.zero_grad(ctx);  // (one memset when the gradients are flat)
  return r;
}

ShardLayout shard_layout(int64_t flat_numel, int shards) {
  DFLASH_CHECK(shards >= 1 && flat_numel >= 0, "shard_layout: ", flat_numel, " elements in ", shards, " shards");
  constexpr int64_t kAlign = 64;
  const int64_t per = (flat_numel + shards - 1) / shards;
  return ShardLayout{.shard = (per + kAlign - 1) / kAlign * kAlign, .shards = shards};
}

OptimShard make_optim_shard(Context& ctx, ParamSet& ps, int shards, int rank) {
  DFLASH_CHECK(rank >= 0 && rank < shards, "make_optim_shard: rank ", rank, " of ", shards);
  OptimShard s;
  s.layout = shard_layout(ps.flat_numel(), shards);
  s.rank = rank;
  ps.flatten_grads(ctx, s.layout.padded());
  ps.flatten_masters(ctx, s.layout.padded());
  DFLASH_CHECK(ps.flat_grad().numel() == s.layout.padded() && ps.flat_master().numel() == s.layout.padded(),
               "make_optim_shard: the flat buffers were made for another layout");
  s.m = ctx.zeros(ctx.param_dtype(), {s.layout.shard});
  s.v = ctx.zeros(ctx.param_dtype(), {s.layout.shard});
  return s;
}

double shard_grad_sq(Context& ctx, const ParamSet& ps, const OptimShard& s) {
  return ctx.sum_squares(ps.flat_grad().slice(s.begin(), s.end()));
}

StepResult optimizer_step_shard(Context& ctx, ParamSet& ps, OptimShard& s, const OptimConfig& c, double lr,
                                int64_t step_index, double grad_sq) {
  const StepResult r = clip_for(c, step_index, grad_sq);
  const AdamWArgs a = adamw_args(c, lr, step_index, r);
  ctx.adamw(ps.flat_master().slice(s.begin(), s.end()), ps.flat_grad().slice(s.begin(), s.end()), s.m, s.v, a,
            Tensor{});
  ctx.zero(ps.flat_grad());
  return r;
}

}  // namespace dflash
