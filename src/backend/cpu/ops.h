// backend/cpu/ops.h — the CPU implementations of the Context ops, one file per op. Float tensors are F32 (the
// "cpu" context) or F64 (the "cpu64" context, used for finite-difference gradient checks); each op is a
// template over the element type T. These are the reference every other backend is tested against: simple
// loops, OpenBLAS for the products. Shapes and semantics are those documented on Context in backend/context.h;
// Context's public ops have checked the shapes (backend/context_ops.cpp), so these check only what is the CPU's own:
// tensors on the host in the op's float dtype (check_float), and index values.
#pragma once
#include "backend/context.h"
#include "core/thread_pool.h"

namespace dflash::cpu {

// FP8 E4M3 block quantization of a host F32 / F64 [N, K] (Context::quantize_fp8; backend/fp8.cpp).
LinearWeight fp8_quantize(const Tensor& w, int64_t block_n, int64_t block_k);
void linear(ThreadPool& tp, const Tensor& x, const Tensor& w, const Tensor* bias, const Tensor& y, float beta,
            const Tensor* c);
void linear_dx(ThreadPool& tp, const Tensor& dy, const Tensor& w, const Tensor& dx, float beta);
void linear_dw(ThreadPool& tp, const Tensor& dy, const Tensor& x, const Tensor& dw, const Tensor* db);

void rmsnorm(ThreadPool& tp, const Tensor& x, const Tensor& w, float eps, const Tensor& y, const Tensor& rstd);
void rmsnorm_backward(ThreadPool& tp, const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                      const Tensor& dx, const Tensor& dw, float beta);
void rope(ThreadPool& tp, const Tensor& x, const Tensor& pos, const Tensor& inv_freq, bool inverse);
void silu_mul(ThreadPool& tp, const Tensor& gate, const Tensor& up, const Tensor& out);
void silu_mul_backward(ThreadPool& tp, const Tensor& dout, const Tensor& gate, const Tensor& up,
                       const Tensor& dgate, const Tensor& dup);
void gelu_tanh_mul(ThreadPool& tp, const Tensor& gate, const Tensor& up, const Tensor& out);
void softcap(ThreadPool& tp, const Tensor& x, float cap);
void embedding(ThreadPool& tp, const Tensor& table, const Tensor& ids, const Tensor& out);
void add(ThreadPool& tp, const Tensor& y, const Tensor& x, float alpha);
void copy_columns(const Tensor& dst, const Tensor& src, int64_t col0);
void gather_columns(const Tensor& dst, const Tensor& src, int64_t col0);
void gather_rows(const Tensor& dst, const Tensor& src, const Tensor& rows);
void argmax(ThreadPool& tp, const Tensor& x, const Tensor& out);
void scale_rows(ThreadPool& tp, const Tensor& x, const Tensor& rows, const Tensor& scale);

void attention_causal(ThreadPool& tp, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                      int64_t q_offset, float scale, const CausalAttnOpts& opts);
void dflash_attention(ThreadPool& tp, const DFlashAttnArgs& a, const Tensor& out, const Tensor& lse);
void dflash_attention_backward(ThreadPool& tp, const DFlashAttnArgs& a, const Tensor& out, const Tensor& lse,
                               const Tensor& dout, const Tensor& dq, const Tensor& dk_ctx, const Tensor& dv_ctx,
                               const Tensor& dk_blk, const Tensor& dv_blk);

void moe_route(ThreadPool& tp, const Tensor& logits, int64_t k, bool normalize, const Tensor& idx,
               const Tensor& weights, const MoeRouteOpts& opts = {});
void moe_group(const Tensor& idx, const Tensor& offsets, const Tensor& rows, const Tensor& slot);
void moe_linear(ThreadPool& tp, const Tensor& x, const Tensor* rows, const MoeWeights& w, const Tensor& offsets,
                const Tensor& y, MoeAct act, const MoeLinearDims& d);
void moe_combine(ThreadPool& tp, const Tensor& y, const Tensor& slot, const Tensor& weights, const Tensor& out,
                 float beta);

// hybrid linear-attention ops (they take the dims of the check_* of backend/context.h)
void rmsnorm_gated(ThreadPool& tp, const Tensor& x, const Tensor& w, const Tensor* z, float eps, bool zero_centred,
                   const Tensor& y, int64_t R, int64_t D);
void sigmoid_gate(ThreadPool& tp, const Tensor& y, const Tensor& gate, int64_t R, int64_t Dg);
void conv1d_causal(ThreadPool& tp, const Tensor& x, const Tensor& w, const Tensor& state, const Tensor& y,
                   const Conv1dDims& d);
void gdn_gate(ThreadPool& tp, const Tensor& ba, const Tensor& A_log, const Tensor& dt_bias, const Tensor& g,
              const Tensor& beta, int64_t T);
void gated_delta_rule(ThreadPool& tp, const GatedDeltaArgs& a, const Tensor& out, int64_t T);

LossStats lm_head_loss(ThreadPool& tp, const LossArgs& a);
// DFlash2 (they take the dims of check_dynamic_conv / check_candidate_selector of backend/context.h)
void dynamic_conv(ThreadPool& tp, const DynConvArgs& a, const Tensor& y, const Tensor* res, const DynConvDims& d);
void dynamic_conv_backward(ThreadPool& tp, const DynConvArgs& a, const Tensor& dy, const Tensor& du,
                           const Tensor& d_delta, const Tensor& d_base, const DynConvDims& d);
SelectorStats candidate_selector(ThreadPool& tp, const SelectorArgs& a, const Tensor& scores, const SelectorDims& d);
void adamw(ThreadPool& tp, const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
           const AdamWArgs& a, const Tensor& param_compute);
double sum_squares(const Tensor& x);

// The CPU's own check (Error naming the op and the tensor; the shapes are checked by Context's public ops): t on the
// CPU with the float dtype `dt` (the op's element type).
void check_float(const char* op, const Tensor& t, const char* name, DType dt);

// Calls f(T{}) with T = float for F32 and double for F64; any other dtype is an Error naming the op.
template <class F>
void dispatch_float(const char* op, DType t, F&& f) {
  if (t == DType::F32) {
    f(float{});
  } else if (t == DType::F64) {
    f(double{});
  } else {
    DFLASH_FAIL(op, ": dtype ", dtype_name(t), " is not supported on the CPU (F32 or F64)");
  }
}
// C[M,N] = op(A) op(B) + beta C, row-major (OpenBLAS sgemm / dgemm).
void gemm_f32(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
              int64_t ldb, float beta, float* C, int64_t ldc);
void gemm_f64(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const double* A, int64_t lda, const double* B,
              int64_t ldb, double beta, double* C, int64_t ldc);
inline void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
                 int64_t ldb, float beta, float* C, int64_t ldc) {
  gemm_f32(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
}
inline void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const double* A, int64_t lda, const double* B,
                 int64_t ldb, double beta, double* C, int64_t ldc) {
  gemm_f64(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
}

// The same product split over the pool's threads (each calling single-threaded BLAS): along M (rows of C) when
// M >= N, else along N. Small products run on the caller. OpenBLAS's own threads are off (init_cpu_backend), so
// the pool is the only source of parallelism and nothing spins.
void pgemm(ThreadPool& tp, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
           const float* B, int64_t ldb, float beta, float* C, int64_t ldc);
void pgemm(ThreadPool& tp, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const double* A, int64_t lda,
           const double* B, int64_t ldb, double beta, double* C, int64_t ldc);
// Once per process, before any CPU op: OpenBLAS single-threaded (thread-safe, idempotent).
void init_cpu_backend();

template <class T>
constexpr DType float_dtype() {
  return std::is_same_v<T, float> ? DType::F32 : DType::F64;
}

}  // namespace dflash::cpu
