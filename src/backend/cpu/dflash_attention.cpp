// cpu/dflash_attention.cpp — DFlash block attention (spec 2.3), forward and backward, without a dense mask:
// each query block j reads the context prefix [lo, a_j) and its own B block keys. Rows that see no key
// (padding blocks) output zeros and lse = -inf. Backward recomputes P from lse (FlashAttention-2 style):
//   P = exp(S - lse), dP = dO V^T, D = rowsum(dO * O), dS = P (dP - D), dQ = scale dS K, dK = scale dS^T Q,
//   dV = P^T dO.
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/ops.h"

namespace dflash::cpu {

namespace {

struct Geometry {
  int64_t S, N, B, nh, nkv, d, rep;
  const int32_t* anchors;
  const uint8_t* valid;
  int window;
  // Context key range [lo, hi) and the number of block keys visible to slot i of block j.
  void ranges(int64_t j, int64_t i, int64_t* lo, int64_t* hi, int64_t* nblk) const {
    const int64_t a = anchors[j];
    *hi = std::min<int64_t>(a, S);
    *lo = window > 0 ? std::max<int64_t>(0, a + i - (window - 1)) : 0;
    if (*lo > *hi) *lo = *hi;
    *nblk = window > 0 ? i + 1 : B;
  }
};

Geometry check_args(const char* op, const DFlashAttnArgs& a) {
  for (const Tensor* t : {&a.q, &a.k_ctx, &a.v_ctx, &a.k_blk, &a.v_blk}) check_float(op, *t, "q/k/v", a.q.dtype);
  DFLASH_CHECK(a.q.ndim() == 3 && a.k_ctx.ndim() == 3 && a.k_blk.ndim() == 3, op, ": q/k/v must be [T, heads, d]");
  Geometry g{};
  g.B = a.block_size;
  g.N = a.anchors.numel();
  g.S = a.k_ctx.dim(0);
  g.nh = a.q.dim(1);
  g.d = a.q.dim(2);
  g.nkv = a.k_ctx.dim(1);
  DFLASH_CHECK(g.B > 0 && a.q.dim(0) == g.N * g.B, op, ": q has ", a.q.dim(0), " rows, expected N*B = ", g.N, "*", g.B);
  DFLASH_CHECK(g.nkv > 0 && g.nh % g.nkv == 0, op, ": ", g.nh, " query heads not a multiple of ", g.nkv, " kv heads");
  DFLASH_CHECK(a.k_ctx.dim(2) == g.d && a.v_ctx.numel() == a.k_ctx.numel() && a.k_blk.dim(0) == g.N * g.B &&
                   a.k_blk.dim(1) == g.nkv && a.k_blk.dim(2) == g.d && a.v_blk.numel() == a.k_blk.numel(),
               op, ": shapes q ", shape_str(a.q.shape), " k_ctx ", shape_str(a.k_ctx.shape), " k_blk ",
               shape_str(a.k_blk.shape));
  DFLASH_CHECK(a.anchors.dtype == DType::I32 && a.valid.numel() == g.N && a.valid.dtype == DType::U8, op,
               ": anchors must be I32 [N] and valid U8 [N]");
  g.rep = g.nh / g.nkv;
  g.anchors = a.anchors.ptr<int32_t>();
  g.valid = a.valid.ptr<uint8_t>();
  g.window = a.window;
  for (int64_t j = 0; j < g.N; ++j)
    if (g.valid[j])
      DFLASH_CHECK(g.anchors[j] >= 0 && g.anchors[j] <= g.S, op, ": anchor ", g.anchors[j], " outside [0, ", g.S, "]");
  return g;
}

template <class T>
void forward_t(ThreadPool& tp, const DFlashAttnArgs& a, const Tensor& out, const Tensor& lse) {
  const Geometry g = check_args("dflash_attention", a);
  check_float("dflash_attention", out, "out", float_dtype<T>());
  check_float("dflash_attention", lse, "lse", float_dtype<T>());
  DFLASH_CHECK(out.numel() == a.q.numel() && lse.numel() == g.N * g.B * g.nh, "dflash_attention: out/lse shapes");
  const int64_t d = g.d;
  const T sc = static_cast<T>(a.scale);
  const T *q = a.q.ptr<T>(), *kc = a.k_ctx.ptr<T>(), *vc = a.v_ctx.ptr<T>();
  const T *kb = a.k_blk.ptr<T>(), *vb = a.v_blk.ptr<T>();
  T* o = out.ptr<T>();
  T* ls = lse.ptr<T>();
  tp.parallel_for(g.N * g.nh, 1, [&](int64_t b, int64_t e) {
    std::vector<T> s;
    std::vector<double> acc(static_cast<size_t>(d));
    for (int64_t jh = b; jh < e; ++jh) {
      const int64_t j = jh / g.nh, h = jh % g.nh, kvh = h / g.rep;
      for (int64_t i = 0; i < g.B; ++i) {
        const int64_t row = j * g.B + i;
        T* orow = o + (row * g.nh + h) * d;
        if (!g.valid[j]) {
          std::fill(orow, orow + d, T(0));
          ls[row * g.nh + h] = -std::numeric_limits<T>::infinity();
          continue;
        }
        int64_t lo, hi, nblk;
        g.ranges(j, i, &lo, &hi, &nblk);
        const int64_t nc = hi - lo;
        const T* qr = q + (row * g.nh + h) * d;
        auto key = [&](int64_t k) { return k < nc ? (lo + k) * g.nkv + kvh : (j * g.B + (k - nc)) * g.nkv + kvh; };
        s.assign(static_cast<size_t>(nc + nblk), T(0));
        T mx = -std::numeric_limits<T>::infinity();
        for (int64_t k = 0; k < nc + nblk; ++k) {
          const T* kr = (k < nc ? kc : kb) + key(k) * d;
          T dot = 0;
          for (int64_t t = 0; t < d; ++t) dot += qr[t] * kr[t];
          s[k] = dot * sc;
          mx = std::max(mx, s[k]);
        }
        double l = 0;
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t k = 0; k < nc + nblk; ++k) {
          const double p = std::exp(static_cast<double>(s[k] - mx));
          l += p;
          const T* vr = (k < nc ? vc : vb) + key(k) * d;
          for (int64_t t = 0; t < d; ++t) acc[t] += p * vr[t];
        }
        for (int64_t t = 0; t < d; ++t) orow[t] = static_cast<T>(acc[t] / l);
        ls[row * g.nh + h] = mx + static_cast<T>(std::log(l));
      }
    }
  });
}

template <class T>
void backward_t(ThreadPool& tp, const DFlashAttnArgs& a, const Tensor& out, const Tensor& lse, const Tensor& dout,
                const Tensor& dq, const Tensor& dk_ctx, const Tensor& dv_ctx, const Tensor& dk_blk,
                const Tensor& dv_blk) {
  const Geometry g = check_args("dflash_attention_backward", a);
  for (const Tensor* t : {&out, &lse, &dout, &dq, &dk_ctx, &dv_ctx, &dk_blk, &dv_blk})
    check_float("dflash_attention_backward", *t, "tensor", float_dtype<T>());
  DFLASH_CHECK(dq.numel() == a.q.numel() && dk_ctx.numel() == a.k_ctx.numel() && dv_ctx.numel() == a.v_ctx.numel() &&
                   dk_blk.numel() == a.k_blk.numel() && dv_blk.numel() == a.v_blk.numel() &&
                   dout.numel() == a.q.numel(),
               "dflash_attention_backward: gradient shapes differ from the inputs'");
  const int64_t d = g.d;
  const T sc = static_cast<T>(a.scale);
  const T *q = a.q.ptr<T>(), *kc = a.k_ctx.ptr<T>(), *vc = a.v_ctx.ptr<T>();
  const T *kb = a.k_blk.ptr<T>(), *vb = a.v_blk.ptr<T>();
  const T *o = out.ptr<T>(), *ls = lse.ptr<T>(), *dO = dout.ptr<T>();
  T *gq = dq.ptr<T>(), *gkc = dk_ctx.ptr<T>(), *gvc = dv_ctx.ptr<T>(), *gkb = dk_blk.ptr<T>(), *gvb = dv_blk.ptr<T>();
  std::fill(gq, gq + dq.numel(), T(0));
  std::fill(gkc, gkc + dk_ctx.numel(), T(0));
  std::fill(gvc, gvc + dv_ctx.numel(), T(0));
  std::fill(gkb, gkb + dk_blk.numel(), T(0));
  std::fill(gvb, gvb + dv_blk.numel(), T(0));
  // One task per kv head: everything a task writes (dq of its query heads, dk/dv of its kv head) is its own.
  tp.parallel_for(g.nkv, 1, [&](int64_t b, int64_t e) {
    for (int64_t kvh = b; kvh < e; ++kvh) {
      for (int64_t j = 0; j < g.N; ++j) {
        if (!g.valid[j]) continue;
        for (int64_t h = kvh * g.rep; h < (kvh + 1) * g.rep; ++h) {
          for (int64_t i = 0; i < g.B; ++i) {
            const int64_t row = j * g.B + i;
            int64_t lo, hi, nblk;
            g.ranges(j, i, &lo, &hi, &nblk);
            const int64_t nc = hi - lo;
            const T* qr = q + (row * g.nh + h) * d;
            const T* orow = o + (row * g.nh + h) * d;
            const T* dor = dO + (row * g.nh + h) * d;
            T* dqr = gq + (row * g.nh + h) * d;
            const T L = ls[row * g.nh + h];
            double Dr = 0;
            for (int64_t t = 0; t < d; ++t) Dr += static_cast<double>(dor[t]) * orow[t];
            for (int64_t k = 0; k < nc + nblk; ++k) {
              const bool ctx = k < nc;
              const int64_t kv = (ctx ? lo + k : j * g.B + (k - nc)) * g.nkv + kvh;
              const T* kr = (ctx ? kc : kb) + kv * d;
              const T* vr = (ctx ? vc : vb) + kv * d;
              T* dkr = (ctx ? gkc : gkb) + kv * d;
              T* dvr = (ctx ? gvc : gvb) + kv * d;
              T dot = 0, dp = 0;
              for (int64_t t = 0; t < d; ++t) {
                dot += qr[t] * kr[t];
                dp += dor[t] * vr[t];
              }
              const T P = std::exp(dot * sc - L);
              const T dS = P * (dp - static_cast<T>(Dr));
              for (int64_t t = 0; t < d; ++t) {
                dqr[t] += sc * dS * kr[t];
                dkr[t] += sc * dS * qr[t];
                dvr[t] += P * dor[t];
              }
            }
          }
        }
      }
    }
  });
}

}  // namespace

void dflash_attention(ThreadPool& tp, const DFlashAttnArgs& a, const Tensor& out, const Tensor& lse) {
  dispatch_float("dflash_attention", a.q.dtype, [&](auto tag) { forward_t<decltype(tag)>(tp, a, out, lse); });
}

void dflash_attention_backward(ThreadPool& tp, const DFlashAttnArgs& a, const Tensor& out, const Tensor& lse,
                               const Tensor& dout, const Tensor& dq, const Tensor& dk_ctx, const Tensor& dv_ctx,
                               const Tensor& dk_blk, const Tensor& dv_blk) {
  dispatch_float("dflash_attention_backward", a.q.dtype, [&](auto tag) {
    backward_t<decltype(tag)>(tp, a, out, lse, dout, dq, dk_ctx, dv_ctx, dk_blk, dv_blk);
  });
}

}  // namespace dflash::cpu
