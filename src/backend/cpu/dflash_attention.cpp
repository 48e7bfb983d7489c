// cpu/dflash_attention.cpp — DFlash block attention (spec 2.3), forward and backward, without a dense mask:
// each query block j reads the context prefix [lo, a_j) and its own B block keys; per (block, head) the scores
// [B, a_j + B] and the products go through ?gemm (memory linear in S). Rows that see no key
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
  Geometry g{};
  g.B = a.block_size;
  g.N = a.anchors.numel();
  g.S = a.k_ctx.dim(0);
  g.nh = a.q.dim(1);
  g.d = a.q.dim(2);
  g.nkv = a.k_ctx.dim(1);
  g.rep = g.nh / g.nkv;
  g.anchors = a.anchors.ptr<int32_t>();
  g.valid = a.valid.ptr<uint8_t>();
  g.window = a.window;
  for (int64_t j = 0; j < g.N; ++j)
    if (g.valid[j])
      DFLASH_CHECK(g.anchors[j] >= 0 && g.anchors[j] <= g.S, op, ": anchor ", g.anchors[j], " outside [0, ", g.S, "]");
  return g;
}

// Scores of one (block j, query head h): S[B, nc + B] = Q_j K^T over the visible context keys [lo, lo + nc) and
// the block's own B keys, through two ?gemm calls. Rows are then masked for the sliding-window option.
template <class T>
struct BlockView {
  const T* q;   // first query row of block j, head h; row stride nh*d
  const T* kc;  // context key lo, kv head g; row stride nkv*d
  const T* vc;
  const T* kb;  // block key 0 of block j, kv head g; row stride nkv*d
  const T* vb;
  int64_t nc, ld_q, ld_kv;
};

template <class T>
void scores(const BlockView<T>& v, int64_t B, int64_t d, T* s) {
  const int64_t n = v.nc + B;
  if (v.nc > 0) gemm(false, true, B, v.nc, d, v.q, v.ld_q, v.kc, v.ld_kv, T(0), s, n);
  gemm(false, true, B, B, d, v.q, v.ld_q, v.kb, v.ld_kv, T(0), s + v.nc, n);
}

template <class T>
void forward_t(ThreadPool& tp, const DFlashAttnArgs& a, const Tensor& out, const Tensor& lse) {
  const Geometry g = check_args("dflash_attention", a);
  check_float("dflash_attention", out, "out", float_dtype<T>());
  check_float("dflash_attention", lse, "lse", float_dtype<T>());
  const int64_t d = g.d, B = g.B;
  const T sc = static_cast<T>(a.scale);
  const T *q = a.q.ptr<T>(), *kc = a.k_ctx.ptr<T>(), *vc = a.v_ctx.ptr<T>();
  const T *kb = a.k_blk.ptr<T>(), *vb = a.v_blk.ptr<T>();
  T* o = out.ptr<T>();
  T* ls = lse.ptr<T>();
  tp.parallel_for(g.N * g.nh, 1, [&](int64_t b, int64_t e) {
    std::vector<T> s, ob(static_cast<size_t>(B * d));
    for (int64_t jh = b; jh < e; ++jh) {
      const int64_t j = jh / g.nh, h = jh % g.nh, kvh = h / g.rep;
      if (!g.valid[j]) {
        for (int64_t i = 0; i < B; ++i) {
          std::fill_n(o + ((j * B + i) * g.nh + h) * d, d, T(0));
          ls[(j * B + i) * g.nh + h] = -std::numeric_limits<T>::infinity();
        }
        continue;
      }
      int64_t lo, hi, nblk;
      g.ranges(j, B - 1, &lo, &hi, &nblk);
      lo = g.window > 0 ? std::max<int64_t>(0, std::min<int64_t>(hi, g.anchors[j] - (g.window - 1))) : 0;
      const BlockView<T> v{q + (j * B * g.nh + h) * d, kc + (lo * g.nkv + kvh) * d, vc + (lo * g.nkv + kvh) * d,
                           kb + (j * B * g.nkv + kvh) * d, vb + (j * B * g.nkv + kvh) * d, hi - lo,
                           g.nh * d, g.nkv * d};
      const int64_t n = v.nc + B;
      s.resize(static_cast<size_t>(B * n));
      scores(v, B, d, s.data());
      for (int64_t i = 0; i < B; ++i) {
        int64_t rlo, rhi, rblk;
        g.ranges(j, i, &rlo, &rhi, &rblk);
        T* sr = s.data() + i * n;
        auto visible = [&](int64_t k) { return k < v.nc ? lo + k >= rlo : k - v.nc < rblk; };
        T mx = -std::numeric_limits<T>::infinity();
        for (int64_t k = 0; k < n; ++k)
          if (visible(k)) mx = std::max(mx, sr[k] * sc);
        T l = 0;
        for (int64_t k = 0; k < n; ++k) l += sr[k] = visible(k) ? std::exp(sr[k] * sc - mx) : T(0);
        for (int64_t k = 0; k < n; ++k) sr[k] /= l;
        ls[(j * B + i) * g.nh + h] = mx + std::log(l);
      }
      // O_j = P_ctx V_ctx + P_blk V_blk
      if (v.nc > 0) gemm(false, false, B, d, v.nc, s.data(), n, v.vc, v.ld_kv, T(0), ob.data(), d);
      gemm(false, false, B, d, B, s.data() + v.nc, n, v.vb, v.ld_kv, v.nc > 0 ? T(1) : T(0), ob.data(), d);
      for (int64_t i = 0; i < B; ++i) std::copy_n(ob.data() + i * d, d, o + ((j * B + i) * g.nh + h) * d);
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
  const int64_t d = g.d, B = g.B;
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
  const int64_t ldq = g.nh * d, ldk = g.nkv * d;
  // One task per kv head: everything a task writes (dq of its query heads, dk/dv of its kv head) is its own.
  tp.parallel_for(g.nkv, 1, [&](int64_t b, int64_t e) {
    std::vector<T> P, dP;
    for (int64_t kvh = b; kvh < e; ++kvh) {
      for (int64_t j = 0; j < g.N; ++j) {
        if (!g.valid[j]) continue;
        for (int64_t h = kvh * g.rep; h < (kvh + 1) * g.rep; ++h) {
          int64_t lo, hi, nblk;
          g.ranges(j, B - 1, &lo, &hi, &nblk);
          lo = g.window > 0 ? std::max<int64_t>(0, std::min<int64_t>(hi, g.anchors[j] - (g.window - 1))) : 0;
          const int64_t q0 = (j * B * g.nh + h) * d, kc0 = (lo * g.nkv + kvh) * d, kb0 = (j * B * g.nkv + kvh) * d;
          const BlockView<T> v{q + q0, kc + kc0, vc + kc0, kb + kb0, vb + kb0, hi - lo, ldq, ldk};
          const int64_t n = v.nc + B;
          P.resize(static_cast<size_t>(B * n));
          dP.resize(static_cast<size_t>(B * n));
          scores(v, B, d, P.data());
          // dP = dO V^T
          if (v.nc > 0) gemm(false, true, B, v.nc, d, dO + q0, ldq, v.vc, ldk, T(0), dP.data(), n);
          gemm(false, true, B, B, d, dO + q0, ldq, v.vb, ldk, T(0), dP.data() + v.nc, n);
          for (int64_t i = 0; i < B; ++i) {
            int64_t rlo, rhi, rblk;
            g.ranges(j, i, &rlo, &rhi, &rblk);
            const T L = ls[(j * B + i) * g.nh + h];
            const T* orow = o + q0 + i * ldq;
            const T* dor = dO + q0 + i * ldq;
            double Dr = 0;
            for (int64_t t = 0; t < d; ++t) Dr += static_cast<double>(dor[t]) * orow[t];
            T* pr = P.data() + i * n;
            T* dpr = dP.data() + i * n;
            for (int64_t k = 0; k < n; ++k) {
              const bool vis = k < v.nc ? lo + k >= rlo : k - v.nc < rblk;
              pr[k] = vis ? std::exp(pr[k] * sc - L) : T(0);
              dpr[k] = pr[k] * (dpr[k] - static_cast<T>(Dr)) * sc;  // dS * scale
            }
          }
          // dQ_j = (dS sc) K ; dK += (dS sc)^T Q_j ; dV += P^T dO_j
          if (v.nc > 0) gemm(false, false, B, d, v.nc, dP.data(), n, v.kc, ldk, T(1), gq + q0, ldq);
          gemm(false, false, B, d, B, dP.data() + v.nc, n, v.kb, ldk, T(1), gq + q0, ldq);
          if (v.nc > 0) {
            gemm(true, false, v.nc, d, B, dP.data(), n, q + q0, ldq, T(1), gkc + kc0, ldk);
            gemm(true, false, v.nc, d, B, P.data(), n, dO + q0, ldq, T(1), gvc + kc0, ldk);
          }
          gemm(true, false, B, d, B, dP.data() + v.nc, n, q + q0, ldq, T(1), gkb + kb0, ldk);
          gemm(true, false, B, d, B, P.data() + v.nc, n, dO + q0, ldq, T(1), gvb + kb0, ldk);
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
