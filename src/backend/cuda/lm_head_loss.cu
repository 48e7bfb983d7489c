// cuda/lm_head_loss.cu — fused, chunked lm_head + cross-entropy (+ KL to soft labels), spec 2.4.
// For each chunk of at most chunk_rows selected rows (so at most chunk_rows x V logits exist at once):
//   hx = h[rows]                                   (gather)
//   z  = hx W^T  (F32 [c, V], cuBLASLt),  zt = teacher_h W^T when soft labels are on
//   one block per row:  ce = logsumexp(z) - z_y;  correct = (argmax z == y, first index on ties)
//                       kl = sum p (log p - log q),  p = softmax(zt), q = softmax(z)
//                       dz = w c [(q - onehot(y)) + kl_weight (q - p)]   (BF16 [c, V], c = grad_scale)
//   dh[rows] = dz W  (cuBLASLt, BF16) scattered back (rows not selected are untouched).
// Per-row stats are kept on the device (double) and copied to the host once at the end (one synchronisation).
// Note: dz is rounded to BF16 before the dh product (the GEMM's operands are BF16), a relative error of at most
// 2^-9 per element of dz.
#include <algorithm>
#include <vector>

#include "backend/cuda/common.cuh"

namespace dflash::cuda {

namespace {

constexpr int kRowThreads = 512;

struct LossRowParams {
  const float* z;    // [c, V]
  const float* zt;   // [c, V] or null
  bf16* dz;          // [c, V] or null
  const int* labels;     // chunk's labels
  const float* weights;  // chunk's weights
  double* ce;            // chunk's outputs
  double* kl;
  unsigned char* correct;
  int64_t V;
  float kl_weight, grad_scale;
  int* err;
};

__global__ void __launch_bounds__(kRowThreads) k_loss_row(LossRowParams p) {
  __shared__ float s_f[32];
  __shared__ int s_i[32];
  __shared__ float s_tmp[32];
  const int64_t V = p.V;
  const int r = blockIdx.x;
  const float* z = p.z + static_cast<int64_t>(r) * V;
  const float* zt = p.zt ? p.zt + static_cast<int64_t>(r) * V : nullptr;
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, nw = blockDim.x >> 5;
  int y = p.labels[r];
  const bool y_ok = y >= 0 && y < V;
  if (!y_ok) {
    if (tid == 0) atomicOr(p.err, kErrLossLabel);
    y = -1;
  }

  // pass 1: max and first argmax of z; max of zt
  float bv = -INFINITY, tmax = -INFINITY;
  int bi = 0x7fffffff;
  for (int64_t v = tid; v < V; v += blockDim.x) {
    const float x = z[v];
    if (bi == 0x7fffffff || x > bv) {
      bv = x;
      bi = static_cast<int>(v);
    }
    if (zt) tmax = fmaxf(tmax, zt[v]);
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (ov > bv || (ov == bv && oi < bi)) {
      bv = ov;
      bi = oi;
    }
  }
  tmax = warp_max(tmax);
  if (lane == 0) {
    s_f[w] = bv;
    s_i[w] = bi;
    s_tmp[w] = tmax;
  }
  __syncthreads();
  {
    float v2 = lane < nw ? s_f[lane] : -INFINITY;
    int i2 = lane < nw ? s_i[lane] : 0x7fffffff;
    float t2 = lane < nw ? s_tmp[lane] : -INFINITY;
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, v2, o);
      const int oi = __shfl_xor_sync(0xffffffffu, i2, o);
      if (ov > v2 || (ov == v2 && oi < i2)) {
        v2 = ov;
        i2 = oi;
      }
    }
    t2 = warp_max(t2);
    bv = v2;  // every warp computes the same block-wide result
    bi = i2;
    tmax = t2;
  }
  const float mx = bv;
  const int am = bi;

  // pass 2: sums of exponentials
  float se = 0.f, tse = 0.f;
  for (int64_t v = tid; v < V; v += blockDim.x) {
    se += expf(z[v] - mx);
    if (zt) tse += expf(zt[v] - tmax);
  }
  se = block_sum(se, s_f);
  if (zt) tse = block_sum(tse, s_tmp);
  const float lse = mx + logf(se);
  const float tlse = zt ? tmax + logf(tse) : 0.f;

  // pass 3: KL(p || q)
  float kl = 0.f;
  if (zt) {
    for (int64_t v = tid; v < V; v += blockDim.x) {
      const float lp = zt[v] - tlse;
      kl += expf(lp) * (lp - (z[v] - lse));
    }
    kl = block_sum(kl, s_f);
  }

  // pass 4: dz
  if (p.dz) {
    const float coef = p.weights[r] * p.grad_scale;
    bf16* dz = p.dz + static_cast<int64_t>(r) * V;
    for (int64_t v = tid; v < V; v += blockDim.x) {
      const float q = expf(z[v] - lse);
      float gv = q - (v == y ? 1.f : 0.f);
      if (zt) gv += p.kl_weight * (q - expf(zt[v] - tlse));
      dz[v] = __float2bfloat16(coef * gv);
    }
  }
  if (tid == 0) {
    p.ce[r] = y_ok ? static_cast<double>(lse) - static_cast<double>(z[y]) : 0.0;
    p.kl[r] = static_cast<double>(kl);
    p.correct[r] = (y_ok && am == y) ? 1 : 0;
  }
}

}  // namespace

LossStats lm_head_loss(Env& e, const LossArgs& a) {
  const char* op = "lm_head_loss";
  check_dev(op, a.h, "h", DType::BF16);
  check_dev(op, a.lm_head, "lm_head", DType::BF16);
  check_dev(op, a.rows, "rows", DType::I32);
  check_dev(op, a.labels, "labels", DType::I32);
  check_dev(op, a.weights, "weights", DType::F32);
  const int64_t H = a.h.dim(-1), V = a.lm_head.dim(0), R = a.h.rows(), Rs = a.rows.numel();
  DFLASH_CHECK(a.lm_head.ndim() == 2 && a.lm_head.dim(1) == H, op, ": lm_head ", shape_str(a.lm_head.shape),
               " vs hidden ", H);
  DFLASH_CHECK(a.labels.numel() == Rs && a.weights.numel() == Rs, op, ": rows/labels/weights of equal length");
  DFLASH_CHECK(V < (int64_t{1} << 31), op, ": vocabulary too large");
  const bool teacher = a.teacher_h.defined();
  if (teacher) {
    check_dev(op, a.teacher_h, "teacher_h", DType::BF16);
    DFLASH_CHECK(a.teacher_h.rows() == Rs && a.teacher_h.dim(-1) == H, op, ": teacher_h ",
                 shape_str(a.teacher_h.shape), " for ", Rs, " rows");
  }
  const bool grad = a.dh.defined();
  if (grad) {
    check_dev(op, a.dh, "dh", DType::BF16);
    DFLASH_CHECK(a.dh.numel() == a.h.numel(), op, ": dh ", shape_str(a.dh.shape), " vs h ", shape_str(a.h.shape));
  }
  LossStats st;
  st.ce.assign(static_cast<size_t>(Rs), 0.0);
  st.kl.assign(static_cast<size_t>(Rs), 0.0);
  st.correct.assign(static_cast<size_t>(Rs), 0);
  if (Rs == 0) return st;

  const int64_t C = std::min<int64_t>(std::max<int64_t>(1, a.chunk_rows), Rs);
  Tensor ce = e.alloc(DType::F64, {Rs}), kl = e.alloc(DType::F64, {Rs}), correct = e.alloc(DType::U8, {Rs});
  Tensor hx = e.alloc(DType::BF16, {C, H});
  Tensor z = e.alloc(DType::F32, {C, V});
  Tensor zt = teacher ? e.alloc(DType::F32, {C, V}) : Tensor{};
  Tensor dz = grad ? e.alloc(DType::BF16, {C, V}) : Tensor{};
  Tensor dhr = grad ? e.alloc(DType::BF16, {C, H}) : Tensor{};
  for (int64_t c0 = 0; c0 < Rs; c0 += C) {
    const int64_t c = std::min(C, Rs - c0);
    const Tensor rows_c = a.rows.slice(c0, c0 + c);
    const Tensor hx_c = hx.slice(0, c);
    gather_rows(e, hx_c, a.h.reshape({R, H}), rows_c);
    gemm(e, false, true, c, V, H, hx_c.data, H, a.lm_head.data, H, 0.f, z.data, DType::F32, V);
    if (teacher) {
      const Tensor th = a.teacher_h.reshape({Rs, H}).slice(c0, c0 + c);
      gemm(e, false, true, c, V, H, th.data, H, a.lm_head.data, H, 0.f, zt.data, DType::F32, V);
    }
    LossRowParams p{};
    p.z = z.ptr<float>();
    p.zt = teacher ? zt.ptr<float>() : nullptr;
    p.dz = grad ? static_cast<bf16*>(dz.data) : nullptr;
    p.labels = a.labels.ptr<int>() + c0;
    p.weights = a.weights.ptr<float>() + c0;
    p.ce = ce.ptr<double>() + c0;
    p.kl = kl.ptr<double>() + c0;
    p.correct = correct.ptr<uint8_t>() + c0;
    p.V = V;
    p.kl_weight = teacher ? a.kl_weight : 0.f;
    p.grad_scale = a.grad_scale;
    p.err = e.err_flag;
    DFLASH_LAUNCH(static_cast<unsigned>(c), kRowThreads, 0, e.stream, k_loss_row)(p);
    check_launch("lm_head_loss_rows");
    if (grad) {
      // dh_rows[c, H] = dz[c, V] W[V, H]
      gemm(e, false, false, c, H, V, dz.data, V, a.lm_head.data, H, 0.f, dhr.data, DType::BF16, H);
      scatter_rows(e, a.dh.reshape({R, H}), dhr.slice(0, c), rows_c);
    }
  }
  DFLASH_CUDA_CHECK(cudaMemcpyAsync(st.ce.data(), ce.data, Rs * sizeof(double), cudaMemcpyDeviceToHost, e.stream));
  DFLASH_CUDA_CHECK(cudaMemcpyAsync(st.kl.data(), kl.data, Rs * sizeof(double), cudaMemcpyDeviceToHost, e.stream));
  DFLASH_CUDA_CHECK(cudaMemcpyAsync(st.correct.data(), correct.data, Rs, cudaMemcpyDeviceToHost, e.stream));
  DFLASH_CUDA_CHECK(cudaStreamSynchronize(e.stream));
  return st;
}

}  // namespace dflash::cuda
