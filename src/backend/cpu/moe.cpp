// cpu/moe.cpp — the Mixture-of-Experts ops (backend/context.h): routing, grouping by expert, the grouped expert GEMM
// (plain, MXFP4 or INT4 weights, biases, the SwiGLU and clamped SwiGLU epilogues) and the weighted combine; the host
// MXFP4 and INT4 dequantisations (mxfp4_dequantize, int4_dequantize). The reference of the CUDA kernels
// (backend/cuda/moe.cu): plain loops, one OpenBLAS product per expert (a quantized expert dequantised row by row into a
// buffer first, exactly: an INT4 weight (c - 8) * scale is exact in F32).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "backend/cpu/ops.h"

namespace dflash::cpu {

void moe_route(ThreadPool& tp, const Tensor& logits, int64_t k, bool normalize, const Tensor& idx,
               const Tensor& weights, const MoeRouteOpts& opts) {
  dispatch_float("moe_route", logits.dtype, [&](auto tag) {
    using T = decltype(tag);
    const int64_t T_ = logits.shape[0], E = logits.shape[1];
    const float* bias = opts.choice_bias.defined() ? opts.choice_bias.ptr<float>() : nullptr;
    const int64_t ng = opts.n_group, tg = opts.topk_group;
    tp.parallel_for(T_, 16, [&](int64_t b, int64_t e) {
      std::vector<int32_t> order(static_cast<size_t>(E)), gorder(static_cast<size_t>(ng));
      std::vector<T> p(static_cast<size_t>(E)), c(static_cast<size_t>(E)), gscore(static_cast<size_t>(ng));
      for (int64_t t = b; t < e; ++t) {
        const T* z = logits.ptr<T>() + t * E;
        if (opts.score == MoeScore::Sigmoid) {  // p = sigmoid(z); the top k of c = p + b; w = p (renormalised)
          for (int64_t i = 0; i < E; ++i) {
            p[i] = T(1) / (T(1) + std::exp(-z[i]));
            c[i] = p[i] + (bias ? static_cast<T>(bias[i]) : T(0));
          }
          const T* cv = c.data();
          auto before = [cv](int32_t a, int32_t d) { return cv[a] > cv[d] || (cv[a] == cv[d] && a < d); };
          int64_t n = E;  // the candidates: order[0 .. n)
          std::iota(order.begin(), order.end(), 0);
          if (ng > 1) {  // keep the topk_group groups of largest top-2 sum (ties to the lower group)
            const int64_t gs = E / ng;
            for (int64_t g = 0; g < ng; ++g) {
              std::partial_sort(order.begin() + g * gs, order.begin() + g * gs + 2, order.begin() + (g + 1) * gs,
                                before);
              gscore[g] = cv[order[g * gs]] + cv[order[g * gs + 1]];
            }
            std::iota(gorder.begin(), gorder.end(), 0);
            const T* gv = gscore.data();
            std::partial_sort(gorder.begin(), gorder.begin() + tg, gorder.end(),
                              [gv](int32_t a, int32_t d) { return gv[a] > gv[d] || (gv[a] == gv[d] && a < d); });
            std::sort(gorder.begin(), gorder.begin() + tg);
            n = 0;
            for (int64_t j = 0; j < tg; ++j)
              for (int64_t i = 0; i < gs; ++i) order[n++] = static_cast<int32_t>(gorder[j] * gs + i);
          }
          std::partial_sort(order.begin(), order.begin() + k, order.begin() + n, before);
          T chosen = 0;
          for (int64_t j = 0; j < k; ++j) chosen += p[order[j]];
          const T scale = static_cast<T>(opts.scale);
          for (int64_t j = 0; j < k; ++j) {
            idx.ptr<int32_t>()[t * k + j] = order[j];
            weights.ptr<T>()[t * k + j] = (normalize ? p[order[j]] / (chosen + T(1e-20)) : p[order[j]]) * scale;
          }
          continue;
        }
        std::iota(order.begin(), order.end(), 0);
        // the k largest logits, ties to the lower expert index (a strict weak order: logit desc, index asc)
        std::partial_sort(order.begin(), order.begin() + k, order.end(),
                          [z](int32_t a, int32_t c) { return z[a] > z[c] || (z[a] == z[c] && a < c); });
        const T mx = z[order[0]];
        T sum = 0;
        for (int64_t i = 0; i < E; ++i) sum += std::exp(z[i] - mx);
        T chosen = 0;
        for (int64_t j = 0; j < k; ++j) chosen += std::exp(z[order[j]] - mx) / sum;
        for (int64_t j = 0; j < k; ++j) {
          const T p = std::exp(z[order[j]] - mx) / sum;
          idx.ptr<int32_t>()[t * k + j] = order[j];
          weights.ptr<T>()[t * k + j] = normalize ? p / chosen : p;
        }
      }
    });
  });
}

void moe_group(const Tensor& idx, const Tensor& offsets, const Tensor& rows, const Tensor& slot) {
  const int64_t n = idx.numel(), k = idx.shape[1], E = offsets.numel() - 1;
  const int32_t* ix = idx.ptr<int32_t>();
  std::vector<int64_t> cursor(static_cast<size_t>(E) + 1, 0);
  for (int64_t i = 0; i < n; ++i) {
    DFLASH_CHECK(ix[i] >= 0 && ix[i] < E, "moe_group: expert id ", ix[i], " of token ", i / k, " outside [0, ", E, ")");
    ++cursor[static_cast<size_t>(ix[i]) + 1];
  }
  for (int64_t e = 0; e < E; ++e) cursor[e + 1] += cursor[e];
  for (int64_t e = 0; e <= E; ++e) offsets.ptr<int32_t>()[e] = static_cast<int32_t>(cursor[e]);
  for (int64_t i = 0; i < n; ++i) {  // pairs in (token, slot) order: each expert's rows in token order
    const int64_t r = cursor[ix[i]]++;
    rows.ptr<int32_t>()[r] = static_cast<int32_t>(i / k);
    slot.ptr<int32_t>()[i] = static_cast<int32_t>(r);
  }
}

namespace {

// e2m1 (OCP MX v1.0, FP4 E2M1): bits 0-2 the magnitude code, bit 3 the sign (transformers' FP4_VALUES).
constexpr float kFp4[16] = {+0.0f, +0.5f, +1.0f, +1.5f, +2.0f, +3.0f, +4.0f, +6.0f,
                            -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// One MXFP4 row of K elements (K % 32 == 0): q [K/2] bytes (element 2j in the low nibble of byte j, 2j+1 in the high),
// s [K/32] e8m0 exponents (bias 127).
template <class T>
void mxfp4_row(const uint8_t* q, const uint8_t* s, int64_t K, T* out) {
  for (int64_t b = 0; b < K / 32; ++b) {
    const int e = static_cast<int>(s[b]) - 127;
    for (int64_t j = 0; j < 16; ++j) {
      const uint8_t byte = q[b * 16 + j];
      out[b * 32 + 2 * j] = static_cast<T>(std::ldexp(kFp4[byte & 15], e));
      out[b * 32 + 2 * j + 1] = static_cast<T>(std::ldexp(kFp4[byte >> 4], e));
    }
  }
}

// One INT4 row of K elements (backend/context.h MoeWeights): q [K/2] bytes (element 2j in the low nibble of byte j, 2j+1
// in the high: compressed-tensors' pack_to_int32 words in little-endian order), code c -> integer c - 8 (its offset
// 2^(num_bits - 1)); s [K/group] scales as floats.
template <class T>
void int4_row(const uint8_t* q, const float* s, int64_t K, int64_t group, T* out) {
  for (int64_t j = 0; j < K / 2; ++j) {
    const float sc = s[2 * j / group];  // (group is even: 2j and 2j + 1 share a scale)
    out[2 * j] = static_cast<T>(static_cast<float>(static_cast<int>(q[j] & 15) - 8) * sc);
    out[2 * j + 1] = static_cast<T>(static_cast<float>(static_cast<int>(q[j] >> 4) - 8) * sc);
  }
}

// MoeAct::ClampedSwiGLU (backend/context.h: alpha kClampedSwiGLUAlpha, limit kClampedSwiGLULimit).
template <class T>
T clamped_swiglu(T g, T u) {
  constexpr T limit = T(kClampedSwiGLULimit), alpha = T(kClampedSwiGLUAlpha);
  g = std::min(g, limit);
  u = std::clamp(u, -limit, limit);
  return (u + T(1)) * (g / (T(1) + std::exp(-alpha * g)));
}

}  // namespace

void moe_linear(ThreadPool& tp, const Tensor& x, const Tensor* rows, const MoeWeights& mw, const Tensor& offsets,
                const Tensor& y, MoeAct act, const MoeLinearDims& d) {
  dispatch_float("moe_linear", x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const int32_t* off = offsets.ptr<int32_t>();
    DFLASH_CHECK(off[0] == 0 && off[d.E] == d.R, "moe_linear: offsets run from ", off[0], " to ", off[d.E],
                 ", expected 0 to ", d.R, " (the rows of y)");
    const Tensor& w = mw.w;
    const int64_t Nw = w.shape[1], xr = x.rows();
    // INT4: the scales as floats [E, N', K/group], converted once
    std::vector<float> s4;
    if (mw.int4()) s4 = to_f32_vector(mw.scales);
    std::vector<T> a, g, wd;
    for (int64_t e = 0; e < d.E; ++e) {
      const int64_t r0 = off[e], M = off[e + 1] - off[e];
      DFLASH_CHECK(M >= 0 && off[e + 1] <= d.R, "moe_linear: offsets not ascending at expert ", e);
      if (M == 0) continue;
      const T* A = x.ptr<T>() + r0 * d.K;
      if (rows) {  // gather the expert's rows of x
        a.resize(static_cast<size_t>(M * d.K));
        for (int64_t i = 0; i < M; ++i) {
          const int32_t src = rows->ptr<int32_t>()[r0 + i];
          DFLASH_CHECK(src >= 0 && src < xr, "moe_linear: row ", src, " outside x's ", xr, " rows");
          std::copy_n(x.ptr<T>() + src * d.K, d.K, a.data() + i * d.K);
        }
        A = a.data();
      }
      const T* W = nullptr;
      if (mw.quantized()) {  // the expert's rows dequantised
        wd.resize(static_cast<size_t>(Nw * d.K));
        const uint8_t* q = w.ptr<uint8_t>() + e * Nw * (d.K / 2);
        if (mw.mxfp4()) {
          const uint8_t* sc = mw.scales.ptr<uint8_t>() + e * Nw * (d.K / 32);
          tp.parallel_for(Nw, 16, [&](int64_t n0, int64_t n1) {
            for (int64_t n = n0; n < n1; ++n) mxfp4_row(q + n * (d.K / 2), sc + n * (d.K / 32), d.K, wd.data() + n * d.K);
          });
        } else {
          const int64_t G = mw.int4_group, ng = d.K / G;
          const float* sc = s4.data() + e * Nw * ng;
          tp.parallel_for(Nw, 16, [&](int64_t n0, int64_t n1) {
            for (int64_t n = n0; n < n1; ++n) int4_row(q + n * (d.K / 2), sc + n * ng, d.K, G, wd.data() + n * d.K);
          });
        }
        W = wd.data();
      } else {
        W = w.ptr<T>() + e * Nw * d.K;
      }
      const T* bias = mw.bias.defined() ? mw.bias.ptr<T>() + e * Nw : nullptr;
      T* Y = y.ptr<T>() + r0 * d.N;
      if (act == MoeAct::None) {
        pgemm(tp, false, true, M, d.N, d.K, A, d.K, W, d.K, T(0), Y, d.N);
        if (bias)
          for (int64_t i = 0; i < M; ++i)
            for (int64_t c = 0; c < d.N; ++c) Y[i * d.N + c] += bias[c];
        continue;
      }
      g.resize(static_cast<size_t>(M * Nw));  // [M, 2N]: gate columns, then up columns
      pgemm(tp, false, true, M, Nw, d.K, A, d.K, W, d.K, T(0), g.data(), Nw);
      for (int64_t i = 0; i < M; ++i)
        for (int64_t c = 0; c < d.N; ++c) {
          T gv = g[i * Nw + c], uv = g[i * Nw + d.N + c];
          if (bias) {
            gv += bias[c];
            uv += bias[d.N + c];
          }
          Y[i * d.N + c] = act == MoeAct::SwiGLU ? gv * (T(1) / (T(1) + std::exp(-gv))) * uv : clamped_swiglu(gv, uv);
        }
    }
  });
}

void moe_combine(ThreadPool& tp, const Tensor& y, const Tensor& slot, const Tensor& weights, const Tensor& out,
                 float beta) {
  dispatch_float("moe_combine", out.dtype, [&](auto tag) {
    using T = decltype(tag);
    const int64_t Tn = out.rows(), H = out.shape.back(), k = weights.shape[1], R = y.rows();
    const int32_t* sl = slot.ptr<int32_t>();
    for (int64_t i = 0; i < Tn * k; ++i)
      DFLASH_CHECK(sl[i] >= 0 && sl[i] < R, "moe_combine: slot ", sl[i], " outside y's ", R, " rows");
    tp.parallel_for(Tn, 8, [&](int64_t b, int64_t e) {
      std::vector<T> acc(static_cast<size_t>(H));
      for (int64_t t = b; t < e; ++t) {
        std::fill(acc.begin(), acc.end(), T(0));
        for (int64_t j = 0; j < k; ++j) {
          const T wj = weights.ptr<T>()[t * k + j];
          const T* yr = y.ptr<T>() + static_cast<int64_t>(sl[t * k + j]) * H;
          for (int64_t c = 0; c < H; ++c) acc[c] += wj * yr[c];
        }
        T* o = out.ptr<T>() + t * H;
        for (int64_t c = 0; c < H; ++c) o[c] = acc[c] + (beta != 0.f ? T(beta) * o[c] : T(0));
      }
    });
  });
}

}  // namespace dflash::cpu

namespace dflash {

Tensor mxfp4_dequantize(const Tensor& blocks, const Tensor& scales) {
  const char* op = "mxfp4_dequantize";
  DFLASH_CHECK(blocks.device == Device::CPU && scales.device == Device::CPU && blocks.dtype == DType::U8 &&
                   scales.dtype == DType::U8 && scales.ndim() >= 1,
               op, ": blocks and scales must be U8 host tensors, got ", dtype_name(blocks.dtype), " ",
               shape_str(blocks.shape), " and ", dtype_name(scales.dtype), " ", shape_str(scales.shape));
  const int64_t G = scales.shape.back(), rows = scales.numel() / std::max<int64_t>(1, G);
  // blocks [*, G, 16] (the published layout) or [*, 16 G] (MoeWeights' rows), with the same leading dims as scales
  Shape lead(scales.shape.begin(), scales.shape.end() - 1);
  const bool published = blocks.ndim() == scales.ndim() + 1 && blocks.shape.back() == 16 &&
                         Shape(blocks.shape.begin(), blocks.shape.end() - 1) == scales.shape;
  const bool flat = blocks.ndim() == scales.ndim() && blocks.shape.back() == 16 * G &&
                    Shape(blocks.shape.begin(), blocks.shape.end() - 1) == lead;
  DFLASH_CHECK(published || flat, op, ": blocks ", shape_str(blocks.shape), " do not fit scales ",
               shape_str(scales.shape), " (expected blocks [*, G, 16] or [*, 16 G] for scales [*, G])");
  Shape out_shape = lead;
  out_shape.push_back(32 * G);
  Tensor out = cpu_empty(DType::F32, out_shape);
  for (int64_t r = 0; r < rows; ++r)
    cpu::mxfp4_row(blocks.ptr<uint8_t>() + r * 16 * G, scales.ptr<uint8_t>() + r * G, 32 * G,
                   out.ptr<float>() + r * 32 * G);
  return out;
}

Tensor int4_dequantize(const Tensor& codes, const Tensor& scales, int64_t group) {
  const char* op = "int4_dequantize";
  const bool dt_ok = codes.dtype == DType::U8 || codes.dtype == DType::I32;
  DFLASH_CHECK(codes.device == Device::CPU && scales.device == Device::CPU && dt_ok && codes.ndim() >= 1 &&
                   scales.ndim() == codes.ndim() &&
                   (scales.dtype == DType::BF16 || scales.dtype == DType::F16 || scales.dtype == DType::F32),
               op, ": codes (U8 or I32) and scales (float) must be host tensors of the same rank, got ",
               dtype_name(codes.dtype), " ", shape_str(codes.shape), " and ", dtype_name(scales.dtype), " ",
               shape_str(scales.shape));
  const int64_t K = codes.shape.back() * (codes.dtype == DType::I32 ? 8 : 2);
  Shape lead(codes.shape.begin(), codes.shape.end() - 1);
  DFLASH_CHECK(group > 0 && group % 2 == 0 && K % group == 0 && Shape(scales.shape.begin(), scales.shape.end() - 1) == lead &&
                   scales.shape.back() == K / group,
               op, ": scales ", shape_str(scales.shape), " do not fit codes ", shape_str(codes.shape), " of ", K,
               " elements a row in groups of ", group);
  const std::vector<float> s = to_f32_vector(scales);
  Shape out_shape = lead;
  out_shape.push_back(K);
  Tensor out = cpu_empty(DType::F32, out_shape);
  const int64_t rows = out.numel() / std::max<int64_t>(1, K);
  const uint8_t* q = static_cast<const uint8_t*>(codes.data);  // (I32 words: little-endian, the same bytes)
  for (int64_t r = 0; r < rows; ++r)
    cpu::int4_row(q + r * (K / 2), s.data() + r * (K / group), K, group, out.ptr<float>() + r * K);
  return out;
}

}  // namespace dflash
