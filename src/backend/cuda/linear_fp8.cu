// cuda/linear_fp8.cu — linears with FP8 E4M3 weights (backend/context.h LinearWeight) and the FP8 quantizers.
//   quantize_fp8: a weight [N, K] in blocks bn x bk -> e4m3 [N, K] + F32 scales [ceil(N/bn), ceil(K/bk)], scale =
//     amax / 448 (1 for an all-zero block), q = e4m3(w / scale) rounded to nearest even (satfinite).
//   linear_fp8: y[M,N] = x[M,K] W^T (+ bias) + beta c with W = q * scale.
//     Block 128 x 128 weights (Qwen's, DeepSeek's -FP8) or per-channel ones (compressed-tensors FP8-dynamic): x is
//     quantized on the fly (per row and 128 columns, resp. per row) and cuBLASLt multiplies e4m3 by e4m3 on the FP8
//     tensor cores with both scales applied in the fp32 accumulation (CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F /
//     VEC128_32F, resp. OUTER_VEC_32F: the DeepSeek-V3 / DeepGEMM scheme, cuBLAS >= 12.9 on Hopper).
//     Any other blocking, a device before compute capability 9.0 (Env::fp8_tensor_cores: cuBLASLt scales FP8 only
//     per tensor there), or where cuBLASLt offers no algorithm: W is dequantised into a bf16 scratch and multiplied
//     by the bf16 GEMM (correct everywhere, without the FP8 speed).
// Operand mapping (cuBLASLt is column-major, see linear.cu): A' = W, stored [N, K] row-major = column-major K x N,
// OP_T; B' = xq, [M, K] row-major = column-major K x M, OP_N; D = y, [M, N] row-major = column-major N x M.
// Scale layouts (cuBLAS "scaling factor layouts"; PyTorch's scaled_mm checks the same): BLK128x128 of A' is the
// column-major ceil(K/128) x ceil(N/128) grid with leading dimension ceil(K/128), i.e. the checkpoint's row-major
// [ceil(N/128), ceil(K/128)] with its rows at a stride of ceil(K/128) rounded up to 4; VEC128 of B' is ceil(K/128) x
// M4, token-major within each 128-column group, M4 = M rounded up to 4 (the GEMM runs M4 tokens, the padding zero);
// OUTER_VEC: one scale per row of A' (N) / of B'^T (M). (What the GPU runs confirmed: bench/NOTES.md "FP8 GEMM scale
// layouts"; the padding to 4 is what PyTorch's scaled_mm callers do for BlockWise1x128 x BlockWise128x128.)
#include <algorithm>

#ifndef DFLASH_CUDA_EMU
#include <cuda_fp8.h>
#endif

#include "backend/cuda/common.cuh"

namespace dflash::cuda {

namespace {

#ifdef DFLASH_CUDA_EMU
// the kernel emulator (tests/cuda/emu): the host conversions of core/dtype.h (the same rounding: RNE, satfinite)
inline uint8_t f_to_e4m3(float x) { return f32_to_f8e4m3(x); }
inline float e4m3_to_f(uint8_t v) { return f8e4m3_to_f32(v); }
#else
__device__ __forceinline__ uint8_t f_to_e4m3(float x) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}
__device__ __forceinline__ float e4m3_to_f(uint8_t v) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(v), __NV_E4M3);
  return __half2float(__half(h));
}
#endif

// The maximum over the block (blockDim.x a multiple of 32; every thread calls it); scratch: 32 floats of shared memory.
__device__ __forceinline__ float block_max(float v, float* scratch) {
  v = warp_max(v);
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) scratch[w] = v;
  __syncthreads();
  return warp_max(lane < nw ? scratch[lane] : 0.f);
}

// One block of 256 threads per scale block (bn x bk): the amax, then the codes. w bf16 [N, K].
__global__ void k_quantize_blocks(const bf16* __restrict__ w, int64_t N, int64_t K, int64_t bn, int64_t bk,
                                  uint8_t* __restrict__ q, float* __restrict__ scale) {
  const int64_t i = blockIdx.y, j = blockIdx.x, kb = gridDim.x;
  const int64_t n0 = i * bn, n1 = min(N, n0 + bn), k0 = j * bk, k1 = min(K, k0 + bk);
  const int64_t cols = k1 - k0, count = (n1 - n0) * cols;
  float amax = 0.f;
  for (int64_t t = threadIdx.x; t < count; t += blockDim.x)
    amax = fmaxf(amax, fabsf(__bfloat162float(w[(n0 + t / cols) * K + k0 + t % cols])));
  __shared__ float red[32];
  amax = block_max(amax, red);
  const float s = amax > 0.f ? amax / 448.f : 1.f;
  if (threadIdx.x == 0) scale[i * kb + j] = s;
  for (int64_t t = threadIdx.x; t < count; t += blockDim.x) {
    const int64_t idx = (n0 + t / cols) * K + k0 + t % cols;
    q[idx] = f_to_e4m3(__bfloat162float(w[idx]) / s);
  }
}

// Activations x bf16 [M, K] per row in groups of G columns (G = 128, or K: per row): one warp per (row, group), each
// lane holding 4 consecutive columns of every 128 (one 8-byte load; K % 16 == 0 and x 16-byte aligned on the paths
// that come here). The scale of (m, g) goes to scale[g * ld + m] (token-major within a group, ld = M rounded up to 4:
// cuBLASLt's VEC128 layout; G = K: [M]).
__global__ void k_quantize_rows(const bf16* __restrict__ x, int64_t M, int64_t K, int64_t G, int64_t ld,
                                uint8_t* __restrict__ q, float* __restrict__ scale) {
  const int64_t groups = (K + G - 1) / G;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= M * groups) return;  // whole warps leave together (blockDim a multiple of 32)
  const int64_t m = warp / groups, g = warp % groups;
  const int64_t k0 = g * G, k1 = min(K, k0 + G);
  const bf16* row = x + m * K;
  float amax = 0.f;
  for (int64_t k = k0 + 4 * lane; k < k1; k += 128) {
    const uint2 v = *reinterpret_cast<const uint2*>(row + k);
    const bf16* e = reinterpret_cast<const bf16*>(&v);
    for (int i = 0; i < 4; ++i) amax = fmaxf(amax, fabsf(__bfloat162float(e[i])));
  }
  amax = warp_max(amax);
  const float s = amax > 0.f ? amax / 448.f : 1.f;
  for (int64_t k = k0 + 4 * lane; k < k1; k += 128) {
    const uint2 v = *reinterpret_cast<const uint2*>(row + k);
    const bf16* e = reinterpret_cast<const bf16*>(&v);
    uint32_t packed = 0;
    for (int i = 0; i < 4; ++i) packed |= static_cast<uint32_t>(f_to_e4m3(__bfloat162float(e[i]) / s)) << (8 * i);
    *reinterpret_cast<uint32_t*>(q + m * K + k) = packed;
  }
  if (lane == 0) scale[g * ld + m] = s;
}

// W = q * scale as bf16 [N, K].
__global__ void k_dequantize(const uint8_t* __restrict__ q, const float* __restrict__ scale, int64_t N, int64_t K,
                             int64_t bn, int64_t bk, int64_t kb, bf16* __restrict__ w) {
  const int64_t total = N * K;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t n = i / K, k = i % K;
    w[i] = __float2bfloat16(e4m3_to_f(q[i]) * scale[(n / bn) * kb + k / bk]);
  }
}

enum class Fp8Path { Block128, PerChannel, Dequantize };

Fp8Path fp8_path(const LinearWeight& w) {
#ifdef DFLASH_CUDA_EMU
  return Fp8Path::Dequantize;  // the emulator's cuBLASLt multiplies bf16 / f32 only
#endif
  const int64_t N = w.rows(), K = w.cols();
  if (K % 16 != 0 || N % 8 != 0) return Fp8Path::Dequantize;  // cuBLASLt's FP8 alignment (16 bytes per row)
  if (w.block_n == 128 && w.block_k == 128) return Fp8Path::Block128;
  if (w.block_n == 1 && w.block_k == K) return Fp8Path::PerChannel;
  return Fp8Path::Dequantize;
}

// y = xq Wq^T with the scales, through cuBLASLt; false when it offers no algorithm (the caller falls back).
bool lt_fp8(Env& e, Fp8Path path, const LinearWeight& w, const void* xq, const float* xs, const float* ws, int64_t M,
            float beta, const void* c_in, const Tensor& y) {
#ifdef DFLASH_CUDA_EMU
  return false;  // (fp8_path never chooses this under the emulator)
#else
  const int64_t N = w.rows(), K = w.cols();
  LtDescs d;
  DFLASH_CUBLAS_CHECK(cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t opa = CUBLAS_OP_T, opb = CUBLAS_OP_N;
  DFLASH_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
  DFLASH_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
  const cublasLtMatmulMatrixScale_t ma = path == Fp8Path::Block128 ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F
                                                                    : CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
  const cublasLtMatmulMatrixScale_t mb = path == Fp8Path::Block128 ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F
                                                                    : CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
  DFLASH_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &ma, sizeof(ma)));
  DFLASH_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mb, sizeof(mb)));
  DFLASH_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &ws, sizeof(ws)));
  DFLASH_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &xs, sizeof(xs)));
  DFLASH_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.a, CUDA_R_8F_E4M3, K, N, K));
  DFLASH_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.b, CUDA_R_8F_E4M3, K, M, K));
  DFLASH_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.c, CUDA_R_16BF, N, M, N));
  DFLASH_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&d.pref));
  const size_t wsb = e.workspace_bytes;
  DFLASH_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof(wsb)));
  cublasLtMatmulHeuristicResult_t res{};
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(e.lt, d.op, d.a, d.b, d.c, d.c, d.pref, 1, &res, &found);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0 || res.state != CUBLAS_STATUS_SUCCESS) return false;
  const float alpha = 1.0f;
  DFLASH_CUBLAS_CHECK(cublasLtMatmul(e.lt, d.op, &alpha, w.w.data, d.a, xq, d.b, &beta, c_in, d.c, y.data, d.c,
                                     &res.algo, e.workspace, wsb, e.stream));
  return true;
#endif
}

}  // namespace

LinearWeight quantize_fp8(Env& e, const Tensor& w, int64_t bn, int64_t bk) {
  const char* op = "quantize_fp8";
  check_dev(op, w, "w", DType::BF16);
  const int64_t N = w.shape[0], K = w.shape[1], nb = (N + bn - 1) / bn, kb = (K + bk - 1) / bk;
  LinearWeight r;
  r.w = e.alloc(DType::F8E4M3, {N, K});
  r.scale = e.alloc(DType::F32, {nb, kb});
  r.block_n = bn;
  r.block_k = bk;
  if (N == 0 || K == 0) return r;
  DFLASH_CHECK(nb <= 65535, op, ": ", nb, " block rows (at most 65535)");
  DFLASH_LAUNCH(dim3(static_cast<unsigned>(kb), static_cast<unsigned>(nb)), 256, 0, e.stream, k_quantize_blocks)(
      static_cast<const bf16*>(w.data), N, K, bn, bk, r.w.ptr<uint8_t>(), r.scale.ptr<float>());
  check_launch(op);
  return r;
}

Tensor dequantize_fp8(Env& e, const LinearWeight& w) {
  check_dev("dequantize_fp8", w.w, "w", DType::F8E4M3);
  check_dev("dequantize_fp8", w.scale, "scale", DType::F32);
  const int64_t N = w.rows(), K = w.cols();
  Tensor wd = e.alloc(DType::BF16, {N, K});
  if (N * K == 0) return wd;
  DFLASH_LAUNCH(grid_for(N * K, 256, e.num_sms), 256, 0, e.stream, k_dequantize)(
      w.w.ptr<uint8_t>(), w.scale.ptr<float>(), N, K, w.block_n, w.block_k, w.scale.shape[1],
      static_cast<bf16*>(wd.data));
  check_launch("dequantize_fp8");
  return wd;
}

void linear_fp8(Env& e, const Tensor& x, const LinearWeight& w, const Tensor* bias, const Tensor& y, float beta,
                const Tensor* c) {
  const char* op = "linear_fp8";
  check_dev(op, x, "x", DType::BF16);
  check_dev(op, w.w, "w", DType::F8E4M3);
  check_dev(op, w.scale, "scale", DType::F32);
  check_dev(op, y, "y", DType::BF16);
  const int64_t K = x.dim(-1), M = x.rows();
  if (c && c->data != y.data) check_dev(op, *c, "c", y.dtype);
  if (M == 0) return;
  const Fp8Path path = e.fp8_tensor_cores ? fp8_path(w) : Fp8Path::Dequantize;
  bool done = false;
  if (path != Fp8Path::Dequantize) {
    const int64_t G = path == Fp8Path::Block128 ? 128 : K, groups = (K + G - 1) / G, N = w.rows();
    // VEC128 / BLK128x128 take the tokens in a multiple of 4 and the weight's K blocks at a stride that is one: x is
    // quantized into M4 rows (the rest zero, scale 0) and the GEMM writes M4 rows into a scratch when M % 4 != 0;
    // the weight scales [nb, kb] are copied at a row stride of kb rounded up to 4 when kb % 4 != 0.
    const int64_t M4 = path == Fp8Path::Block128 ? (M + 3) / 4 * 4 : M;
    Tensor xq = e.alloc(DType::F8E4M3, {M4, K});
    Tensor xs = e.alloc(DType::F32, {groups, M4});  // group g's scales at g * M4 (token-major)
    if (M4 > M) {
      DFLASH_CUDA_CHECK(cudaMemsetAsync(xq.ptr<uint8_t>() + M * K, 0, static_cast<size_t>((M4 - M) * K), e.stream));
      DFLASH_CUDA_CHECK(cudaMemsetAsync(xs.data, 0, xs.nbytes(), e.stream));
    }
    const int64_t warps = M * groups;
    DFLASH_LAUNCH(static_cast<unsigned>((warps + 7) / 8), 256, 0, e.stream, k_quantize_rows)(
        static_cast<const bf16*>(x.data), M, K, G, M4, xq.ptr<uint8_t>(), xs.ptr<float>());
    check_launch("linear_fp8 (quantize x)");
    const float* ws = w.scale.ptr<float>();
    Tensor ws4;
    const int64_t nb = w.scale.shape[0], kb = w.scale.shape[1], kb4 = (kb + 3) / 4 * 4;
    if (path == Fp8Path::Block128 && kb4 != kb) {
      ws4 = e.alloc(DType::F32, {nb, kb4});
      DFLASH_CUDA_CHECK(cudaMemsetAsync(ws4.data, 0, ws4.nbytes(), e.stream));
      DFLASH_CUDA_CHECK(cudaMemcpy2DAsync(ws4.data, kb4 * sizeof(float), ws, kb * sizeof(float), kb * sizeof(float),
                                          nb, cudaMemcpyDeviceToDevice, e.stream));
      ws = ws4.ptr<float>();
    }
    const void* c_in = c ? c->data : y.data;
    Tensor yd = y;
    if (M4 > M) {  // the GEMM's M4 rows: C's M rows copied in first (beta != 0)
      yd = e.alloc(DType::BF16, {M4, N});
      if (beta != 0.0f)
        DFLASH_CUDA_CHECK(cudaMemcpyAsync(yd.data, c_in, y.nbytes(), cudaMemcpyDeviceToDevice, e.stream));
      c_in = yd.data;
    }
    done = lt_fp8(e, path, w, xq.data, xs.ptr<float>(), ws, M4, beta, c_in, yd);
    if (done && M4 > M)
      DFLASH_CUDA_CHECK(cudaMemcpyAsync(y.data, yd.data, y.nbytes(), cudaMemcpyDeviceToDevice, e.stream));
  }
  if (!done) {
    linear(e, x, dequantize_fp8(e, w), bias, y, beta, c);
    return;
  }
  if (bias) add_bias(e, y, *bias);
}

bool linear_fp8_on_tensor_cores(const LinearWeight& w) { return fp8_path(w) != Fp8Path::Dequantize; }

}  // namespace dflash::cuda
