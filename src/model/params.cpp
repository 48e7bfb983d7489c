#include "model/params.h"

#include <algorithm>

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
  DFLASH_CHECK(!flat_grad_.defined() && !flat_master_.defined(), "parameter ", name, ": added after flattening");
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

namespace {
constexpr int64_t kFlatAlign = 64;  // elements: 256 bytes of F32
int64_t round_up(int64_t n) { return (n + kFlatAlign - 1) / kFlatAlign * kFlatAlign; }
// A view of `flat` at element offset `off` with `shape`.
Tensor flat_view(const Tensor& flat, int64_t off, const Shape& shape) {
  Tensor view = flat;
  view.shape = shape;
  view.data = static_cast<char*>(flat.data) + static_cast<size_t>(off) * dtype_size(flat.dtype);
  return view;
}
}  // namespace

int64_t ParamSet::flat_numel() const {
  int64_t total = 0;
  for (const auto& p : params_) total += round_up(p.master.numel());
  return total;
}

void ParamSet::set_offsets() {
  int64_t off = 0;
  for (auto& p : params_) {
    p.flat_offset = off;
    off += round_up(p.master.numel());
  }
}

const Tensor& ParamSet::flatten_grads(Context& ctx, int64_t capacity) {
  if (flat_grad_.defined()) {
    DFLASH_CHECK(capacity <= flat_grad_.numel(), "flatten_grads: already flat with ", flat_grad_.numel(),
                 " elements, ", capacity, " asked");
    return flat_grad_;
  }
  set_offsets();
  Tensor flat = ctx.zeros(ctx.param_dtype(), {std::max(flat_numel(), capacity)});
  for (auto& p : params_) {
    Tensor view = flat_view(flat, p.flat_offset, p.shape);
    ctx.copy(view, p.grad);
    p.grad = view;
  }
  flat_grad_ = flat;
  return flat_grad_;
}

const Tensor& ParamSet::flatten_masters(Context& ctx, int64_t capacity) {
  if (flat_master_.defined()) {
    DFLASH_CHECK(capacity <= flat_master_.numel(), "flatten_masters: already flat with ", flat_master_.numel(),
                 " elements, ", capacity, " asked");
    return flat_master_;
  }
  set_offsets();
  Tensor flat = ctx.zeros(ctx.param_dtype(), {std::max(flat_numel(), capacity)});
  for (auto& p : params_) {
    Tensor view = flat_view(flat, p.flat_offset, p.shape);
    ctx.copy(view, p.master);
    if (p.compute.data == p.master.data) p.compute = view;
    p.master = view;
  }
  flat_master_ = flat;
  return flat_master_;
}

void ParamSet::init_moments(Context& ctx) {
  for (auto& p : params_) {
    if (!p.m.defined()) p.m = ctx.zeros(ctx.param_dtype(), p.shape);
    if (!p.v.defined()) p.v = ctx.zeros(ctx.param_dtype(), p.shape);
  }
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
