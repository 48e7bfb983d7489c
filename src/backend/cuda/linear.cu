// cuda/linear.cu — y = x W^T (+b) and its two backward products through cuBLASLt (BF16 A/B, fp32 accumulation).
//   linear:    y[M,N]  = x[M,K] W[N,K]^T (+ bias[N]) + beta y      y BF16 (or F32)
//   linear_dx: dx[M,K] = dy[M,N] W[N,K] + beta dx                   dx BF16 (or F32)
//   linear_dw: dw[N,K] += dy[M,N]^T x[M,K] (F32, beta = 1);  db[N] += column sums of dy (F32)
// cuBLASLt is column-major. A row-major matrix X[r, c] with leading dimension ld is the column-major matrix X^T
// (c x r, same ld), so the row-major product C = op(A) op(B) is computed as the column-major C^T = op(B)^T op(A)^T:
// gemm() below swaps the operands and maps each row-major transpose flag to the other operand (derivation
// beside the code). The bias is added by a small kernel after the product (so beta keeps its meaning), and db by a
// deterministic two-stage column reduction (no float atomics).
#include <algorithm>

#include "backend/cuda/common.cuh"

namespace dflash::cuda {

namespace {

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::BF16: return CUDA_R_16BF;
    case DType::F32: return CUDA_R_32F;
    default: DFLASH_FAIL("gemm (cuda): dtype ", dtype_name(t), " for C (BF16 or F32)");
  }
}

// The alignment (power of two, <= 256 bytes) every row of a matrix at p with leading dimension ld has.
uint32_t alignment_of(const void* p, int64_t ld, size_t elem) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const uint64_t row = static_cast<uint64_t>(ld) * elem;
  uint32_t al = 256;
  while (al > 1 && ((a % al) != 0 || (row % al) != 0)) al >>= 1;
  return al;
}

template <class T>
__global__ void k_add_bias(T* __restrict__ y, const T* __restrict__ b, int64_t M, int64_t N) {
  const int64_t n = M * N;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] = from_f<T>(to_f(y[i]) + to_f(b[i % N]));
}

// partial[p, n] = sum of dy[r, n] over the rows r of partition p. grid (ceil(N/32), P), block (32, 8).
__global__ void k_colsum_partial(const bf16* __restrict__ dy, int64_t M, int64_t N, int64_t rows_per_part,
                                 float* __restrict__ partial) {
  __shared__ float red[8][33];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_part;
  const int64_t r1 = r0 + rows_per_part < M ? r0 + rows_per_part : M;
  float acc = 0.f;
  if (col < N)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += 8) acc += __bfloat162float(dy[r * N + col]);
  red[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && col < N) {
    float s = 0.f;
    for (int k = 0; k < 8; ++k) s += red[k][threadIdx.x];
    partial[static_cast<int64_t>(blockIdx.y) * N + col] = s;
  }
}

__global__ void k_colsum_add(const float* __restrict__ partial, int P, int64_t N, float* __restrict__ db) {
  const int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col >= N) return;
  float s = 0.f;
  for (int p = 0; p < P; ++p) s += partial[static_cast<int64_t>(p) * N + col];
  db[col] += s;
}

}  // namespace

void gemm(Env& e, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void* A, int64_t lda, const void* B,
          int64_t ldb, float beta, void* C, DType c_type, int64_t ldc, const void* C_in) {
  DFLASH_CHECK(M >= 0 && N >= 0 && K >= 0, "gemm: negative size");
  if (!C_in) C_in = C;
  if (M == 0 || N == 0) return;
  DFLASH_CHECK(K > 0, "gemm: K = 0");
  // Row-major C[M,N] = op(A)[M,K] op(B)[K,N]  <=>  column-major C^T[N,M] = op(B)^T[N,K] op(A)^T[K,M].
  // cuBLASLt computes D(m x n) = op(A')(m x k) op(B')(k x n) with m = N, n = M, k = K and
  //  A' = the memory of B:  !tb: B is row-major [K,N] = column-major N x K (ld ldb) = op(B)^T itself -> OP_N,
  //                              layout rows N, cols K;
  //                          tb: B is row-major [N,K] = column-major K x N (ld ldb), op(B)^T = its transpose -> OP_T,
  //                              layout rows K, cols N.
  //  B' = the memory of A:  !ta: A is row-major [M,K] = column-major K x M = op(A)^T itself -> OP_N, rows K, cols M;
  //                          ta: A is row-major [K,M] = column-major M x K, op(A)^T = its transpose -> OP_T,
  //                              rows M, cols K.
  //  C/D: row-major [M,N] (ld ldc) = column-major N x M: rows N, cols M.
  const cublasOperation_t opa = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t opb = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  const uint64_t a_rows = tb ? K : N, a_cols = tb ? N : K;
  const uint64_t b_rows = ta ? M : K, b_cols = ta ? K : M;
  DFLASH_CHECK(ldb >= static_cast<int64_t>(a_rows) && lda >= static_cast<int64_t>(b_rows) && ldc >= N,
               "gemm: leading dimensions lda ", lda, " ldb ", ldb, " ldc ", ldc, " too small for M ", M, " N ", N,
               " K ", K);
  LtDescs d;
  DFLASH_CUBLAS_CHECK(cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  DFLASH_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
  DFLASH_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
  DFLASH_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.a, CUDA_R_16BF, a_rows, a_cols, ldb));
  DFLASH_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.b, CUDA_R_16BF, b_rows, b_cols, lda));
  DFLASH_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.c, cuda_type(c_type), static_cast<uint64_t>(N),
                                                 static_cast<uint64_t>(M), ldc));
  DFLASH_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&d.pref));
  const size_t ws = e.workspace_bytes;
  DFLASH_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  const uint32_t al_a = alignment_of(B, ldb, 2), al_b = alignment_of(A, lda, 2);
  const uint32_t al_c = std::min(alignment_of(C, ldc, dtype_size(c_type)), alignment_of(C_in, ldc, dtype_size(c_type)));
  DFLASH_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof(al_a)));
  DFLASH_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof(al_b)));
  DFLASH_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof(al_c)));
  DFLASH_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof(al_c)));
  cublasLtMatmulHeuristicResult_t res{};
  int found = 0;
  DFLASH_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(e.lt, d.op, d.a, d.b, d.c, d.c, d.pref, 1, &res, &found));
  DFLASH_CHECK(found > 0 && res.state == CUBLAS_STATUS_SUCCESS, "gemm (cuBLASLt): no algorithm for M ", M, " N ", N,
               " K ", K, " ta ", ta, " tb ", tb, " lda ", lda, " ldb ", ldb, " ldc ", ldc, " C ", dtype_name(c_type));
  const float alpha = 1.0f;
  DFLASH_CUBLAS_CHECK(cublasLtMatmul(e.lt, d.op, &alpha, B, d.a, A, d.b, &beta, C_in, d.c, C, d.c, &res.algo,
                                     e.workspace, ws, e.stream));
}

void linear(Env& e, const Tensor& x, const Tensor& w, const Tensor* bias, const Tensor& y, float beta, const Tensor* c) {
  const char* op = "linear";
  check_dev(op, x, "x", DType::BF16);
  check_dev(op, w, "w", DType::BF16);
  check_on_dev(op, y, "y");
  const int64_t K = x.dim(-1), N = w.dim(0), M = x.rows();
  if (c && c->data != y.data) check_dev(op, *c, "c", y.dtype);
  if (M == 0) return;
  gemm(e, false, true, M, N, K, x.data, K, w.data, K, beta, y.data, y.dtype, N, c ? c->data : nullptr);
  if (bias) add_bias(e, y, *bias);
}

void add_bias(Env& e, const Tensor& y, const Tensor& bias) {
  check_dev("linear", bias, "bias", y.dtype);
  const int64_t N = y.dim(-1), M = y.rows();
  const unsigned g = grid_for(M * N, 256, e.num_sms);
  if (y.dtype == DType::BF16) {
    DFLASH_LAUNCH(g, 256, 0, e.stream, k_add_bias<bf16>)(static_cast<bf16*>(y.data),
                                                         static_cast<const bf16*>(bias.data), M, N);
  } else {
    DFLASH_LAUNCH(g, 256, 0, e.stream, k_add_bias<float>)(y.ptr<float>(), bias.ptr<float>(), M, N);
  }
  check_launch("linear_bias");
}

void linear_dx(Env& e, const Tensor& dy, const Tensor& w, const Tensor& dx, float beta) {
  const char* op = "linear_dx";
  check_dev(op, dy, "dy", DType::BF16);
  check_dev(op, w, "w", DType::BF16);
  check_on_dev(op, dx, "dx");
  const int64_t N = w.dim(0), K = w.dim(1), M = dy.rows();
  if (M == 0) return;
  gemm(e, false, false, M, K, N, dy.data, N, w.data, K, beta, dx.data, dx.dtype, K);
}

void linear_dw(Env& e, const Tensor& dy, const Tensor& x, const Tensor& dw, const Tensor* db) {
  const char* op = "linear_dw";
  check_dev(op, dy, "dy", DType::BF16);
  check_dev(op, x, "x", DType::BF16);
  check_dev(op, dw, "dw", DType::F32);
  const int64_t N = dy.dim(-1), K = x.dim(-1), M = dy.rows();
  if (M == 0) return;
  // dw[N,K] += dy^T[N,M] x[M,K]: row-major gemm with op(A) = dy^T (dy stored [M,N], ld N) and B = x ([M,K], ld K)
  gemm(e, true, false, N, K, M, dy.data, N, x.data, K, 1.0f, dw.data, DType::F32, K);
  if (db) {
    check_dev(op, *db, "db", DType::F32);
    const int64_t P = std::max<int64_t>(1, std::min<int64_t>(512, (M + 63) / 64));
    const int64_t rpp = (M + P - 1) / P;
    Tensor partial = e.alloc(DType::F32, {P, N});
    const dim3 grid(static_cast<unsigned>((N + 31) / 32), static_cast<unsigned>(P));
    DFLASH_LAUNCH(grid, dim3(32, 8), 0, e.stream, k_colsum_partial)(static_cast<const bf16*>(dy.data), M, N, rpp,
                                                                    partial.ptr<float>());
    check_launch("linear_db_partial");
    DFLASH_LAUNCH(static_cast<unsigned>((N + 255) / 256), 256, 0, e.stream, k_colsum_add)(
        partial.ptr<float>(), static_cast<int>(P), N, db->ptr<float>());
    check_launch("linear_db_final");
  }
}

}  // namespace dflash::cuda
