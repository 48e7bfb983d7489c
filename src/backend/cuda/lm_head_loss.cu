// cuda/lm_head_loss.cu — fused, chunked lm_head + cross-entropy (+ KL to soft labels), spec 2.4.
// For each chunk of at most chunk_rows selected rows (so at most chunk_rows x V logits exist at once):
//   hx = h[rows]                                   (gather)
//   z  = hx W^T  (BF16 [c, V], cuBLASLt, fp32 accumulation),  zt = teacher_h W^T when soft labels are on
//   k_topk (LossArgs::topk > 0), one block per row: the topk largest logits, the fp32 values of the bf16 z the loss
//                       sees (descending, ties to the lower id; z is never modified: dz has its own buffer)
//   k_loss_row, one block per row (a grid of num_sms blocks walking the rows), two passes over the row: online
//   log-sum-exp, then KL and dz:
//                       ce = logsumexp(z) - z_y;  correct = (argmax z == y, first index on ties)
//                       kl = sum p (log p - log q),  p = softmax(zt), q = softmax(z)
//                       dz = w c [(q - onehot(y)) + kl_weight (q - p)]   (BF16 [c, V], c = grad_scale)
//   dh[rows] = dz W  (cuBLASLt, BF16) scattered back (rows not selected are untouched).
// Per-row stats are kept on the device (double) and copied to the host once at the end (one synchronisation).
// Rounding: the logits are the GEMM's fp32 sums rounded to BF16, as in PyTorch's bf16 lm_head (bench/torch_ref.py)
// and the CPU backend in bf16 (cpu/lm_head_loss.cpp computes z in T): a relative error of at most 2^-8 per logit.
// The softmax, sums and KL are fp32 / double from there. dz is rounded to BF16 before the dh product (the GEMM's
// operands are BF16). bench/NOTES.md 10 and 12: the row kernel reads each bf16 logit twice and writes dz once; with
// one row per SM in flight (132 x 304 KB for Qwen3's V = 151936) and L2 eviction hints, pass 2 finds most of its row
// in L2 (ncu, one 1024-row chunk: 405 MB read from DRAM for 311 MB of logits, 256 us).
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cuda/common.cuh"

namespace dflash::cuda {

namespace {

constexpr int kRowThreads = 1024;

struct LossRowParams {
  const bf16* z;     // [c, V]
  const bf16* zt;    // [c, V] or null
  bf16* dz;          // [c, V] or null
  const int* labels;     // chunk's labels
  const float* weights;  // chunk's weights
  double* ce;            // chunk's outputs
  double* kl;
  unsigned char* correct;
  int64_t V;
  int rows;
  float kl_weight, grad_scale;
  int* err;
};

constexpr float kL2e = 1.4426950408889634f;
// e^x as 2^(x log2 e) on the special-function unit (ex2.approx.ftz: relative error ~2^-22; results below 2^-126
// flushed to zero, which no sum here notices).
__device__ __forceinline__ float fast_exp(float x) {
#ifdef DFLASH_CUDA_EMU
  return std::exp2(x * kL2e);
#else
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x * kL2e));
  return y;
#endif
}

// 16-byte load with an L2 eviction priority: pass 1 marks the row evict_last so that pass 2, which reads it again
// right after, finds it in L2; pass 2 marks it evict_first (PTX ISA: createpolicy, ld .L2::cache_hint).
template <bool LAST>
__device__ __forceinline__ uint4 ld_row16(const uint4* p) {
#ifdef DFLASH_CUDA_EMU
  return *p;
#else
  uint64_t pol;
  if constexpr (LAST)
    asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(pol));
  else
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(pol));
  uint4 v;
  asm volatile("ld.global.nc.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p), "l"(pol));
  return v;
#endif
}

// Online log-sum-exp state (Milakov & Gimelshein 2018, "Online normalizer calculation for softmax"): running max m,
// sum of exp(x - m), and the first index of the max.
struct Lse {
  float m = -INFINITY, s = 0.f;
  int i = 0x7fffffff;
  // eight consecutive values from index i0 (one max update, then the eight terms)
  __device__ __forceinline__ void add8(const float (&x)[8], int i0) {
    float lm = x[0];
    int li = i0;
    DFLASH_UNROLL
    for (int k = 1; k < 8; ++k)
      if (x[k] > lm) {
        lm = x[k];
        li = i0 + k;
      }
    if (lm > m) {
      s *= fast_exp(m - lm);  // (m = -inf: s = 0 stays 0)
      m = lm;
      i = li;
    }
    float t = 0.f;
    DFLASH_UNROLL
    for (int k = 0; k < 8; ++k) t += fast_exp(x[k] - m);
    s += t;
  }
  __device__ __forceinline__ void add1(float x, int xi) {
    if (x > m) {
      s *= fast_exp(m - x);
      m = x;
      i = xi;
    }
    s += fast_exp(x - m);
  }
  // the union of two states; ties keep the smaller index
  __device__ __forceinline__ void merge(float om, float os, int oi) {
    const float M = fmaxf(m, om);
    const float a = m == M ? 1.f : fast_exp(m - M), b = om == M ? 1.f : fast_exp(om - M);
    s = s * a + os * b;
    if (om > m || (om == m && oi < i)) i = oi;
    m = M;
  }
  // the whole block's state in every thread (scratch: 3 x 32 words of shared memory)
  __device__ __forceinline__ void block_reduce(float* sm, float* ss, int* si) {
    for (int o = 16; o > 0; o >>= 1)
      merge(__shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o), __shfl_xor_sync(0xffffffffu, i, o));
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();  // (scratch reuse)
    if (lane == 0) {
      sm[w] = m;
      ss[w] = s;
      si[w] = i;
    }
    __syncthreads();
    m = lane < nw ? sm[lane] : -INFINITY;
    s = lane < nw ? ss[lane] : 0.f;
    i = lane < nw ? si[lane] : 0x7fffffff;
    for (int o = 16; o > 0; o >>= 1)
      merge(__shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o), __shfl_xor_sync(0xffffffffu, i, o));
  }
};

// Calls f8(v, x) for the groups of 8 logits of a row of V (16-byte loads, four in flight per thread, when V % 8 == 0;
// thread tid takes groups tid, tid + blockDim.x, ...), else f1(v, x) for one logit at a time.
template <bool LAST, class F8, class F1>
__device__ __forceinline__ void row_for_each(const bf16* row, int64_t V, F8 f8, F1 f1) {
  if ((V & 7) == 0) {
    constexpr int U = 4;  // loads in flight per thread: one block per SM needs ~64 KB in flight to reach bandwidth
    const uint4* r8 = reinterpret_cast<const uint4*>(row);
    const int n8 = static_cast<int>(V / 8), nt = blockDim.x;
    int gi = threadIdx.x;
    float x[8];
    for (; gi + (U - 1) * nt < n8; gi += U * nt) {
      uint4 a[U];
      DFLASH_UNROLL
      for (int u = 0; u < U; ++u) a[u] = ld_row16<LAST>(r8 + gi + u * nt);
      DFLASH_UNROLL
      for (int u = 0; u < U; ++u) {
        bf16x8_to_f(a[u], x);
        f8((gi + u * nt) * 8, x);
      }
    }
    for (; gi < n8; gi += nt) {
      bf16x8_to_f(ld_row16<LAST>(r8 + gi), x);
      f8(gi * 8, x);
    }
  } else {
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) f1(static_cast<int>(v), __bfloat162float(row[v]));
  }
}

// Blocks walk the rows (r = blockIdx.x, + gridDim.x, ...), two passes over each: (1) online max / first argmax / sum
// of exp of z (and of zt), (2) KL and dz: each row read twice, at memory bandwidth (bench/NOTES.md 10).
__global__ void __launch_bounds__(kRowThreads) k_loss_row(LossRowParams p) {
  __shared__ float s_m[32], s_s[32];
  __shared__ int s_i[32];
  const int64_t V = p.V;
  const int tid = threadIdx.x;
  for (int r = blockIdx.x; r < p.rows; r += gridDim.x) {
    const bf16* z = p.z + static_cast<int64_t>(r) * V;
    const bf16* zt = p.zt ? p.zt + static_cast<int64_t>(r) * V : nullptr;
    int y = p.labels[r];
    const bool y_ok = y >= 0 && y < V;
    if (!y_ok) {
      if (tid == 0) atomicOr(p.err, kErrLossLabel);
      y = -1;
    }

    // pass 1
    Lse q, t;
    row_for_each<true>(z, V, [&](int v, const float (&x)[8]) { q.add8(x, v); }, [&](int v, float x) { q.add1(x, v); });
    if (zt)
      row_for_each<true>(zt, V, [&](int v, const float (&x)[8]) { t.add8(x, v); }, [&](int v, float x) { t.add1(x, v); });
    q.block_reduce(s_m, s_s, s_i);
    if (zt) t.block_reduce(s_m, s_s, s_i);
    const float lse = q.m + logf(q.s);
    const float tlse = zt ? t.m + logf(t.s) : 0.f;
    const int am = q.i;

    // pass 2: KL(p || q) = sum p (log p - log q) with p = softmax(zt), q = softmax(z); dz = coef [(q - onehot(y)) +
    // kl_weight (q - p)]
    float kl = 0.f;
    if (zt || p.dz) {
      const float coef = p.weights[r] * p.grad_scale, klw = p.kl_weight;
      bf16* dz = p.dz ? p.dz + static_cast<int64_t>(r) * V : nullptr;
      auto one = [&](float zv, int v, float ztv) -> float {  // dz's value before coef
        const float lq = zv - lse, qv = fast_exp(lq);
        float gv = qv - (v == y ? 1.f : 0.f);
        if (zt) {
          const float lp = ztv - tlse, pv = fast_exp(lp);
          kl += pv * (lp - lq);
          gv += klw * (qv - pv);
        }
        return coef * gv;
      };
      row_for_each<false>(
          z, V,
          [&](int v, const float (&x)[8]) {
            float xt[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f}, g[8];
            if (zt) bf16x8_to_f(ld_row16<false>(reinterpret_cast<const uint4*>(zt + v)), xt);
            DFLASH_UNROLL
            for (int k = 0; k < 8; ++k) g[k] = one(x[k], v + k, xt[k]);
            if (dz) *reinterpret_cast<uint4*>(dz + v) = f_to_bf16x8(g);
          },
          [&](int v, float x) {
            const float g = one(x, v, zt ? __bfloat162float(zt[v]) : 0.f);
            if (dz) dz[v] = __float2bfloat16(g);
          });
      if (zt) kl = block_sum(kl, s_m);
    }
    if (tid == 0) {
      p.ce[r] = y_ok ? static_cast<double>(lse) - static_cast<double>(__bfloat162float(z[y])) : 0.0;
      p.kl[r] = static_cast<double>(kl);
      p.correct[r] = (y_ok && am == y) ? 1 : 0;
    }
    __syncthreads();  // (s_m .. s_i are reused by the next row)
  }
}

// ---- top-k (LossArgs::topk: DFlash2's candidates) ------------------------------------------------------------------
// k_topk: one CTA of kTopkThreads per row of the chunk's bf16 logits, read once (row_for_each: 16-byte loads, each
// thread its groups of 8 in increasing id). Each thread keeps the KM >= k largest values of its slice sorted in
// registers (descending; a value enters only above the list's last one and goes after equal ones, which have lower
// ids: ties to the lower id). Then k rounds of a block-wide (value descending, id ascending) argmax over the
// threads' list heads write the winner and pop it from its thread's list. Work per thread: V / 256 compares plus an
// insertion of ~KM selects for each value that beats its current KM-th largest (about KM ln(V / 256 KM) + KM of
// them for logits in no particular id order). NaN logits are never picked.
constexpr int kTopkThreads = 256;

template <int KM>
struct TopList {
  float v[KM];
  int id[KM];
  __device__ __forceinline__ void init() {
    DFLASH_UNROLL
    for (int i = 0; i < KM; ++i) {
      v[i] = -INFINITY;
      id[i] = 0x7fffffff;
    }
  }
  // x with an id above every id in the list
  __device__ __forceinline__ void add(float x, int xi) {
    if (!(x > v[KM - 1])) return;
    DFLASH_UNROLL
    for (int i = KM - 1; i > 0; --i) {  // v[i] is still the old value when step i reads it
      if (x > v[i - 1]) {
        v[i] = v[i - 1];
        id[i] = id[i - 1];
      } else if (x > v[i]) {
        v[i] = x;
        id[i] = xi;
      }
    }
    if (x > v[0]) {
      v[0] = x;
      id[0] = xi;
    }
  }
  __device__ __forceinline__ void pop() {
    DFLASH_UNROLL
    for (int i = 0; i + 1 < KM; ++i) {
      v[i] = v[i + 1];
      id[i] = id[i + 1];
    }
    v[KM - 1] = -INFINITY;
    id[KM - 1] = 0x7fffffff;
  }
};

// (v, i) = the larger of the warp's pairs, by value, then by lower id; every lane gets it.
__device__ __forceinline__ void warp_argmax(float& v, int& i) {
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (ov > v || (ov == v && oi < i)) {
      v = ov;
      i = oi;
    }
  }
}

// Row r of z [rows, V]: ids / vals [rows, k] (the chunk's rows).
template <int KM>
__global__ void __launch_bounds__(kTopkThreads) k_topk(const bf16* z, int64_t V, int k, int* ids, float* vals) {
  __shared__ float s_v[32];
  __shared__ int s_i[32];
  __shared__ int s_win;
  const int64_t r = blockIdx.x;
  TopList<KM> t;
  t.init();
  row_for_each<false>(
      z + r * V, V,
      [&](int v, const float (&x)[8]) {
        DFLASH_UNROLL
        for (int u = 0; u < 8; ++u) t.add(x[u], v + u);
      },
      [&](int v, float x) { t.add(x, v); });
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int j = 0; j < k; ++j) {
    float bv = t.v[0];
    int bi = t.id[0];
    warp_argmax(bv, bi);
    if (lane == 0) {
      s_v[w] = bv;
      s_i[w] = bi;
    }
    __syncthreads();
    if (w == 0) {
      bv = lane < nw ? s_v[lane] : -INFINITY;
      bi = lane < nw ? s_i[lane] : 0x7fffffff;
      warp_argmax(bv, bi);
      if (lane == 0) {
        s_win = bi;
        ids[r * k + j] = bi;
        vals[r * k + j] = bv;
      }
    }
    __syncthreads();
    if (t.id[0] == s_win) t.pop();  // ids are distinct: one thread holds the winner
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
  DFLASH_CHECK(V < (int64_t{1} << 31), op, ": vocabulary too large");
  const bool teacher = a.teacher_h.defined();
  if (teacher) check_dev(op, a.teacher_h, "teacher_h", DType::BF16);
  const int64_t K = a.topk;
  if (K > 0) {
    DFLASH_CHECK(K <= 32, op, ": topk ", K, " for a ", V, "-token vocabulary (the CUDA top-k takes at most 32)");
    check_dev(op, a.topk_ids, "topk_ids", DType::I32);
    check_dev(op, a.topk_logits, "topk_logits", DType::F32);
  }
  const bool grad = a.dh.defined();
  if (grad) check_dev(op, a.dh, "dh", DType::BF16);
  LossStats st;
  st.ce.assign(static_cast<size_t>(Rs), 0.0);
  st.kl.assign(static_cast<size_t>(Rs), 0.0);
  st.correct.assign(static_cast<size_t>(Rs), 0);
  if (Rs == 0) return st;

  const int64_t C = std::min<int64_t>(std::max<int64_t>(1, a.chunk_rows), Rs);
  Tensor ce = e.alloc(DType::F64, {Rs}), kl = e.alloc(DType::F64, {Rs}), correct = e.alloc(DType::U8, {Rs});
  Tensor hx = e.alloc(DType::BF16, {C, H});
  Tensor z = e.alloc(DType::BF16, {C, V});
  Tensor zt = teacher ? e.alloc(DType::BF16, {C, V}) : Tensor{};
  Tensor dz = grad ? e.alloc(DType::BF16, {C, V}) : Tensor{};
  Tensor dhr = grad ? e.alloc(DType::BF16, {C, H}) : Tensor{};
  for (int64_t c0 = 0; c0 < Rs; c0 += C) {
    const int64_t c = std::min(C, Rs - c0);
    const Tensor rows_c = a.rows.slice(c0, c0 + c);
    const Tensor hx_c = hx.slice(0, c);
    gather_rows(e, hx_c, a.h.reshape({R, H}), rows_c);
    gemm(e, false, true, c, V, H, hx_c.data, H, a.lm_head.data, H, 0.f, z.data, DType::BF16, V);
    if (K > 0) {
      const bf16* zc = static_cast<const bf16*>(z.data);
      int* ids = a.topk_ids.ptr<int>() + c0 * K;
      float* vals = a.topk_logits.ptr<float>() + c0 * K;
      const unsigned grid = static_cast<unsigned>(c);
      if (K <= 16)
        DFLASH_LAUNCH(grid, kTopkThreads, 0, e.stream, k_topk<16>)(zc, V, static_cast<int>(K), ids, vals);
      else
        DFLASH_LAUNCH(grid, kTopkThreads, 0, e.stream, k_topk<32>)(zc, V, static_cast<int>(K), ids, vals);
      check_launch("lm_head_loss_topk");
    }
    if (teacher) {
      const Tensor th = a.teacher_h.reshape({Rs, H}).slice(c0, c0 + c);
      gemm(e, false, true, c, V, H, th.data, H, a.lm_head.data, H, 0.f, zt.data, DType::BF16, V);
    }
    LossRowParams p{};
    p.z = static_cast<const bf16*>(z.data);
    p.zt = teacher ? static_cast<const bf16*>(zt.data) : nullptr;
    p.dz = grad ? static_cast<bf16*>(dz.data) : nullptr;
    p.labels = a.labels.ptr<int>() + c0;
    p.weights = a.weights.ptr<float>() + c0;
    p.ce = ce.ptr<double>() + c0;
    p.kl = kl.ptr<double>() + c0;
    p.correct = correct.ptr<uint8_t>() + c0;
    p.V = V;
    p.rows = static_cast<int>(c);
    p.kl_weight = teacher ? a.kl_weight : 0.f;
    p.grad_scale = a.grad_scale;
    p.err = e.err_flag;
    // one block of 1024 threads per SM (63 registers each): ~num_sms rows in flight, whose pass 2 finds them in L2
    const int64_t grid = std::min<int64_t>(c, std::max(1, e.num_sms));
    DFLASH_LAUNCH(static_cast<unsigned>(grid), kRowThreads, 0, e.stream, k_loss_row)(p);
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
