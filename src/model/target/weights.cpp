// model/target/weights.cpp — the two weight sources of model/target/weights.h.
#include "model/target/weights.h"

namespace dflash {

void CheckpointWeights::stack_experts(const Tensor& dst, int64_t row0, const std::string& prefix,
                                      const std::string& suffix, const Shape& one) {
  const int64_t E = dst.shape[0], block = dst.shape[1], rows = one[0];
  DFLASH_CHECK(one.size() == 2 && one[1] == dst.shape[2] && row0 + rows <= block, "stack_experts: [", rows, ", ",
               one[1], "] at row ", row0, " does not fit a block of [", block, ", ", dst.shape[2], "]");
  const Tensor flat = dst.reshape({E * block, dst.shape[2]});
  for (int64_t e = 0; e < E; ++e) {
    const Tensor host = ws_.f32(cat(prefix, e, ".", suffix), one);  // F32, converted by the copy
    ctx_.copy(flat.slice(e * block + row0, e * block + row0 + rows), host);
  }
}

Tensor RandomTargetWeights::matrix(const std::string&, const Shape& shape) {
  Tensor t = ctx_.empty(ctx_.param_dtype(), shape);
  ctx_.fill_normal(t, 0.02, seed_, RngPurpose::RandomTarget, k_++);
  return ctx_.to_device(t, ctx_.compute_dtype());
}

Tensor RandomTargetWeights::norm(const std::string&, const Shape& shape) {
  ++k_;
  Tensor h = cpu_empty(DType::F32, shape);
  for (int64_t i = 0; i < h.numel(); ++i) h.ptr<float>()[i] = 1.0f;
  return ctx_.to_device(h, ctx_.compute_dtype());
}

void RandomTargetWeights::stack_experts(const Tensor& dst, int64_t row0, const std::string&, const std::string&,
                                        const Shape& one) {
  const int64_t E = dst.shape[0], block = dst.shape[1], rows = one[0];
  const Tensor flat = dst.reshape({E * block, dst.shape[2]});
  Tensor t = ctx_.empty(ctx_.param_dtype(), {E, rows, one[1]});  // one stream for all experts of this projection
  ctx_.fill_normal(t, 0.02, seed_, RngPurpose::RandomTarget, k_++);
  const Tensor tc = ctx_.to_device(t, ctx_.compute_dtype());
  for (int64_t e = 0; e < E; ++e)
    ctx_.copy(flat.slice(e * block + row0, e * block + row0 + rows), tc.reshape({E * rows, one[1]}).slice(e * rows, (e + 1) * rows));
}

}  // namespace dflash
