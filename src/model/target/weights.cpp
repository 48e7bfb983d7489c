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
  if (!ws_.has(name))
    if (const std::optional<Int4Linear> q = int4_host(name, shape)) return int4_dequantize(q->codes, q->scales, q->group);
  return ws_.f32(name, shape);
}

std::optional<Int4Linear> CheckpointWeights::int4_host(const std::string& name, const Shape& shape) const {
  if (!name.ends_with("weight")) return std::nullopt;
  const std::string base = name.substr(0, name.size() - 6);
  const std::string pname = base + "weight_packed", sname = base + "weight_scale";
  if (!ws_.has(pname)) return std::nullopt;
  DFLASH_CHECK(int4_.has_value(), ws_.source(), ": tensor '", pname, "' is INT4 (compressed-tensors pack-quantized) "
               "but config.json declares no quantization_config with format \"pack-quantized\"");
  DFLASH_CHECK(shape.size() == 2, ws_.source(), ": tensor '", pname, "': an INT4 linear must be 2-D, expected ",
               shape_str(shape));
  const int64_t N = shape[0], K = shape[1], g = int4_->group_of(K);
  DFLASH_CHECK(K % 8 == 0 && K % g == 0, ws_.source(), ": tensor '", pname, "': ", K, " columns in groups of ", g,
               " (INT4 rows are read when K is a multiple of 8 and of the group size)");
  const TensorInfo& pi = ws_.info(pname);
  DFLASH_CHECK(pi.dtype == DType::I32 && pi.shape == (Shape{N, K / 8}), ws_.source(), ": tensor '", pname, "' is ",
               dtype_name(pi.dtype), " ", shape_str(pi.shape), ", expected I32 ", shape_str({N, K / 8}),
               " (8 INT4 values per word of ", name, " ", shape_str(shape), ")");
  if (ws_.has(base + "weight_shape")) {
    const Tensor ts = ws_.view(base + "weight_shape");
    const bool same = ts.dtype == DType::I32 && ts.numel() == 2 && ts.ptr<int32_t>()[0] == N && ts.ptr<int32_t>()[1] == K;
    DFLASH_CHECK(same, ws_.source(), ": tensor '", base, "weight_shape' does not say ", shape_str(shape));
  }
  DFLASH_CHECK(!ws_.has(base + "weight_zero_point") && !ws_.has(base + "weight_g_idx"), ws_.source(), ": tensor '",
               pname, "' comes with a zero point or g_idx (asymmetric or activation-ordered INT4 is not supported)");
  DFLASH_CHECK(ws_.has(sname), ws_.source(), ": tensor '", pname, "' is INT4 but its scale '", sname, "' is missing");
  const TensorInfo& si = ws_.info(sname);
  DFLASH_CHECK(si.shape == (Shape{N, K / g}), ws_.source(), ": tensor '", sname, "': shape ", shape_str(si.shape),
               ", expected ", shape_str({N, K / g}), " (one scale per ", g, " columns of ", name, ")");
  Int4Linear q;
  q.group = g;
  q.codes = ws_.view(pname);
  q.codes.dtype = DType::U8;  // the little-endian words' bytes: element 2j in the low nibble of byte j
  q.codes.shape = {N, K / 2};
  if (si.dtype == DType::BF16) {
    q.scales = ws_.view(sname);
  } else {
    const Tensor f = ws_.f32(sname);
    q.scales = cpu_to_bf16(f);
    const std::vector<float> back = to_f32_vector(q.scales);
    for (size_t i = 0; i < back.size(); ++i)
      DFLASH_CHECK(back[i] == f.ptr<float>()[i], ws_.source(), ": tensor '", sname, "': ", dtype_name(si.dtype),
                   " scale ", f.ptr<float>()[i], " is not a bf16 value (INT4 scales are kept in bf16)");
  }
  return q;
}

void CheckpointWeights::stack_int4_experts(const MoeWeights& dst, int64_t row0, const std::string& prefix,
                                           const std::string& suffix, const Shape& one) {
  const int64_t E = dst.w.shape[0], block = dst.w.shape[1], rows = one[0], K = one[1];
  DFLASH_CHECK(one.size() == 2 && dst.w.shape[2] == K / 2 && row0 + rows <= block, "stack_int4_experts: [", rows, ", ",
               K, "] at row ", row0, " does not fit a block of ", shape_str(dst.w.shape));
  const Tensor codes = dst.w.reshape({E * block, K / 2});
  const Tensor scales = dst.scales.reshape({E * block, dst.scales.shape[2]});
  for (int64_t e = 0; e < E; ++e) {
    const std::string name = cat(prefix, e, ".", suffix);
    const std::optional<Int4Linear> q = int4_host(name, one);
    DFLASH_CHECK(q.has_value(), ws_.source(), ": expert weight '", name, "' is not INT4 (its weight_packed is missing) "
                 "but config.json's quantization_config covers the experts");
    DFLASH_CHECK(q->group == dst.int4_group, ws_.source(), ": ", name, ": INT4 groups of ", q->group, ", expected ",
                 dst.int4_group);
    ctx_.copy(codes.slice(e * block + row0, e * block + row0 + rows), q->codes);
    ctx_.copy(scales.slice(e * block + row0, e * block + row0 + rows), q->scales);
  }
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

void RandomTargetWeights::stack_int4_experts(const MoeWeights& dst, int64_t row0, const std::string&,
                                             const std::string&, const Shape& one) {
  const int64_t E = dst.w.shape[0], block = dst.w.shape[1], rows = one[0], K = one[1], ng = dst.scales.shape[2];
  Rng rng(seed_, RngPurpose::RandomTarget, k_++);
  // one expert's codes drawn, repeated for the others (as mxfp4(): a benchmark's speed does not depend on them)
  Tensor c = cpu_empty(DType::U8, {rows, K / 2});
  uint8_t* b = c.ptr<uint8_t>();
  for (int64_t i = 0; i < c.numel(); i += 4) {
    const uint32_t v = rng.next_u32();
    for (int64_t j = 0; j < 4 && i + j < c.numel(); ++j) b[i + j] = static_cast<uint8_t>(v >> (8 * j));
  }
  Tensor s = cpu_empty(DType::BF16, {rows, ng});
  std::fill_n(s.ptr<uint16_t>(), s.numel(), uint16_t{0x3C00});  // 2^-7
  const Tensor codes = dst.w.reshape({E * block, K / 2}), scales = dst.scales.reshape({E * block, ng});
  for (int64_t e = 0; e < E; ++e) {
    ctx_.copy(codes.slice(e * block + row0, e * block + row0 + rows), c);
    ctx_.copy(scales.slice(e * block + row0, e * block + row0 + rows), s);
  }
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
