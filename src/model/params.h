// model/params.h — named trainable tensors with their gradient and AdamW moments.
// defines: Param, ParamSet
#pragma once
#include <string>
#include <vector>

#include "backend/context.h"

namespace dflash {

struct Param {
  std::string name;  // export name (spec 3), e.g. "layers.0.self_attn.q_proj.weight"
  Shape shape;
  Tensor master;     // param_dtype (F32): the weights the optimizer updates
  Tensor compute;    // compute_dtype copy used by the ops (the same tensor as master when dtypes agree)
  Tensor grad;       // param_dtype, accumulated over a step
  Tensor m, v;       // AdamW moments, param_dtype
};

// Owned by one worker's Context. Order is fixed (the order parameters were added), which fixes checkpoint and
// gradient-norm order.
class ParamSet {
 public:
  // Adds a parameter with master weights copied from `init` (a host tensor of the given shape, any float dtype).
  Param& add(Context& ctx, const std::string& name, const Tensor& init);
  // The same for a master tensor already on ctx's device in ctx.param_dtype() (e.g. filled by ctx.fill_normal),
  // which the parameter takes over without a copy.
  Param& adopt(Context& ctx, const std::string& name, Tensor master);
  std::vector<Param>& all() { return params_; }
  const std::vector<Param>& all() const { return params_; }
  Param& get(const std::string& name);
  const Param& get(const std::string& name) const;
  int64_t numel() const;
  void zero_grad(Context& ctx);
  // Moves every gradient into one contiguous param_dtype buffer (each parameter's grad becomes a view of it, at an
  // offset rounded up to 64 elements so every view stays 256-byte aligned; the gaps stay zero), so that one
  // collective sums all gradients. Call before training (the current gradients are copied). Returns the buffer.
  const Tensor& flatten_grads(Context& ctx);
  const Tensor& flat_grad() const { return flat_grad_; }
  // Copies master -> compute for every parameter (after loading master weights).
  void sync_compute(Context& ctx);

 private:
  std::vector<Param> params_;
  Tensor flat_grad_;  // defined after flatten_grads()
};

}  // namespace dflash

namespace dflash {
class WeightStore;
// Sets every parameter's master weights from `ws` (tensor names = parameter names; shapes must match; any float
// dtype is converted) and refreshes the compute copies. Error names the missing tensor or the shape mismatch.
void load_params(Context& ctx, ParamSet& ps, const WeightStore& ws);
}  // namespace dflash
