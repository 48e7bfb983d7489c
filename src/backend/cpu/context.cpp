// backend/cpu/context.cpp — CpuContext: the CPU Context and its single dispatch point to the op files.
#include <algorithm>
#include <chrono>
#include <cstring>

#include "backend/cpu/ops.h"

namespace dflash {

namespace {

// t (x's size) viewed as x's rows [R, D] by token, [R / heads, heads, D]: the layout cpu::rope takes (Context::rmsnorm
// checked the heads and positions).
Tensor rope_rows(const Tensor& t, const Tensor& x, const RopeArgs& r) {
  return t.reshape({x.rows() / r.heads, r.heads, x.dim(-1)});
}

class CpuContext final : public Context {
 public:
  CpuContext(const ContextOptions& o, DType dt)
      : Context(o.profile_ops), pool_(o.threads), limit_(o.memory_limit_bytes), dt_(dt) {
    cpu::init_cpu_backend();
  }
  Device device() const override { return Device::CPU; }
  DType compute_dtype() const override { return dt_; }
  DType param_dtype() const override { return dt_; }
  std::string describe() const override { return cat(dt_ == DType::F64 ? "cpu64" : "cpu", " (", pool_.size(), " threads)"); }

  Tensor empty(DType t, Shape s) override { return cpu_empty(t, std::move(s)); }
  void zero(const Tensor& t) override {
    DFLASH_CHECK(t.device == Device::CPU, "cpu context: zero() of a ", device_name(t.device), " tensor");
    if (t.nbytes()) std::memset(t.data, 0, t.nbytes());
  }
  void copy(const Tensor& dst, const Tensor& src) override {
    DFLASH_CHECK(dst.device == Device::CPU && src.device == Device::CPU, "cpu context: copy between devices");
    DFLASH_CHECK(dst.numel() == src.numel(), "copy: ", shape_str(src.shape), " -> ", shape_str(dst.shape));
    if (dst.dtype == src.dtype) {
      if (dst.data != src.data && src.nbytes()) std::memmove(dst.data, src.data, src.nbytes());
    } else if (dst.dtype == DType::F32 && (src.dtype == DType::BF16 || src.dtype == DType::F16 || src.dtype == DType::F64)) {
      std::vector<float> v = to_f32_vector(src);
      std::memcpy(dst.data, v.data(), v.size() * 4);
    } else if (dst.dtype == DType::F64 && src.dtype != DType::F64) {
      std::vector<float> v = to_f32_vector(src);
      double* d = dst.ptr<double>();
      for (size_t i = 0; i < v.size(); ++i) d[i] = v[i];
    } else if (dst.dtype == DType::BF16 && src.dtype == DType::F32) {
      const float* s = src.ptr<float>();
      uint16_t* d = dst.ptr<uint16_t>();
      for (int64_t i = 0; i < src.numel(); ++i) d[i] = f32_to_bf16(s[i]);
    } else {
      DFLASH_FAIL("copy: unsupported conversion ", dtype_name(src.dtype), " -> ", dtype_name(dst.dtype));
    }
  }
  void synchronize() override {}
  // Ops are synchronous: an event is complete when recorded, and waiting orders nothing.
  std::unique_ptr<Event> create_event() override { return std::make_unique<Event>(); }
  void record(Event&) override {}
  void wait(const Event&) override {}
  void host_wait(const Event&) override {}
  MemoryStats memory() const override { return {0, 0, limit_}; }
  void reset_peak_memory() override {}

  // ---- the ops' computation (their arguments checked by Context's public ops) -----------------------------------
 protected:
  void linear_impl(const Tensor& x, const LinearWeight& w, const Tensor* b, const Tensor& y, float beta,
                   const Tensor* c) override {
    if (!w.fp8()) return cpu::linear(pool_, x, w.w, b, y, beta, c);
    const Tensor wd = fp8_dequantize(w);  // the reference: the dequantised weight, x unquantized
    cpu::linear(pool_, x, to_device(wd, dt_), b, y, beta, c);
  }
  Tensor dequantize_fp8_impl(const LinearWeight& w) override { return to_device(fp8_dequantize(w), dt_); }
  LinearWeight quantize_fp8_impl(const Tensor& w, int64_t block_n, int64_t block_k) override {
    return cpu::fp8_quantize(w, block_n, block_k);
  }
  void linear_dx_impl(const Tensor& dy, const Tensor& w, const Tensor& dx, float beta) override {
    cpu::linear_dx(pool_, dy, w, dx, beta);
  }
  void linear_dw_impl(const Tensor& dy, const Tensor& x, const Tensor& dw, const Tensor* db) override {
    cpu::linear_dw(pool_, dy, x, dw, db);
  }
  // With rope: the composition, rmsnorm then rope on y (the backward: rope inverse on a copy of dy, then the
  // backward), on the rows viewed as [T, heads, D].
  void rmsnorm_impl(const Tensor& x, const Tensor& w, float eps, const Tensor& y, const Tensor& rstd,
                    const RopeArgs* rope) override {
    cpu::rmsnorm(pool_, x, w, eps, y, rstd);
    if (rope) cpu::rope(pool_, rope_rows(y, x, *rope), rope->pos, rope->inv_freq, false);
  }
  void rmsnorm_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dx,
                             const Tensor& dw, float beta, const RopeArgs* rope) override {
    if (!rope) return cpu::rmsnorm_backward(pool_, dy, x, w, rstd, dx, dw, beta);
    const Tensor g = cpu_clone(dy);
    cpu::rope(pool_, rope_rows(g, x, *rope), rope->pos, rope->inv_freq, true);
    cpu::rmsnorm_backward(pool_, g, x, w, rstd, dx, dw, beta);
  }
  void rope_impl(const Tensor& x, const Tensor& pos, const Tensor& inv_freq, bool inverse) override {
    cpu::rope(pool_, x, pos, inv_freq, inverse);
  }
  void silu_mul_impl(const Tensor& g, const Tensor& u, const Tensor& out) override { cpu::silu_mul(pool_, g, u, out); }
  void gelu_tanh_mul_impl(const Tensor& g, const Tensor& u, const Tensor& out) override {
    cpu::gelu_tanh_mul(pool_, g, u, out);
  }
  void softcap_impl(const Tensor& x, float cap) override { cpu::softcap(pool_, x, cap); }
  void silu_mul_backward_impl(const Tensor& dout, const Tensor& g, const Tensor& u, const Tensor& dg,
                              const Tensor& du) override {
    cpu::silu_mul_backward(pool_, dout, g, u, dg, du);
  }
  void embedding_impl(const Tensor& table, const Tensor& ids, const Tensor& out) override {
    cpu::embedding(pool_, table, ids, out);
  }
  void add_impl(const Tensor& y, const Tensor& x, float alpha) override { cpu::add(pool_, y, x, alpha); }
  void copy_columns_impl(const Tensor& dst, const Tensor& src, int64_t col0) override {
    cpu::copy_columns(dst, src, col0);
  }
  void gather_columns_impl(const Tensor& dst, const Tensor& src, int64_t col0) override {
    cpu::gather_columns(dst, src, col0);
  }
  void gather_rows_impl(const Tensor& dst, const Tensor& src, const Tensor& rows) override {
    cpu::gather_rows(dst, src, rows);
  }
  void argmax_impl(const Tensor& x, const Tensor& out) override { cpu::argmax(pool_, x, out); }
  void scale_rows_impl(const Tensor& x, const Tensor& rows, const Tensor& scale) override {
    cpu::scale_rows(pool_, x, rows, scale);
  }
  void attention_causal_impl(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, int64_t q_offset,
                             float scale, const CausalAttnOpts& opts) override {
    cpu::attention_causal(pool_, q, k, v, out, q_offset, scale, opts);
  }
  void dflash_attention_impl(const DFlashAttnArgs& a, const Tensor& out, const Tensor& lse) override {
    cpu::dflash_attention(pool_, a, out, lse);
  }
  void dflash_attention_backward_impl(const DFlashAttnArgs& a, const Tensor& out, const Tensor& lse, const Tensor& dout,
                                      const Tensor& dq, const Tensor& dkc, const Tensor& dvc, const Tensor& dkb,
                                      const Tensor& dvb) override {
    cpu::dflash_attention_backward(pool_, a, out, lse, dout, dq, dkc, dvc, dkb, dvb);
  }
  void moe_route_impl(const Tensor& logits, int64_t k, bool normalize, const Tensor& idx, const Tensor& weights,
                      const MoeRouteOpts& opts) override {
    cpu::moe_route(pool_, logits, k, normalize, idx, weights, opts);
  }
  void moe_group_impl(const Tensor& idx, const Tensor& offsets, const Tensor& rows, const Tensor& slot) override {
    cpu::moe_group(idx, offsets, rows, slot);
  }
  void moe_linear_impl(const Tensor& x, const Tensor* rows, const MoeWeights& w, const Tensor& offsets, const Tensor& y,
                       MoeAct act, const MoeLinearDims& d) override {
    cpu::moe_linear(pool_, x, rows, w, offsets, y, act, d);
  }
  void moe_combine_impl(const Tensor& y, const Tensor& slot, const Tensor& weights, const Tensor& out,
                        float beta) override {
    cpu::moe_combine(pool_, y, slot, weights, out, beta);
  }
  void rmsnorm_gated_impl(const Tensor& x, const Tensor& w, const Tensor* z, float eps, bool zero_centred,
                          const Tensor& y, const RowsDims& d) override {
    cpu::rmsnorm_gated(pool_, x, w, z, eps, zero_centred, y, d.R, d.D);
  }
  void sigmoid_gate_impl(const Tensor& y, const Tensor& gate, const RowsDims& d) override {
    cpu::sigmoid_gate(pool_, y, gate, d.R, d.D);
  }
  void conv1d_causal_impl(const Tensor& x, const Tensor& w, const Tensor& state, const Tensor& y,
                          const Conv1dDims& d) override {
    cpu::conv1d_causal(pool_, x, w, state, y, d);
  }
  void gdn_gate_impl(const Tensor& ba, const Tensor& A_log, const Tensor& dt_bias, const Tensor& g, const Tensor& beta,
                     int64_t T) override {
    cpu::gdn_gate(pool_, ba, A_log, dt_bias, g, beta, T);
  }
  void gated_delta_rule_impl(const GatedDeltaArgs& a, const Tensor& out, int64_t T) override {
    cpu::gated_delta_rule(pool_, a, out, T);
  }
  LossStats lm_head_loss_impl(const LossArgs& a) override { return cpu::lm_head_loss(pool_, a); }
  void dynamic_conv_impl(const DynConvArgs& a, const Tensor& y, const Tensor* res, const DynConvDims& d) override {
    cpu::dynamic_conv(pool_, a, y, res, d);
  }
  void dynamic_conv_backward_impl(const DynConvArgs& a, const Tensor& dy, const Tensor& du, const Tensor& d_delta,
                                  const Tensor& d_base, const DynConvDims& d) override {
    cpu::check_float("dynamic_conv_backward", du, "du", dt_);
    cpu::check_float("dynamic_conv_backward", d_delta, "d_delta", dt_);
    cpu::check_float("dynamic_conv_backward", d_base, "d_base", dt_);
    cpu::dynamic_conv_backward(pool_, a, dy, du, d_delta, d_base, d);
  }
  SelectorStats candidate_selector_impl(const SelectorArgs& a, const Tensor& scores, const SelectorDims& d) override {
    return cpu::candidate_selector(pool_, a, scores, d);
  }
  void adamw_impl(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, const AdamWArgs& a,
                  const Tensor& pc) override {
    cpu::adamw(pool_, p, g, m, v, a, pc);
  }
  double sum_squares_impl(const Tensor& x) override { return cpu::sum_squares(x); }
  void fill_normal_impl(const Tensor& out, double std, uint64_t seed, RngPurpose purpose, uint64_t stream) override {
    DFLASH_CHECK(out.device == Device::CPU && (out.dtype == DType::F32 || out.dtype == DType::F64),
                 "fill_normal: out must be an F32 or F64 cpu tensor");
    if (out.dtype == DType::F32) {
      dflash::fill_normal(out.ptr<float>(), out.numel(), std, seed, purpose, stream, static_cast<int>(pool_.size()));
      return;
    }
    std::vector<float> v(static_cast<size_t>(out.numel()));
    dflash::fill_normal(v.data(), out.numel(), std, seed, purpose, stream, static_cast<int>(pool_.size()));
    double* o = out.ptr<double>();
    for (size_t i = 0; i < v.size(); ++i) o[i] = v[i];
  }

  // ---- per-op profile (ContextOptions::profile_ops, backend/op_profile.h): the wall time of each (synchronous) op -
  void op_begin(bool timed) override {
    if (timed) starts_.push_back(std::chrono::steady_clock::now());  // no clock read when not profiling
  }
  void op_end(std::string key, double flop) override {
    const auto t0 = starts_.back();
    starts_.pop_back();
    profile_.add(key, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(), flop);
  }

 private:
  std::vector<std::chrono::steady_clock::time_point> starts_;  // of the open op scopes, innermost last
  ThreadPool pool_;
  int64_t limit_;
  DType dt_;
};

}  // namespace

std::unique_ptr<Context> make_cpu_context(const ContextOptions& o, DType dt) {
  return std::make_unique<CpuContext>(o, dt);
}

namespace cpu {
void check_float(const char* op, const Tensor& t, const char* name, DType dt) {
  DFLASH_CHECK(t.device == Device::CPU, op, ": ", name, " is on ", device_name(t.device), ", expected cpu");
  DFLASH_CHECK(t.dtype == dt, op, ": ", name, " has dtype ", dtype_name(t.dtype), ", expected ", dtype_name(dt));
}
}  // namespace cpu

}  // namespace dflash
