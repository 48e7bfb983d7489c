// model/target/weights.h — where a target's tensors come from: a Hugging Face checkpoint (names of the family,
// io/model_family.h) or random values (benchmarks at published shapes without a download). The mixers load their
// weights through this one interface, so a loaded and a random target are built by the same code.
// defines: WeightSource, Mxfp4Rows, Int4Linear, CheckpointWeights, RandomTargetWeights
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "backend/context.h"
#include "io/model_family.h"
#include "io/safetensors.h"

namespace dflash {

// MXFP4 rows on the host in the layout of backend/context.h MoeWeights: blocks U8 [E, N, K/2], scales U8 [E, N, K/32].
struct Mxfp4Rows {
  Tensor blocks, scales;
};

// One INT4 linear [N, K] of a checkpoint (io/hf_config.h Int4Format) as host tensors: codes U8 [N, K/2] (the
// weight_packed words' bytes, a view of the file) and scales BF16 [N, K/group], in the layout of backend/context.h
// MoeWeights.
struct Int4Linear {
  Tensor codes, scales;
  int64_t group = 0;
};

// Every tensor comes back on the context's device in its compute dtype. `name` is the Hugging Face name (the
// random source ignores it, but draws its values in call order: the order of the calls is part of a random
// target's identity).
class WeightSource {
 public:
  virtual ~WeightSource() = default;
  virtual Context& ctx() = 0;
  // A weight matrix or vector of `shape` (random: N(0, 0.02)), plain: an FP8 tensor is dequantised on the host (for
  // the layouts a mixer rearranges). Throws Error naming the file and tensor when missing or of another shape.
  virtual Tensor matrix(const std::string& name, const Shape& shape) = 0;
  // INT4 linears stored as compressed-tensors' pack-quantized (`name` absent, its weight_packed / weight_scale present:
  // io/hf_config.h Int4Format) come back dequantised by matrix(), linear(), stack_experts() and host_f32().
  // A linear layer's weight `name` ("...q_proj.weight") of `shape` [N, K]. FP8 in the checkpoint (F8_E4M3 beside
  // its scale tensor, io/hf_config.h Fp8Format): kept FP8 on the device (backend/context.h LinearWeight); any other
  // dtype: plain, as matrix(). Random: drawn as matrix(), then quantized by Context::quantize_fp8 in the config's
  // blocks when the source was made for an FP8 target. Throws Error naming the tensor (FP8 without its scale, a
  // scale of another shape, FP8 where config.json declares none) and as matrix().
  virtual LinearWeight linear(const std::string& name, const Shape& shape) = 0;
  // A norm weight (random: ones).
  virtual Tensor norm(const std::string& name, const Shape& shape) = 0;
  // Whether the checkpoint has `name` (random: false).
  virtual bool has(const std::string& name) const = 0;
  // Whether the values are drawn (RandomTargetWeights) rather than read: a random target's gpt-oss experts are drawn
  // straight in the device layout (model/target/mlp.cpp), with no host transpose of ~100 GB at 120b's shapes.
  virtual bool random() const { return false; }
  // Experts stacked along a new first dim: [E, rows, cols] from per-expert tensors name_of(e) [rows, cols] placed at
  // rows row0 .. row0 + rows of each expert's block of `block_rows` rows (the others are filled by further calls).
  // dst must be [E, block_rows, cols] on the context's device.
  virtual void stack_experts(const Tensor& dst, int64_t row0, const std::string& prefix, const std::string& suffix,
                             const Shape& one) = 0;
  // A small tensor kept in F32 on the device whatever the compute dtype (attention sinks; random: N(0, 0.02)).
  virtual Tensor f32(const std::string& name, const Shape& shape) = 0;
  // A tensor as an F32 HOST tensor of `shape`, for layouts a mixer rearranges before the upload (gpt-oss's fused
  // experts; random: N(0, 0.02)). Errors as matrix().
  virtual Tensor host_f32(const std::string& name, const Shape& shape) = 0;
  // MXFP4 rows [E, N, K] stored as name + "_blocks" U8 [E, N, K/32, 16] and name + "_scales" U8 [E, N, K/32] (a
  // published gpt-oss checkpoint), on the host (random: uniform e2m1 codes under the scale 2^-7, values of standard
  // deviation about 0.023). Throws Error naming the tensor when missing or of another dtype or shape.
  virtual Mxfp4Rows mxfp4(const std::string& name, int64_t E, int64_t N, int64_t K) = 0;
  // Experts stacked as INT4 rows, as stack_experts() but kept 4-bit: dst.w U8 [E, block_rows, K/2] and dst.scales BF16
  // [E, block_rows, K/g] on the context's device (g = dst.int4_group); rows row0 .. row0 + one[0] of each expert's
  // block from the pack-quantized linear prefix + "{e}." + suffix (suffix "gate_proj.weight": its weight_packed,
  // weight_scale). Random: uniform codes under the scale 2^-7 (values of standard deviation about 0.036). Throws Error
  // naming the tensor when missing, of another shape or dtype, or of another group size.
  virtual void stack_int4_experts(const MoeWeights& dst, int64_t row0, const std::string& prefix,
                                  const std::string& suffix, const Shape& one) = 0;
  // The FP8 weight `name` [N, K] with its scales as host tensors when the checkpoint stores it in FP8, else nullopt
  // (random: nullopt). Errors as linear().
  virtual std::optional<LinearWeight> fp8_host_if(const std::string& name, const Shape& shape) { return std::nullopt; }
};

// A checkpoint directory (config.json + *.safetensors or model.safetensors.index.json); `fp8` = its config's FP8
// format when quantization_config declares one (ModelConfig::linear_format FP8), else null; `int4` its INT4 format
// (ModelConfig::int4 when declared), else null.
class CheckpointWeights final : public WeightSource {
 public:
  CheckpointWeights(const std::string& dir, Context& ctx, const Fp8Format* fp8 = nullptr,
                    const Int4Format* int4 = nullptr)
      : ws_(WeightStore::open(dir)), ctx_(ctx), fp8_(fp8 ? std::optional<Fp8Format>(*fp8) : std::nullopt),
        int4_(int4 && int4->declared ? std::optional<Int4Format>(*int4) : std::nullopt) {}
  Context& ctx() override { return ctx_; }
  Tensor matrix(const std::string& name, const Shape& shape) override {
    return ctx_.to_device(host_value(name, shape), ctx_.compute_dtype());
  }
  LinearWeight linear(const std::string& name, const Shape& shape) override;
  Tensor norm(const std::string& name, const Shape& shape) override { return matrix(name, shape); }
  bool has(const std::string& name) const override { return ws_.has(name); }
  void stack_experts(const Tensor& dst, int64_t row0, const std::string& prefix, const std::string& suffix,
                     const Shape& one) override;
  Tensor f32(const std::string& name, const Shape& shape) override {
    return ctx_.to_device(host_value(name, shape), DType::F32);
  }
  Tensor host_f32(const std::string& name, const Shape& shape) override { return host_value(name, shape); }
  Mxfp4Rows mxfp4(const std::string& name, int64_t E, int64_t N, int64_t K) override;
  void stack_int4_experts(const MoeWeights& dst, int64_t row0, const std::string& prefix, const std::string& suffix,
                          const Shape& one) override;
  const WeightStore& store() const { return ws_; }
  // The INT4 linear `name` ("...weight", absent itself) of `shape` [N, K] from its weight_packed I32 [N, K/8] and
  // weight_scale [N, K/g] (BF16 as stored; F16 / F32 converted, refused unless exact in BF16), checked against the
  // config's format (K % 8 == 0, g dividing K). nullopt when the checkpoint has no `<base>.weight_packed`. Throws
  // Error naming the tensor (the scale missing or of another shape, weight_shape disagreeing, INT4 where config.json
  // declares no pack-quantized quantization_config).
  std::optional<Int4Linear> int4_host(const std::string& name, const Shape& shape) const;
  // The FP8 weight `name` [N, K] and its scale as host tensors (views of the file), checked against the config's
  // format. Throws Error as linear().
  LinearWeight fp8_host(const std::string& name, const Shape& shape) const;
  std::optional<LinearWeight> fp8_host_if(const std::string& name, const Shape& shape) override {
    if (!ws_.has(name) || ws_.info(name).dtype != DType::F8E4M3) return std::nullopt;
    return fp8_host(name, shape);
  }

 private:
  Tensor host_value(const std::string& name, const Shape& shape) const;  // F32 host, FP8 and INT4 dequantised
  WeightStore ws_;
  Context& ctx_;
  std::optional<Fp8Format> fp8_;
  std::optional<Int4Format> int4_;
};

// Random values drawn on the device by fill_normal(seed, RandomTarget, stream k), k counting the calls from
// `first_stream`: identical on every device and backend.
// `fp8`: the linears are quantized in its blocks (a random FP8 target), else plain.
class RandomTargetWeights final : public WeightSource {
 public:
  RandomTargetWeights(Context& ctx, uint64_t seed, uint64_t first_stream = 0, const Fp8Format* fp8 = nullptr)
      : ctx_(ctx), seed_(seed), k_(first_stream), fp8_(fp8 ? std::optional<Fp8Format>(*fp8) : std::nullopt) {}
  bool random() const override { return true; }
  Context& ctx() override { return ctx_; }
  Tensor matrix(const std::string&, const Shape& shape) override;
  LinearWeight linear(const std::string& name, const Shape& shape) override;
  Tensor norm(const std::string&, const Shape& shape) override;
  bool has(const std::string&) const override { return false; }
  void stack_experts(const Tensor& dst, int64_t row0, const std::string&, const std::string&, const Shape& one) override;
  Tensor f32(const std::string& name, const Shape& shape) override;
  Tensor host_f32(const std::string& name, const Shape& shape) override;
  Mxfp4Rows mxfp4(const std::string& name, int64_t E, int64_t N, int64_t K) override;
  void stack_int4_experts(const MoeWeights& dst, int64_t row0, const std::string& prefix, const std::string& suffix,
                          const Shape& one) override;

 private:
  Context& ctx_;
  uint64_t seed_, k_;
  std::optional<Fp8Format> fp8_;
};

}  // namespace dflash
