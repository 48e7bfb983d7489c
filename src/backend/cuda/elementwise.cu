// cuda/elementwise.cu — dtype conversion, y += a*x, column copies, row gather/scatter, row argmax, sum of squares,
// and the argument checks shared by the CUDA ops.
//   convert:      F32 <-> BF16 (round to nearest even), elementwise.
//   add:          y += alpha * x, computed in fp32, stored in y's dtype (F32 or BF16).
//   copy_columns / gather_columns: one cudaMemcpy2DAsync (pitched copy), any dtype.
//   gather_rows / scatter_rows: dst[r] = src[rows[r]] / dst[rows[r]] = src[r]; bad indices set kErrGatherRow.
//   argmax:       one block per row, (value, index) reduction, first index on ties (as the CPU's strict '>').
//   scale_rows:   x[rows[r]] *= scale[r] in fp32, one rounding to x's dtype; rows must ascend strictly (kErrScaleRow).
//   sum_squares:  two-stage deterministic reduction in double: fixed per-block partials, then one block sums them
//                 in order (no atomics, so the result is bitwise reproducible).
#include <cstring>

#include "backend/cuda/common.cuh"

namespace dflash::cuda {

void check_on_dev(const char* op, const Tensor& t, const char* name) {
  DFLASH_CHECK(t.defined(), op, ": ", name, " is undefined");
  DFLASH_CHECK(t.device == Device::CUDA, op, ": ", name, " is on ", device_name(t.device), ", expected cuda");
}
void check_dev(const char* op, const Tensor& t, const char* name, DType dt) {
  check_on_dev(op, t, name);
  DFLASH_CHECK(t.dtype == dt, op, " (cuda): ", name, " has dtype ", dtype_name(t.dtype), ", expected ",
               dtype_name(dt));
}

std::string describe_error_bits(int bits) {
  std::string s;
  auto add = [&](int bit, const char* what) {
    if (bits & bit) s += (s.empty() ? "" : "; ") + std::string(what);
  };
  add(kErrEmbeddingId, "embedding: a token id is outside [0, vocab)");
  add(kErrGatherRow, "gather_rows / lm_head_loss: a row index is outside the source tensor");
  add(kErrLossLabel, "lm_head_loss: a label is outside [0, vocab)");
  add(kErrAnchor, "dflash_attention: a valid block's anchor is outside [0, S]");
  add(kErrExpertId, "moe_group: an expert id is outside [0, num_experts)");
  add(kErrScaleRow, "scale_rows: a row index is outside [0, rows) or not after the previous one (rows must ascend)");
  add(kErrSelectorId,
      "candidate_selector: a row index is outside [0, rows) (with gradients: or not after the previous one), or a "
      "predecessor / candidate id is outside [0, vocab)");
  if (s.empty()) s = cat("unknown device error bits ", bits);
  return s;
}

namespace {

constexpr int kThreads = 256;

__global__ void k_f32_to_bf16(const float* __restrict__ src, bf16* __restrict__ dst, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[i] = __float2bfloat16(src[i]);
}
__global__ void k_bf16_to_f32(const bf16* __restrict__ src, float* __restrict__ dst, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[i] = __bfloat162float(src[i]);
}

template <class T>
__global__ void k_add(T* y, const T* x, float alpha, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] = from_f<T>(to_f(y[i]) + alpha * to_f(x[i]));
}

// dst[r, c] = src[rows[r], c] (gather) or dst[rows[r], c] = src[r, c] (scatter); E is an unsigned type of the
// element's size. R index rows of C elements; the indexed side has Rs rows.
template <class E, bool kScatter>
__global__ void k_rows(E* __restrict__ dst, const E* __restrict__ src, const int* __restrict__ rows, int64_t R,
                       int64_t C, int64_t Rs, int* err) {
  const int64_t n = R * C;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / C, c = i - r * C;
    const int idx = rows[r];
    const bool ok = idx >= 0 && idx < Rs;
    if (!ok) {
      if (c == 0) atomicOr(err, kErrGatherRow);
      if (!kScatter) dst[i] = E(0);
      continue;
    }
    if (kScatter)
      dst[static_cast<int64_t>(idx) * C + c] = src[i];
    else
      dst[i] = src[static_cast<int64_t>(idx) * C + c];
  }
}

// x[rows[r], c] *= scale[r]; R listed rows of C elements, x has Rx rows. Each row is checked (at c == 0) to lie in
// [0, Rx) and after the previous one, so no two threads write one element.
template <class T>
__global__ void k_scale_rows(T* __restrict__ x, const int* __restrict__ rows, const float* __restrict__ scale,
                             int64_t R, int64_t C, int64_t Rx, int* err) {
  const int64_t n = R * C;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / C, c = i - r * C;
    const int idx = rows[r];
    if (idx < 0 || idx >= Rx || (r > 0 && idx <= rows[r - 1])) {
      if (c == 0) atomicOr(err, kErrScaleRow);
      continue;
    }
    T* p = x + static_cast<int64_t>(idx) * C + c;
    *p = from_f<T>(to_f(*p) * scale[r]);
  }
}

template <class T>
__global__ void k_argmax(const T* __restrict__ x, int* __restrict__ out, int64_t V) {
  __shared__ float s_val[32];
  __shared__ int s_idx[32];
  const T* row = x + static_cast<int64_t>(blockIdx.x) * V;
  float bv = -INFINITY;
  int bi = 0x7fffffff;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    const float xv = to_f(row[v]);
    if (bi == 0x7fffffff || xv > bv) {  // first element seen, or strictly larger (keeps the first index)
      bv = xv;
      bi = static_cast<int>(v);
    }
  }
  // (value, index) reduction: larger value wins, equal values keep the smaller index
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (ov > bv || (ov == bv && oi < bi) || (bi == 0x7fffffff && oi != 0x7fffffff)) {
      bv = ov;
      bi = oi;
    }
  }
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  if (lane == 0) {
    s_val[w] = bv;
    s_idx[w] = bi;
  }
  __syncthreads();
  if (w == 0) {
    bv = lane < nw ? s_val[lane] : -INFINITY;
    bi = lane < nw ? s_idx[lane] : 0x7fffffff;
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (ov > bv || (ov == bv && oi < bi) || (bi == 0x7fffffff && oi != 0x7fffffff)) {
        bv = ov;
        bi = oi;
      }
    }
    if (lane == 0) out[blockIdx.x] = bi == 0x7fffffff ? 0 : bi;
  }
}

template <class T>
__global__ void k_sumsq_partial(const T* __restrict__ x, int64_t n, double* __restrict__ partial) {
  __shared__ double scratch[32];
  double acc = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const double v = to_f(x[i]);
    acc += v * v;
  }
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// The same over F32 with n % 4 == 0, 16-byte aligned: one float4 per load (the optimizer's gradient norms).
__global__ void k_sumsq_partial_f32x4(const float4* __restrict__ x, int64_t n4, double* __restrict__ partial) {
  __shared__ double scratch[32];
  double acc = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n4;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float4 v = x[i];
    acc += static_cast<double>(v.x) * v.x + static_cast<double>(v.y) * v.y + static_cast<double>(v.z) * v.z +
           static_cast<double>(v.w) * v.w;
  }
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

__global__ void k_sum_final(const double* __restrict__ partial, int n, double* __restrict__ out) {
  __shared__ double scratch[32];
  double acc = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) acc += partial[i];
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) *out = acc;
}

template <class E>
void launch_rows(Env& e, bool scatter, void* dst, const void* src, const int* rows, int64_t R, int64_t C,
                 int64_t Rs) {
  const unsigned g = grid_for(R * C, kThreads, e.num_sms);
  if (scatter) {
    DFLASH_LAUNCH(g, kThreads, 0, e.stream, k_rows<E, true>)(static_cast<E*>(dst), static_cast<const E*>(src), rows,
                                                             R, C, Rs, e.err_flag);
  } else {
    DFLASH_LAUNCH(g, kThreads, 0, e.stream, k_rows<E, false>)(static_cast<E*>(dst), static_cast<const E*>(src),
                                                              rows, R, C, Rs, e.err_flag);
  }
  check_launch(scatter ? "scatter_rows" : "gather_rows");
}

void rows_op(Env& e, const char* op, bool scatter, const Tensor& dst, const Tensor& src, const Tensor& rows) {
  check_on_dev(op, dst, "dst");
  check_on_dev(op, src, "src");
  check_dev(op, rows, "rows", DType::I32);
  DFLASH_CHECK(dst.dtype == src.dtype, op, ": dst ", dtype_name(dst.dtype), " vs src ", dtype_name(src.dtype));
  const Tensor& idx_side = scatter ? dst : src;   // the side indexed by rows
  const Tensor& dense_side = scatter ? src : dst;  // the side with one row per index
  const int64_t R = rows.numel(), C = idx_side.dim(-1), Rs = idx_side.rows();
  DFLASH_CHECK(dense_side.rows() == R && dense_side.dim(-1) == C, op, ": ", shape_str(dense_side.shape), " for ", R,
               " rows of width ", C);
  if (R == 0 || C == 0) return;
  switch (dtype_size(src.dtype)) {
    case 1: launch_rows<uint8_t>(e, scatter, dst.data, src.data, rows.ptr<int>(), R, C, Rs); break;
    case 2: launch_rows<uint16_t>(e, scatter, dst.data, src.data, rows.ptr<int>(), R, C, Rs); break;
    case 4: launch_rows<uint32_t>(e, scatter, dst.data, src.data, rows.ptr<int>(), R, C, Rs); break;
    case 8: launch_rows<unsigned long long>(e, scatter, dst.data, src.data, rows.ptr<int>(), R, C, Rs); break;
    default: DFLASH_FAIL(op, ": unsupported element size");
  }
}

void pitched_copy(Env& e, const Tensor& dst, const Tensor& src, int64_t R, int64_t C, int64_t dst_ld,
                  int64_t dst_off, int64_t src_ld, int64_t src_off) {
  if (R == 0 || C == 0) return;
  const size_t es = dtype_size(src.dtype);
  DFLASH_CUDA_CHECK(cudaMemcpy2DAsync(static_cast<char*>(dst.data) + dst_off * es, dst_ld * es,
                                      static_cast<const char*>(src.data) + src_off * es, src_ld * es, C * es, R,
                                      cudaMemcpyDeviceToDevice, e.stream));
}

}  // namespace

void check_kernel_image(const std::string& device) {
#ifndef DFLASH_CUDA_EMU
  cudaFuncAttributes fa{};
  const cudaError_t err = cudaFuncGetAttributes(&fa, k_f32_to_bf16);
  if (err != cudaSuccess) {
    cudaGetLastError();
    DFLASH_FAIL(device, ": the driver cannot load this dflash build's kernels (", cudaGetErrorString(err),
                "): rebuild for this card (DFLASH_CUDA_ARCHS, docs/gpus.md) or update the driver");
  }
#else
  (void)device;
#endif
}

void convert(Env& e, const Tensor& dst, const Tensor& src) {
  check_on_dev("convert", dst, "dst");
  check_on_dev("convert", src, "src");
  DFLASH_CHECK(dst.numel() == src.numel(), "convert: ", shape_str(src.shape), " -> ", shape_str(dst.shape));
  const int64_t n = src.numel();
  if (n == 0) return;
  const unsigned g = grid_for(n, kThreads, e.num_sms);
  if (dst.dtype == src.dtype) {
    if (dst.data != src.data)
      DFLASH_CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, src.nbytes(), cudaMemcpyDeviceToDevice, e.stream));
  } else if (src.dtype == DType::F32 && dst.dtype == DType::BF16) {
    DFLASH_LAUNCH(g, kThreads, 0, e.stream, k_f32_to_bf16)(src.ptr<float>(), static_cast<bf16*>(dst.data), n);
    check_launch("f32_to_bf16");
  } else if (src.dtype == DType::BF16 && dst.dtype == DType::F32) {
    DFLASH_LAUNCH(g, kThreads, 0, e.stream, k_bf16_to_f32)(static_cast<const bf16*>(src.data), dst.ptr<float>(), n);
    check_launch("bf16_to_f32");
  } else {
    DFLASH_FAIL("copy on cuda: unsupported conversion ", dtype_name(src.dtype), " -> ", dtype_name(dst.dtype),
                " (F32 <-> BF16 only)");
  }
}

void add(Env& e, const Tensor& y, const Tensor& x, float alpha) {
  check_on_dev("add", y, "y");
  check_dev("add", x, "x", y.dtype);
  const int64_t n = y.numel();
  if (n == 0) return;
  const unsigned g = grid_for(n, kThreads, e.num_sms);
  if (y.dtype == DType::F32) {
    DFLASH_LAUNCH(g, kThreads, 0, e.stream, k_add<float>)(y.ptr<float>(), x.ptr<float>(), alpha, n);
  } else if (y.dtype == DType::BF16) {
    DFLASH_LAUNCH(g, kThreads, 0, e.stream, k_add<bf16>)(static_cast<bf16*>(y.data), static_cast<const bf16*>(x.data),
                                                         alpha, n);
  } else {
    DFLASH_FAIL("add (cuda): dtype ", dtype_name(y.dtype), " (F32 or BF16)");
  }
  check_launch("add");
}

void copy_columns(Env& e, const Tensor& dst, const Tensor& src, int64_t col0) {
  check_on_dev("copy_columns", dst, "dst");
  check_dev("copy_columns", src, "src", dst.dtype);
  const int64_t R = src.rows(), C = src.dim(-1), Ct = dst.dim(-1);
  pitched_copy(e, dst, src, R, C, Ct, col0, C, 0);
}

void gather_columns(Env& e, const Tensor& dst, const Tensor& src, int64_t col0) {
  check_on_dev("gather_columns", dst, "dst");
  check_dev("gather_columns", src, "src", dst.dtype);
  const int64_t R = dst.rows(), C = dst.dim(-1), Ct = src.dim(-1);
  pitched_copy(e, dst, src, R, C, C, 0, Ct, col0);
}

void gather_rows(Env& e, const Tensor& dst, const Tensor& src, const Tensor& rows) {
  rows_op(e, "gather_rows", false, dst, src, rows);
}
void scatter_rows(Env& e, const Tensor& dst, const Tensor& src, const Tensor& rows) {
  rows_op(e, "scatter_rows", true, dst, src, rows);
}

void scale_rows(Env& e, const Tensor& x, const Tensor& rows, const Tensor& scale) {
  check_on_dev("scale_rows", x, "x");
  check_dev("scale_rows", rows, "rows", DType::I32);
  check_dev("scale_rows", scale, "scale", DType::F32);
  const int64_t R = rows.numel(), C = x.dim(-1), Rx = x.rows();
  if (R == 0 || C == 0) return;
  const unsigned g = grid_for(R * C, kThreads, e.num_sms);
  if (x.dtype == DType::F32) {
    DFLASH_LAUNCH(g, kThreads, 0, e.stream, k_scale_rows<float>)(x.ptr<float>(), rows.ptr<int>(), scale.ptr<float>(),
                                                                 R, C, Rx, e.err_flag);
  } else if (x.dtype == DType::BF16) {
    DFLASH_LAUNCH(g, kThreads, 0, e.stream, k_scale_rows<bf16>)(static_cast<bf16*>(x.data), rows.ptr<int>(),
                                                                scale.ptr<float>(), R, C, Rx, e.err_flag);
  } else {
    DFLASH_FAIL("scale_rows (cuda): x has dtype ", dtype_name(x.dtype), " (F32 or BF16)");
  }
  check_launch("scale_rows");
}

void argmax(Env& e, const Tensor& x, const Tensor& out) {
  check_on_dev("argmax", x, "x");
  check_dev("argmax", out, "out", DType::I32);
  const int64_t R = x.rows(), V = x.dim(-1);
  DFLASH_CHECK(R < (int64_t{1} << 31), "argmax: too many rows");
  if (R == 0) return;
  DFLASH_CHECK(V > 0, "argmax: empty rows");
  if (x.dtype == DType::F32) {
    DFLASH_LAUNCH(static_cast<unsigned>(R), kThreads, 0, e.stream, k_argmax<float>)(x.ptr<float>(), out.ptr<int>(), V);
  } else if (x.dtype == DType::BF16) {
    DFLASH_LAUNCH(static_cast<unsigned>(R), kThreads, 0, e.stream, k_argmax<bf16>)(static_cast<const bf16*>(x.data),
                                                                                   out.ptr<int>(), V);
  } else {
    DFLASH_FAIL("argmax (cuda): dtype ", dtype_name(x.dtype), " (F32 or BF16)");
  }
  check_launch("argmax");
}

double sum_squares(Env& e, const Tensor& x) {
  check_on_dev("sum_squares", x, "x");
  const int64_t n = x.numel();
  if (n == 0) return 0.0;
  const int blocks = static_cast<int>(std::min<int64_t>(1024, (n + kThreads * 4 - 1) / (kThreads * 4)));
  Tensor partial = e.alloc(DType::F64, {blocks + 1});
  double* p = partial.ptr<double>();
  if (x.dtype == DType::F32 && n % 4 == 0 && reinterpret_cast<uintptr_t>(x.data) % 16 == 0) {
    DFLASH_LAUNCH(blocks, kThreads, 0, e.stream, k_sumsq_partial_f32x4)(static_cast<const float4*>(x.data), n / 4, p);
  } else if (x.dtype == DType::F32) {
    DFLASH_LAUNCH(blocks, kThreads, 0, e.stream, k_sumsq_partial<float>)(x.ptr<float>(), n, p);
  } else if (x.dtype == DType::BF16) {
    DFLASH_LAUNCH(blocks, kThreads, 0, e.stream, k_sumsq_partial<bf16>)(static_cast<const bf16*>(x.data), n, p);
  } else {
    DFLASH_FAIL("sum_squares (cuda): dtype ", dtype_name(x.dtype), " (F32 or BF16)");
  }
  check_launch("sum_squares_partial");
  DFLASH_LAUNCH(1, kThreads, 0, e.stream, k_sum_final)(p, blocks, p + blocks);
  check_launch("sum_squares_final");
  double out = 0;
  DFLASH_CUDA_CHECK(cudaMemcpyAsync(&out, p + blocks, sizeof(double), cudaMemcpyDeviceToHost, e.stream));
  DFLASH_CUDA_CHECK(cudaStreamSynchronize(e.stream));
  return out;
}

}  // namespace dflash::cuda
