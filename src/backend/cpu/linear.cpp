// cpu/linear.cpp — y = x W^T (+b) and its two backward products, through OpenBLAS ?gemm.
#include <cblas.h>

#include <algorithm>
#include <mutex>

#include "backend/cpu/ops.h"


namespace dflash::cpu {

void init_cpu_backend() {
  static std::once_flag once;
  std::call_once(once, [] {
    note_lazy_init("OpenBLAS threading");
    openblas_set_num_threads(1);
  });
}

namespace {
template <class T>
void pgemm_t(ThreadPool& tp, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B,
             int64_t ldb, T beta, T* C, int64_t ldc) {
  const int64_t parts = tp.size();
  if (parts <= 1 || M * N * K < (int64_t{1} << 21)) {
    gemm(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  if (M >= N) {  // rows of C: op(A) rows i0.. are A + i0*lda (stored [M, K]) or A + i0 (stored [K, M])
    const int64_t step = (M + parts - 1) / parts;
    tp.parallel_for(parts, 1, [&](int64_t b, int64_t e) {
      for (int64_t p = b; p < e; ++p) {
        const int64_t i0 = p * step, i1 = std::min(M, i0 + step);
        if (i0 < i1) gemm(ta, tb, i1 - i0, N, K, ta ? A + i0 : A + i0 * lda, lda, B, ldb, beta, C + i0 * ldc, ldc);
      }
    });
  } else {  // columns of C: op(B) columns j0.. are B + j0*ldb (stored [N, K]) or B + j0 (stored [K, N])
    const int64_t step = (N + parts - 1) / parts;
    tp.parallel_for(parts, 1, [&](int64_t b, int64_t e) {
      for (int64_t p = b; p < e; ++p) {
        const int64_t j0 = p * step, j1 = std::min(N, j0 + step);
        if (j0 < j1) gemm(ta, tb, M, j1 - j0, K, A, lda, tb ? B + j0 * ldb : B + j0, ldb, beta, C + j0, ldc);
      }
    });
  }
}
}  // namespace

void pgemm(ThreadPool& tp, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
           const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  pgemm_t(tp, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
}
void pgemm(ThreadPool& tp, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const double* A, int64_t lda,
           const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  pgemm_t(tp, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
}

void gemm_f32(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
              int64_t ldb, float beta, float* C, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, 1.0f, A, lda, B,
              ldb, beta, C, ldc);
}
void gemm_f64(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const double* A, int64_t lda, const double* B,
              int64_t ldb, double beta, double* C, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, 1.0, A, lda, B,
              ldb, beta, C, ldc);
}

void linear(ThreadPool& tp, const Tensor& x, const Tensor& w, const Tensor* bias, const Tensor& y, float beta,
            const Tensor* c) {
  dispatch_float("linear", x.dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr DType dt = float_dtype<T>();
    check_float("linear", x, "x", dt);
    check_float("linear", w, "w", dt);
    check_float("linear", y, "y", dt);
    const int64_t K = x.dim(-1), N = w.dim(0), M = x.rows();
    if (c && c->data != y.data) {  // y = c first, then the accumulation into y
      check_float("linear", *c, "c", dt);
      std::copy_n(c->ptr<T>(), y.numel(), y.ptr<T>());
    }
    if (M == 0) return;
    pgemm(tp, false, true, M, N, K, x.ptr<T>(), K, w.ptr<T>(), K, static_cast<T>(beta), y.ptr<T>(), N);
    if (bias) {
      check_float("linear", *bias, "bias", dt);
      const T* b = bias->ptr<T>();
      T* o = y.ptr<T>();
      for (int64_t r = 0; r < M; ++r)
        for (int64_t n = 0; n < N; ++n) o[r * N + n] += b[n];
    }
  });
}

void linear_dx(ThreadPool& tp, const Tensor& dy, const Tensor& w, const Tensor& dx, float beta) {
  dispatch_float("linear_dx", dy.dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr DType dt = float_dtype<T>();
    check_float("linear_dx", dy, "dy", dt);
    check_float("linear_dx", w, "w", dt);
    check_float("linear_dx", dx, "dx", dt);
    const int64_t N = w.dim(0), K = w.dim(1), M = dy.rows();
    if (M == 0) return;
    pgemm(tp, false, false, M, K, N, dy.ptr<T>(), N, w.ptr<T>(), K, static_cast<T>(beta), dx.ptr<T>(), K);
  });
}

void linear_dw(ThreadPool& tp, const Tensor& dy, const Tensor& x, const Tensor& dw, const Tensor* db) {
  dispatch_float("linear_dw", dy.dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr DType dt = float_dtype<T>();
    check_float("linear_dw", dy, "dy", dt);
    check_float("linear_dw", x, "x", dt);
    check_float("linear_dw", dw, "dw", dt);
    const int64_t N = dy.dim(-1), K = x.dim(-1), M = dy.rows();
    if (M == 0) return;
    pgemm(tp, true, false, N, K, M, dy.ptr<T>(), N, x.ptr<T>(), K, T(1), dw.ptr<T>(), K);
    if (db) {
      check_float("linear_dw", *db, "db", dt);
      T* b = db->ptr<T>();
      const T* g = dy.ptr<T>();
      for (int64_t r = 0; r < M; ++r)
        for (int64_t n = 0; n < N; ++n) b[n] += g[r * N + n];
    }
  });
}

}  // namespace dflash::cpu
