#include "model/params.h"

namespace dflash {

Param& ParamSet::add(Context& ctx, const std::string& name, const Tensor& init) {
  Tensor master = ctx.to_device(init, ctx.param_dtype());
  if (master.data == init.data) master = ctx.to_device(cpu_clone(init), ctx.param_dtype());
  return adopt(ctx, name, std::move(master));
}

Param& ParamSet::adopt(Context& ctx, const std::string& name, Tensor master) {
  DFLASH_CHECK(master.device == ctx.device() && master.dtype == ctx.param_dtype(), "parameter ", name,
               ": master tensor must be on the context's device in its parameter dtype");
  for (const auto& p : params_) DFLASH_CHECK(p.name != name, "parameter ", name, " added twice");
  Param p;
  p.name = name;
  p.shape = master.shape;
  p.master = std::move(master);
  p.compute = ctx.compute_dtype() == ctx.param_dtype() ? p.master : ctx.to_device(p.master, ctx.compute_dtype());
  p.grad = ctx.zeros(ctx.param_dtype(), p.shape);
  p.m = ctx.zeros(ctx.param_dtype(), p.shape);
  p.v = ctx.zeros(ctx.param_dtype(), p.shape);
  params_.push_back(std::move(p));
  return params_.back();
}

Param& ParamSet::get(const std::string& name) {
  for (auto& p : params_)
    if (p.name == name) return p;
  DFLASH_FAIL("no parameter named ", name);
}

const Param& ParamSet::get(const std::string& name) const {
  for (const auto& p : params_)
    if (p.name == name) return p;
  DFLASH_FAIL("no parameter named ", name);
}

int64_t ParamSet::numel() const {
  int64_t n = 0;
  for (const auto& p : params_) n += p.master.numel();
  return n;
}

void ParamSet::zero_grad(Context& ctx) {
  if (flat_grad_.defined()) {
    ctx.zero(flat_grad_);
    return;
  }
  for (auto& p : params_) ctx.zero(p.grad);
}

const Tensor& ParamSet::flatten_grads(Context& ctx) {
  if (flat_grad_.defined()) return flat_grad_;
  constexpr int64_t kAlign = 64;
  int64_t total = 0;
  for (const auto& p : params_) total += (p.grad.numel() + kAlign - 1) / kAlign * kAlign;
  Tensor flat = ctx.zeros(ctx.param_dtype(), {total});
  int64_t off = 0;
  for (auto& p : params_) {
    Tensor view = flat;
    view.shape = p.shape;
    view.data = static_cast<char*>(flat.data) + static_cast<size_t>(off) * dtype_size(flat.dtype);
    ctx.copy(view, p.grad);
    p.grad = view;
    off += (view.numel() + kAlign - 1) / kAlign * kAlign;
  }
  flat_grad_ = flat;
  return flat_grad_;
}

void ParamSet::sync_compute(Context& ctx) {
  for (auto& p : params_)
    if (p.compute.data != p.master.data) ctx.copy(p.compute, p.master);
}

}  // namespace dflash

#include "io/safetensors.h"

namespace dflash {

void load_params(Context& ctx, ParamSet& ps, const WeightStore& ws) {
  for (auto& p : ps.all()) {
    DFLASH_CHECK(ws.has(p.name), ws.source(), ": missing tensor ", p.name);
    ctx.copy(p.master, ctx.to_device(ws.f32(p.name, p.shape), p.master.dtype));
  }
  ps.sync_compute(ctx);
}

}  // namespace dflash
