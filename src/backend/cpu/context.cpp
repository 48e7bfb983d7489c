// backend/cpu/context.cpp — CpuContext: the CPU Context and its single dispatch point to the op files.
#include <algorithm>
#include <chrono>
#include <cstring>

#include "backend/cpu/ops.h"

namespace dflash {

namespace {

// t [R, D] viewed as [R / heads, heads, D], the layout cpu::rope takes (checked against r.pos).
Tensor rope_rows(const char* op, const Tensor& t, const RopeArgs& r) {
  const int64_t R = t.rows(), D = t.dim(-1);
  DFLASH_CHECK(r.heads > 0 && R % r.heads == 0, op, ": ", R, " rows are not whole tokens of ", r.heads, " heads");
  DFLASH_CHECK(r.pos.dtype == DType::I32 && r.pos.numel() == R / r.heads, op, ": rope pos must be I32 [", R / r.heads,
               "] (", R, " rows / ", r.heads, " heads), got ", dtype_name(r.pos.dtype), " ", shape_str(r.pos.shape));
  return t.reshape({R / r.heads, r.heads, D});
}

class CpuContext final : public Context {
 public:
  CpuContext(const ContextOptions& o, DType dt)
      : profile_ops_(o.profile_ops), pool_(o.threads), limit_(o.memory_limit_bytes), dt_(dt) {
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

  // ---- ops: the dispatch point (each timed when profiling) -------------------------------------------------
  void linear(const Tensor& x, const LinearWeight& w, const Tensor* b, const Tensor& y, float beta,
              const Tensor* c) override {
    check_linear_weight("linear", w);
    const OpScope scope = op_gemm(w.fp8() ? "linear_fp8" : "linear", x.numel() / w.cols(), w.rows(), w.cols());
    if (!w.fp8()) return cpu::linear(pool_, x, w.w, b, y, beta, c);
    const Tensor wd = fp8_dequantize(w);  // the reference: the dequantised weight, x unquantized
    cpu::linear(pool_, x, to_device(wd, dt_), b, y, beta, c);
  }
  Tensor dequantize_fp8(const LinearWeight& w) override {
    const OpScope scope = op("dequantize_fp8");
    return to_device(fp8_dequantize(w), dt_);
  }
  LinearWeight quantize_fp8(const Tensor& w, int64_t block_n, int64_t block_k) override {
    const OpScope scope = op("quantize_fp8");
    return cpu::fp8_quantize(w, block_n, block_k);
  }
  void linear_dx(const Tensor& dy, const Tensor& w, const Tensor& dx, float beta) override {
    const OpScope scope = op_gemm("linear_dx", dy.numel() / w.shape[0], w.shape[0], w.shape.back());
    cpu::linear_dx(pool_, dy, w, dx, beta);
  }
  void linear_dw(const Tensor& dy, const Tensor& x, const Tensor& dw, const Tensor* db) override {
    const OpScope scope = op_gemm("linear_dw", dy.numel() / dw.shape[0], dw.shape[0], dw.shape.back());
    cpu::linear_dw(pool_, dy, x, dw, db);
  }
  // With rope: the composition, rmsnorm then rope on y (the backward: rope inverse on a copy of dy, then the
  // backward), on the rows viewed as [T, heads, D].
  void rmsnorm(const Tensor& x, const Tensor& w, float eps, const Tensor& y, const Tensor& rstd,
               const RopeArgs* rope) override {
    const OpScope scope = op_rows("rmsnorm", x.numel() / std::max<int64_t>(1, x.shape.back()), x.shape.back());
    const Tensor yr = rope ? rope_rows("rmsnorm", y, *rope) : Tensor{};  // (checked before y is written)
    cpu::rmsnorm(pool_, x, w, eps, y, rstd);
    if (rope) cpu::rope(pool_, yr, rope->pos, rope->inv_freq, false);
  }
  void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dx,
                        const Tensor& dw, float beta, const RopeArgs* rope) override {
    const OpScope scope =
        op_rows("rmsnorm_backward", x.numel() / std::max<int64_t>(1, x.shape.back()), x.shape.back());
    if (!rope) {
      cpu::rmsnorm_backward(pool_, dy, x, w, rstd, dx, dw, beta);
      return;
    }
    const Tensor g = cpu_clone(dy);
    cpu::rope(pool_, rope_rows("rmsnorm_backward", g, *rope), rope->pos, rope->inv_freq, true);
    cpu::rmsnorm_backward(pool_, g, x, w, rstd, dx, dw, beta);
  }
  void rope(const Tensor& x, const Tensor& pos, const Tensor& inv_freq, bool inverse) override {
    const OpScope scope = op("rope");
    cpu::rope(pool_, x, pos, inv_freq, inverse);
  }
  void silu_mul(const Tensor& g, const Tensor& u, const Tensor& out) override {
    const OpScope scope = op("silu_mul");
    cpu::silu_mul(pool_, g, u, out);
  }
  void silu_mul_backward(const Tensor& dout, const Tensor& g, const Tensor& u, const Tensor& dg,
                         const Tensor& du) override {
    const OpScope scope = op("silu_mul_backward");
    cpu::silu_mul_backward(pool_, dout, g, u, dg, du);
  }
  void embedding(const Tensor& table, const Tensor& ids, const Tensor& out) override {
    const OpScope scope = op("embedding");
    cpu::embedding(pool_, table, ids, out);
  }
  void add(const Tensor& y, const Tensor& x, float alpha) override {
    const OpScope scope = op("add");
    cpu::add(pool_, y, x, alpha);
  }
  void copy_columns(const Tensor& dst, const Tensor& src, int64_t col0) override {
    const OpScope scope = op("copy_columns");
    cpu::copy_columns(dst, src, col0);
  }
  void gather_columns(const Tensor& dst, const Tensor& src, int64_t col0) override {
    const OpScope scope = op("gather_columns");
    cpu::gather_columns(dst, src, col0);
  }
  void gather_rows(const Tensor& dst, const Tensor& src, const Tensor& rows) override {
    const OpScope scope = op("gather_rows");
    cpu::gather_rows(dst, src, rows);
  }
  void argmax(const Tensor& x, const Tensor& out) override {
    const OpScope scope = op("argmax");
    cpu::argmax(pool_, x, out);
  }
  void scale_rows(const Tensor& x, const Tensor& rows, const Tensor& scale) override {
    const OpScope scope = op("scale_rows");
    cpu::scale_rows(pool_, x, rows, scale);
  }
  void attention_causal(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, int64_t q_offset,
                        float scale, const CausalAttnOpts& opts) override {
    const OpScope scope = op("attention_causal");
    check_causal_attn_opts("attention_causal", opts, q);
    cpu::attention_causal(pool_, q, k, v, out, q_offset, scale, opts);
  }
  void dflash_attention(const DFlashAttnArgs& a, const Tensor& out, const Tensor& lse) override {
    const OpScope scope =
        op("dflash_attention", profile_ops_ ? dflash_attn_fwd_flop(a, out.shape[1], out.shape[2]) : 0);
    cpu::dflash_attention(pool_, a, out, lse);
  }
  void dflash_attention_backward(const DFlashAttnArgs& a, const Tensor& out, const Tensor& lse, const Tensor& dout,
                                 const Tensor& dq, const Tensor& dkc, const Tensor& dvc, const Tensor& dkb,
                                 const Tensor& dvb) override {
    const OpScope scope =
        op("dflash_attention_backward", profile_ops_ ? 2.5 * dflash_attn_fwd_flop(a, out.shape[1], out.shape[2]) : 0);
    cpu::dflash_attention_backward(pool_, a, out, lse, dout, dq, dkc, dvc, dkb, dvb);
  }
  void moe_route(const Tensor& logits, int64_t k, bool normalize, const Tensor& idx, const Tensor& weights) override {
    const OpScope scope = op("moe_route");
    check_moe_route(logits, k, idx, weights, dt_, dt_);
    cpu::moe_route(pool_, logits, k, normalize, idx, weights);
  }
  void moe_group(const Tensor& idx, const Tensor& offsets, const Tensor& rows, const Tensor& slot) override {
    const OpScope scope = op("moe_group");
    check_moe_group(idx, offsets, rows, slot);
    cpu::moe_group(idx, offsets, rows, slot);
  }
  void moe_linear(const Tensor& x, const Tensor* rows, const MoeWeights& w, const Tensor& offsets, const Tensor& y,
                  MoeAct act) override {
    const MoeLinearDims d = check_moe_linear(x, rows, w, offsets, y, act, dt_);
    const OpScope scope = op_gemm(moe_linear_op_name(act, w), d.R, act == MoeAct::None ? d.N : 2 * d.N, d.K);
    cpu::moe_linear(pool_, x, rows, w, offsets, y, act, d);
  }
  void moe_combine(const Tensor& y, const Tensor& slot, const Tensor& weights, const Tensor& out, float beta) override {
    const OpScope scope = op("moe_combine");
    check_moe_combine(y, slot, weights, out, dt_, dt_);
    cpu::moe_combine(pool_, y, slot, weights, out, beta);
  }
  void rmsnorm_gated(const Tensor& x, const Tensor& w, const Tensor* z, float eps, bool zero_centred,
                     const Tensor& y) override {
    const RowsDims d = check_rmsnorm_gated(x, w, z, y, dt_);
    const OpScope scope = op_rows("rmsnorm_gated", d.R, d.D);
    cpu::rmsnorm_gated(pool_, x, w, z, eps, zero_centred, y, d.R, d.D);
  }
  void sigmoid_gate(const Tensor& y, const Tensor& gate) override {
    const RowsDims d = check_sigmoid_gate(y, gate, dt_);
    const OpScope scope = op("sigmoid_gate");
    cpu::sigmoid_gate(pool_, y, gate, d.R, d.D);
  }
  void conv1d_causal(const Tensor& x, const Tensor& w, const Tensor& state, const Tensor& y,
                     std::span<const int64_t> seqs) override {
    const Conv1dDims d = check_conv1d_causal(x, w, state, y, dt_, seqs);
    const OpScope scope = op("conv1d_causal");
    cpu::conv1d_causal(pool_, x, w, state, y, d);
  }
  void gdn_gate(const Tensor& ba, const Tensor& A_log, const Tensor& dt_bias, const Tensor& g,
                const Tensor& beta) override {
    const int64_t T = check_gdn_gate(ba, A_log, dt_bias, g, beta, dt_, dt_);
    const OpScope scope = op("gdn_gate");
    cpu::gdn_gate(pool_, ba, A_log, dt_bias, g, beta, T);
  }
  void gated_delta_rule(const GatedDeltaArgs& a, const Tensor& out) override {
    const int64_t T = check_gated_delta_rule(a, out, dt_, dt_);
    // FLOPs of the recurrence per token and value head: decay, S^T k, the rank-1 update, S^T q
    const OpScope scope = op("gated_delta_rule", 8.0 * double(T) * double(a.nv) * double(a.dk) * double(a.dv));
    cpu::gated_delta_rule(pool_, a, out, T);
  }
  LossStats lm_head_loss(const LossArgs& a) override {
    const double passes = 1.0 + (a.dh.defined() ? 1.0 : 0.0) + (a.teacher_h.defined() ? 1.0 : 0.0);
    const OpScope scope = op("lm_head_loss", 2.0 * passes * double(a.rows.numel()) * double(a.lm_head.numel()));
    return cpu::lm_head_loss(pool_, a);
  }
  void dynamic_conv(const DynConvArgs& a, const Tensor& y, const Tensor* res) override {
    const DynConvDims d = check_dynamic_conv(a, y, res, dt_);
    const OpScope scope = op("dynamic_conv", 2.0 * double(d.R) * double(d.C) * double(d.T));
    cpu::dynamic_conv(pool_, a, y, res, d);
  }
  void dynamic_conv_backward(const DynConvArgs& a, const Tensor& dy, const Tensor& du, const Tensor& d_delta,
                             const Tensor& d_base) override {
    const DynConvDims d = check_dynamic_conv(a, dy, nullptr, dt_);
    cpu::check_float("dynamic_conv_backward", du, "du", dt_);
    cpu::check_float("dynamic_conv_backward", d_delta, "d_delta", dt_);
    cpu::check_float("dynamic_conv_backward", d_base, "d_base", dt_);
    DFLASH_CHECK(du.numel() == d.R * d.C && d_delta.numel() == a.delta.numel() && d_base.numel() == a.base.numel(),
                 "dynamic_conv_backward: du, d_delta, d_base must have the shapes of u, delta, base");
    const OpScope scope = op("dynamic_conv_backward", 6.0 * double(d.R) * double(d.C) * double(d.T));
    cpu::dynamic_conv_backward(pool_, a, dy, du, d_delta, d_base, d);
  }
  SelectorStats candidate_selector(const SelectorArgs& a, const Tensor& scores) override {
    const SelectorDims d = check_candidate_selector(a, scores, dt_, dt_);
    const OpScope scope = op("candidate_selector", (a.dg.defined() ? 6.0 : 2.0) * double(d.M) * double(d.K) * double(d.r));
    return cpu::candidate_selector(pool_, a, scores, d);
  }
  void adamw(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, const AdamWArgs& a,
             const Tensor& pc) override {
    const OpScope scope = op("adamw");
    cpu::adamw(pool_, p, g, m, v, a, pc);
  }
  double sum_squares(const Tensor& x) override {
    const OpScope scope = op("sum_squares");
    return cpu::sum_squares(x);
  }
  void fill_normal(const Tensor& out, double std, uint64_t seed, RngPurpose purpose, uint64_t stream) override {
    const OpScope scope = op("fill_normal");
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

 private:
  // ---- per-op profile (ContextOptions::profile_ops, backend/op_profile.h): wall time of each synchronous op --
  class OpScope {
   public:
    OpScope(OpProfile* prof, std::string key, double flop) : prof_(prof), key_(std::move(key)), flop_(flop) {
      if (prof_) t0_ = std::chrono::steady_clock::now();  // no clock read when not profiling
    }
    OpScope(const OpScope&) = delete;
    OpScope& operator=(const OpScope&) = delete;
    ~OpScope() {
      if (prof_)
        prof_->add(key_, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0_).count(),
                   flop_);
    }

   private:
    OpProfile* prof_;
    std::string key_;
    double flop_;
    std::chrono::steady_clock::time_point t0_;
  };
  OpScope op(const char* name, double flop = 0) {
    return profile_ops_ ? OpScope(&profile_, name, flop) : OpScope(nullptr, {}, 0);
  }
  OpScope op_gemm(const char* name, int64_t M, int64_t N, int64_t K) {
    return profile_ops_ ? OpScope(&profile_, gemm_key(name, M, N, K), 2.0 * double(M) * double(N) * double(K))
                        : OpScope(nullptr, {}, 0);
  }

  OpScope op_rows(const char* name, int64_t R, int64_t D) {
    return profile_ops_ ? OpScope(&profile_, rows_key(name, R, D), 0) : OpScope(nullptr, {}, 0);
  }

  bool profile_ops_;
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
void check_same_shape(const char* op, const Tensor& a, const Tensor& b) {
  DFLASH_CHECK(a.numel() == b.numel(), op, ": shapes ", shape_str(a.shape), " and ", shape_str(b.shape), " differ");
}
}  // namespace cpu

}  // namespace dflash
