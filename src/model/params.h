// model/params.h — named trainable tensors with their gradient and AdamW moments.
// defines: Param, ParamSet
//
// The flat layout: parameter k (in the order added) starts at element flat_offset_k = sum over j < k of
// round_up(numel_j, 64), so every parameter's view is 256-byte aligned; the gaps and any tail stay zero.
// flatten_grads() puts every gradient in one buffer of that layout (one collective sums them all);
// flatten_masters() does the same for the F32 master weights (one all-gather refreshes them all: the sharded
// optimizer, train/optimizer.h). Both take a capacity, so the buffer can be padded to what the shards need.
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
  Tensor m, v;       // AdamW moments, param_dtype; allocated by init_moments() (or by the first optimizer_step),
                     // never with a sharded optimizer (train/optimizer.h OptimShard holds the moments then)
  int64_t flat_offset = -1;  // element offset in the flat layout (set by flatten_grads / flatten_masters)
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
  // Elements of the flat layout (the sum of the rounded sizes): at least numel().
  int64_t flat_numel() const;
  void zero_grad(Context& ctx);
  // Moves every gradient into one contiguous param_dtype buffer [max(flat_numel(), capacity)] (each parameter's
  // grad becomes a view of it at its flat_offset; the gaps stay zero), so that one collective sums all gradients.
  // Call before training (the current gradients are copied). Returns the buffer. A second call returns the first
  // buffer (capacity must not grow).
  const Tensor& flatten_grads(Context& ctx, int64_t capacity = 0);
  const Tensor& flat_grad() const { return flat_grad_; }
  // The same for the master weights (and the compute copies where they are the masters): one param_dtype buffer
  // [max(flat_numel(), capacity)] of the same layout, gaps zero.
  const Tensor& flatten_masters(Context& ctx, int64_t capacity = 0);
  const Tensor& flat_master() const { return flat_master_; }
  // Allocates the per-parameter AdamW moments (zeros) where they are not yet allocated.
  void init_moments(Context& ctx);
  // Copies master -> compute for every parameter (after loading master weights).
  void sync_compute(Context& ctx);

 private:
  void set_offsets();
  std::vector<Param> params_;
  Tensor flat_grad_;    // defined after flatten_grads()
  Tensor flat_master_;  // defined after flatten_masters()
};

}  // namespace dflash

namespace dflash {
class WeightStore;
// Sets every parameter's master weights from `ws` (tensor names = parameter names; shapes must match; any float
// dtype is converted) and refreshes the compute copies. Error names the missing tensor or the shape mismatch.
void load_params(Context& ctx, ParamSet& ps, const WeightStore& ws);
}  // namespace dflash
