// cpu/lm_head_loss.cpp — fused, chunked lm_head + cross-entropy (+ KL to soft labels), spec 2.4.
// Per selected row with student logits z = h W^T, q = softmax(z), label y, weight w, scale c = grad_scale:
//   ce = logsumexp(z) - z_y,   kl = sum p (log p - log q)  with p = softmax(teacher_h W^T)
//   dz = w c [(q - onehot(y)) + kl_weight (q - p)],   dh = dz W.
// Only `chunk_rows` x V logits exist at once. With topk > 0, each row's topk largest z (DFlash2's candidates) too.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/ops.h"

namespace dflash::cpu {

namespace {

template <class T>
LossStats loss_t(ThreadPool& tp, const LossArgs& a) {
  constexpr DType dt = float_dtype<T>();
  check_float("lm_head_loss", a.h, "h", dt);
  check_float("lm_head_loss", a.lm_head, "lm_head", dt);
  const int64_t H = a.h.dim(-1), V = a.lm_head.dim(0), R = a.h.rows(), Rs = a.rows.numel();
  const bool teacher = a.teacher_h.defined();
  if (teacher) check_float("lm_head_loss", a.teacher_h, "teacher_h", dt);
  const int64_t K = a.topk;
  const bool grad = a.dh.defined();
  if (grad) check_float("lm_head_loss", a.dh, "dh", dt);
  const int32_t* rows = a.rows.ptr<int32_t>();
  const int32_t* labels = a.labels.ptr<int32_t>();
  const float* w = a.weights.ptr<float>();
  const T* W = a.lm_head.ptr<T>();
  for (int64_t r = 0; r < Rs; ++r) {
    DFLASH_CHECK(rows[r] >= 0 && rows[r] < R, "lm_head_loss: row index ", rows[r], " outside [0, ", R, ")");
    DFLASH_CHECK(labels[r] >= 0 && labels[r] < V, "lm_head_loss: label ", labels[r], " outside [0, ", V, ")");
  }
  LossStats st;
  st.ce.assign(static_cast<size_t>(Rs), 0.0);
  st.kl.assign(static_cast<size_t>(Rs), 0.0);
  st.correct.assign(static_cast<size_t>(Rs), 0);
  const int64_t C = std::min<int64_t>(64, std::max<int64_t>(1, a.chunk_rows));
  std::vector<T> hx, z, zt, dh;
  for (int64_t c0 = 0; c0 < Rs; c0 += C) {
    const int64_t c = std::min(C, Rs - c0);
    hx.resize(static_cast<size_t>(c * H));
    for (int64_t r = 0; r < c; ++r) std::copy_n(a.h.ptr<T>() + rows[c0 + r] * H, H, hx.data() + r * H);
    z.resize(static_cast<size_t>(c * V));
    pgemm(tp, false, true, c, V, H, hx.data(), H, W, H, T(0), z.data(), V);
    if (teacher) {
      zt.resize(static_cast<size_t>(c * V));
      pgemm(tp, false, true, c, V, H, a.teacher_h.ptr<T>() + c0 * H, H, W, H, T(0), zt.data(), V);
    }
    tp.parallel_for(c, 1, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        T* zr = z.data() + r * V;
        const int64_t gr = c0 + r;
        const int32_t y = labels[gr];
        if (K > 0) {  // the K largest logits, descending, ties to the lower id
          std::vector<int32_t> ids(static_cast<size_t>(V));
          for (int64_t v = 0; v < V; ++v) ids[v] = static_cast<int32_t>(v);
          std::partial_sort(ids.begin(), ids.begin() + K, ids.end(),
                            [&](int32_t p, int32_t q) { return zr[p] > zr[q] || (zr[p] == zr[q] && p < q); });
          for (int64_t k = 0; k < K; ++k) {
            a.topk_ids.ptr<int32_t>()[gr * K + k] = ids[k];
            a.topk_logits.ptr<T>()[gr * K + k] = zr[ids[k]];
          }
        }
        int64_t am = 0;
        for (int64_t v = 1; v < V; ++v)
          if (zr[v] > zr[am]) am = v;
        const T mx = zr[am], zy = zr[y];
        st.correct[gr] = am == y;
        if (!teacher) {  // one exp per logit: e = exp(z - max) kept in z, q = e / sum(e)
          double se = 0;
          for (int64_t v = 0; v < V; ++v) {
            const T ev = std::exp(zr[v] - mx);  // exp in T, sum in double
            se += ev;
            zr[v] = ev;
          }
          st.ce[gr] = static_cast<double>(mx) + std::log(se) - zy;
          if (grad) {
            const double coef = static_cast<double>(w[gr]) * a.grad_scale, inv = 1.0 / se;
            const T cq = static_cast<T>(coef * inv), cy = static_cast<T>(coef);
            for (int64_t v = 0; v < V; ++v) zr[v] = cq * zr[v];
            zr[y] -= cy;
          }
          continue;
        }
        double se = 0;
        for (int64_t v = 0; v < V; ++v) se += std::exp(zr[v] - mx);  // exp in T, sum in double
        const T lse = mx + static_cast<T>(std::log(se));
        st.ce[gr] = static_cast<double>(lse) - zy;
        T* ztr = teacher ? zt.data() + r * V : nullptr;
        if (teacher) {
          T tmx = ztr[0];
          for (int64_t v = 1; v < V; ++v) tmx = std::max(tmx, ztr[v]);
          double tse = 0;
          for (int64_t v = 0; v < V; ++v) tse += std::exp(ztr[v] - tmx);
          const T tlse = tmx + static_cast<T>(std::log(tse));
          double kl = 0;
          for (int64_t v = 0; v < V; ++v) {
            const T lp = ztr[v] - tlse;
            const T p = std::exp(lp);
            kl += static_cast<double>(p) * (lp - (zr[v] - lse));
            ztr[v] = p;  // keep p for the gradient
          }
          st.kl[gr] = kl;
        }
        if (grad) {
          const T coef = static_cast<T>(static_cast<double>(w[gr]) * a.grad_scale);
          const T klw = static_cast<T>(a.kl_weight);
          for (int64_t v = 0; v < V; ++v) {
            const T q = std::exp(zr[v] - lse);
            T gv = q - (v == y ? T(1) : T(0));
            if (teacher) gv += klw * (q - ztr[v]);
            zr[v] = coef * gv;
          }
        }
      }
    });
    if (grad) {
      dh.resize(static_cast<size_t>(c * H));
      pgemm(tp, false, false, c, H, V, z.data(), V, W, H, T(0), dh.data(), H);
      for (int64_t r = 0; r < c; ++r) std::copy_n(dh.data() + r * H, H, a.dh.ptr<T>() + rows[c0 + r] * H);
    }
  }
  return st;
}

}  // namespace

LossStats lm_head_loss(ThreadPool& tp, const LossArgs& a) {
  LossStats st;
  dispatch_float("lm_head_loss", a.h.dtype, [&](auto tag) { st = loss_t<decltype(tag)>(tp, a); });
  return st;
}

}  // namespace dflash::cpu
