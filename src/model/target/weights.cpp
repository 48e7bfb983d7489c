// model/target/weights.cpp — the two weight sources of model/target/weights.h.
#include "model/target/weights.h"

#include <algorithm>

namespace dflash {

void CheckpointWeights::stack_experts(const Tensor& dst, int64_t row0, const std::string& prefix,
                                      const std::string& suffix, const Shape& one) {
  const int64_t E = dst.shape[0], block = dst.shape[1], rows = one[0];
  DFLASH_CHECK(one.size() == 2 && one[1] == dst.shape[2] && row0 + rows <= block, "stack_experts: [", rows, ", ",
               one[1], "] at row ", row0, " does not fit a block of [", block, ", ", dst.shape[2], "]");
  const Tensor flat = dst.reshape({E * block, dst.shape[2]});
  for (int64_t e = 0; e < E; ++e) {
    const Tensor host = host_value(cat(prefix, e, ".", suffix), one);  // F32, converted by the copy
    ctx_.copy(flat.slice(e * block + row0, e * block + row0 + rows), host);
  }
}

Tensor CheckpointWeights::host_value(const std::string& name, const Shape& shape) const {
  if (ws_.has(name) && ws_.info(name).dtype == DType::F8E4M3) return fp8_dequantize(fp8_host(name, shape));
  return ws_.f32(name, shape);
}

LinearWeight CheckpointWeights::fp8_host(const std::string& name, const Shape& shape) const {
  const TensorInfo& i = ws_.info(name);
  DFLASH_CHECK(i.shape == shape && shape.size() == 2, ws_.source(), ": tensor '", name, "': shape ",
               shape_str(i.shape), ", expected ", shape_str(shape));
  DFLASH_CHECK(fp8_.has_value(), ws_.source(), ": tensor '", name, "' is F8_E4M3 but config.json declares no FP8 "
               "quantization_config (quant_method \"fp8\" or compressed-tensors \"float-quantized\")");
  const int64_t N = shape[0], K = shape[1];
  const std::string base = name.ends_with("weight") ? name.substr(0, name.size() - 6) : name + ".";
  const std::string sname = base + fp8_->scale_name;
  DFLASH_CHECK(ws_.has(sname), ws_.source(), ": tensor '", name, "' is F8_E4M3 but its scale '", sname,
               "' is missing (", fp8_->method, " keeps one beside every FP8 weight)");
  LinearWeight w;
  w.block_n = fp8_->rows_per_scale(N);
  w.block_k = fp8_->cols_per_scale(K);
  const Shape grid{(N + w.block_n - 1) / w.block_n, (K + w.block_k - 1) / w.block_k};
  const TensorInfo& si = ws_.info(sname);
  // per tensor: [] or [1] are the same one value; per channel: [N, 1] or [N]
  const bool same = si.shape == grid || (grid == Shape{1, 1} && (si.shape.empty() || si.shape == Shape{1})) ||
                    (grid[1] == 1 && si.shape == Shape{grid[0]});
  DFLASH_CHECK(same, ws_.source(), ": tensor '", sname, "': shape ", shape_str(si.shape), ", expected ",
               shape_str(grid), " (", fp8_->granularity(), " scales of '", name, "' ", shape_str(shape), ")");
  w.w = ws_.view(name);
  w.scale = ws_.f32(sname).reshape(grid);
  return w;
}

LinearWeight CheckpointWeights::linear(const std::string& name, const Shape& shape) {
  if (!ws_.has(name) || ws_.info(name).dtype != DType::F8E4M3) return matrix(name, shape);
  const LinearWeight h = fp8_host(name, shape);
  LinearWeight w = h;
  w.w = ctx_.to_device(h.w);
  w.scale = ctx_.to_device(h.scale);
  return w;
}

Mxfp4Rows CheckpointWeights::mxfp4(const std::string& name, int64_t E, int64_t N, int64_t K) {
  DFLASH_CHECK(K % 32 == 0, name, ": MXFP4 rows of ", K, " elements (not a multiple of 32)");
  auto raw = [&](const std::string& n, const Shape& want) {
    const TensorInfo& i = ws_.info(n);  // throws naming the tensor and the directory when missing
    DFLASH_CHECK(i.dtype == DType::U8 && i.shape == want, ws_.source(), ": ", n, " is ", dtype_name(i.dtype), " ",
                 shape_str(i.shape), ", expected U8 ", shape_str(want), " (MXFP4)");
    return ws_.view(n);
  };
  Mxfp4Rows r;
  r.blocks = raw(name + "_blocks", {E, N, K / 32, 16}).reshape({E, N, K / 2});
  r.scales = raw(name + "_scales", {E, N, K / 32});
  return r;
}

Tensor RandomTargetWeights::matrix(const std::string&, const Shape& shape) {
  Tensor t = ctx_.empty(ctx_.param_dtype(), shape);
  ctx_.fill_normal(t, 0.02, seed_, RngPurpose::RandomTarget, k_++);
  return ctx_.to_device(t, ctx_.compute_dtype());
}

LinearWeight RandomTargetWeights::linear(const std::string& name, const Shape& shape) {
  const Tensor w = matrix(name, shape);
  if (!fp8_) return w;
  return ctx_.quantize_fp8(w, fp8_->rows_per_scale(shape[0]), fp8_->cols_per_scale(shape[1]));
}

Tensor RandomTargetWeights::f32(const std::string&, const Shape& shape) {
  Tensor t = ctx_.empty(ctx_.param_dtype(), shape);
  ctx_.fill_normal(t, 0.02, seed_, RngPurpose::RandomTarget, k_++);
  return ctx_.to_device(t, DType::F32);
}

Tensor RandomTargetWeights::host_f32(const std::string& name, const Shape& shape) {
  return cpu_to_f32(ctx_.to_host(matrix(name, shape)));  // (F64 on cpu64)
}

Mxfp4Rows RandomTargetWeights::mxfp4(const std::string&, int64_t E, int64_t N, int64_t K) {
  Mxfp4Rows r{cpu_empty(DType::U8, {E, N, K / 2}), cpu_empty(DType::U8, {E, N, K / 32})};
  Rng rng(seed_, RngPurpose::RandomTarget, k_++);
  // at most kDrawn experts' bytes are drawn, the others repeat them (120b's shapes: 1.6 GB per layer would take ~1 s
  // of the host's time each; a benchmark's speed does not depend on which bytes the experts hold)
  constexpr int64_t kDrawn = 4;
  uint8_t* b = r.blocks.ptr<uint8_t>();
  const int64_t per = N * (K / 2), drawn = std::min(E, kDrawn) * per;
  for (int64_t i = 0; i < drawn; i += 4) {
    const uint32_t v = rng.next_u32();
    for (int64_t j = 0; j < 4 && i + j < drawn; ++j) b[i + j] = static_cast<uint8_t>(v >> (8 * j));
  }
  for (int64_t i = drawn; i < r.blocks.numel(); i += drawn)
    std::copy_n(b, std::min(drawn, r.blocks.numel() - i), b + i);
  std::fill_n(r.scales.ptr<uint8_t>(), r.scales.numel(), uint8_t{120});  // 2^-7
  return r;
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
