// cpu/attention_causal.cpp — the target's causal GQA attention (prefill and KV-cache decode).
// out[t, h] = softmax_{lo(p) <= k <= p} (q[t,h] . k[k, g] * scale) v[k, g],  p = q_offset + t, g = h / (nh / nkv),
// lo(p) = max(0, p - window + 1) with a window (else 0); with sinks the head's sink logit s_h joins the softmax's
// denominator (backend/context.h CausalAttnOpts).
// Per (kv head, query tile of kTile rows): S = Q K^T and O = P V through ?gemm on a [kTile, keys] buffer over the keys
// the tile's rows see, so memory stays linear in the sequence length (no T x T buffer).
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/ops.h"

namespace dflash::cpu {

namespace {
constexpr int64_t kTile = 64;
}

void attention_causal(ThreadPool& tp, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                      int64_t q_offset, float scale, const CausalAttnOpts& opts) {
  dispatch_float("attention_causal", q.dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr DType dt = float_dtype<T>();
    check_float("attention_causal", q, "q", dt);
    check_float("attention_causal", k, "k", dt);
    check_float("attention_causal", v, "v", dt);
    check_float("attention_causal", out, "out", dt);
    const int64_t Tq = q.dim(0), nh = q.dim(1), d = q.dim(2), nkv = k.dim(1);
    const int64_t rep = nh / nkv, tiles = (Tq + kTile - 1) / kTile;
    const T* qp = q.ptr<T>();
    const T* kp = k.ptr<T>();
    const T* vp = v.ptr<T>();
    T* op = out.ptr<T>();
    const T sc = static_cast<T>(scale);
    const int64_t W = opts.window;
    const float* sinks = opts.sinks.defined() ? opts.sinks.ptr<float>() : nullptr;
    // task = (query head, query tile); rows of one head are strided by nh*d in q/out, keys by nkv*d.
    tp.parallel_for(nh * tiles, 1, [&](int64_t b, int64_t e) {
      std::vector<T> s, o;
      for (int64_t task = b; task < e; ++task) {
        const int64_t h = task / tiles, t0 = (task % tiles) * kTile, g = h / rep;
        const int64_t rows = std::min(kTile, Tq - t0);
        const int64_t nk = q_offset + t0 + rows;  // keys visible to the tile's last row: k < nk
        const int64_t k0 = W > 0 ? std::max<int64_t>(0, q_offset + t0 - W + 1) : 0;  // the first row's first key
        const int64_t nc = nk - k0;                                                  // columns of S: keys k0..nk-1
        s.resize(static_cast<size_t>(rows * nc));
        o.resize(static_cast<size_t>(rows * d));
        // S[rows, nc] = Q_tile K[k0:nk]^T
        gemm(false, true, rows, nc, d, qp + (t0 * nh + h) * d, nh * d, kp + (k0 * nkv + g) * d, nkv * d, T(0),
             s.data(), nc);
        for (int64_t r = 0; r < rows; ++r) {
          T* sr = s.data() + r * nc;
          const int64_t p = q_offset + t0 + r;
          const int64_t lo = (W > 0 ? std::max<int64_t>(0, p - W + 1) : 0) - k0, hi = p + 1 - k0;  // [lo, hi)
          T mx = sinks ? static_cast<T>(sinks[h]) : -std::numeric_limits<T>::infinity();
          for (int64_t j = lo; j < hi; ++j) mx = std::max(mx, sr[j] * sc);
          T l = sinks ? std::exp(static_cast<T>(sinks[h]) - mx) : T(0);
          for (int64_t j = lo; j < hi; ++j) l += sr[j] = std::exp(sr[j] * sc - mx);
          const T inv = T(1) / l;
          for (int64_t j = 0; j < lo; ++j) sr[j] = 0;
          for (int64_t j = lo; j < hi; ++j) sr[j] *= inv;
          for (int64_t j = hi; j < nc; ++j) sr[j] = 0;
        }
        // O[rows, d] = P V[k0:nk]
        gemm(false, false, rows, d, nc, s.data(), nc, vp + (k0 * nkv + g) * d, nkv * d, T(0), o.data(), d);
        for (int64_t r = 0; r < rows; ++r)
          std::copy_n(o.data() + r * d, d, op + ((t0 + r) * nh + h) * d);
      }
    });
  });
}

}  // namespace dflash::cpu
