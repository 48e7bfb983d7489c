// backend/cuda/candidate_selector.cu — DFlash2's candidate selector (backend/context.h SelectorArgs): the pair scores,
// the statistics of the strict top-k cross-entropy and its gradients into g, the two codebooks and the hidden rows.
// bf16 inputs, fp32 products and sums (the statistics and the softmax in double, as the CPU op).
// defines: dflash::cuda::candidate_selector
//
// k_sel_rows: one warp per scored row m (8 per CTA, grid-stride). Lane l owns the slices q = 8l + 256i of the r
// columns (W = 8: 16-byte loads of g, P and S; r % 8 == 0 and aligned rows) or q = l + 32i (W = 1).
//   ids checked first: a bad one zeroes the row's scores and statistics, adds no gradient and sets kErrSelectorId;
//   e[m, j] = U[m, j] + warp_sum(sum_q P[prev, q] g[row, q] S[cand_j, q]) for j < K, written by lane 0;
//   with labels, the lanes take j = lane, lane + 32, ...: first argmax, first j* with cand == label, logsumexp in
//     double: loss, covered, correct into one device buffer, copied to the host once (the op synchronises);
//   with gradients, on covered rows, de_j = w (softmax_j - [j = j*]) (double, rounded to fp32 as the CPU's) into a
//     [M, K] F32 workspace; then per lane slice: sd = sum_j de_j S[cand_j]; d_succ_cb[cand_j] += de_j P g and
//     d_pred_cb[prev] += sd g with fp32 atomics (codebook rows repeat across rows and candidates: the order of the
//     additions, hence the last bits, may vary between runs); dg[row] += sd P as a bf16 read-modify-write (training
//     rows are distinct: a row that does not ascend is a bad id).
// k_sel_dh: one CTA per covered row m: dh[row] += sum_j de_j lm_head[cand_j] (fp32 sum, one rounding; K 16-byte
//   loads per 8 columns, four in flight: the K H lm_head values per row are the bulk of the op's memory traffic).
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cuda/common.cuh"

namespace dflash::cuda {

namespace {

constexpr int kWarps = 8;        // k_sel_rows: rows per CTA
constexpr int kDhThreads = 256;  // k_sel_dh

struct SelParams {
  const bf16 *g, *P, *S, *lm;
  const int *rows, *prev, *cand, *labels;
  const float *U, *weights;
  float* e;                          // [M, K] scores
  double* loss;                      // [M] or null (no labels)
  unsigned char *covered, *correct;  // [M]
  float* de;                         // [M, K] workspace, or null (no gradients)
  bf16 *dg, *dh;
  float *dP, *dS;
  int64_t M, K, r, V, R, H;
  int* err;
};

template <int W>
__global__ void __launch_bounds__(kWarps * 32) k_sel_rows(SelParams p) {
  const int lane = threadIdx.x & 31;
  const bool grad = p.de != nullptr;
  const int64_t K = p.K, r = p.r;
  for (int64_t m = blockIdx.x * static_cast<int64_t>(kWarps) + (threadIdx.x >> 5); m < p.M;
       m += static_cast<int64_t>(gridDim.x) * kWarps) {
    const int* cm = p.cand + m * K;
    float* em = p.e + m * K;
    const int row = p.rows[m], prv = p.prev[m];
    bool bad = row < 0 || row >= p.R || prv < 0 || prv >= p.V || (grad && m > 0 && row <= p.rows[m - 1]);
    for (int64_t j = lane; j < K; j += 32) bad |= cm[j] < 0 || cm[j] >= p.V;
    if (__any_sync(0xffffffffu, bad)) {
      if (lane == 0) atomicOr(p.err, kErrSelectorId);
      for (int64_t j = lane; j < K; j += 32) {
        em[j] = 0.f;
        if (grad) p.de[m * K + j] = 0.f;
      }
      if (p.loss && lane == 0) {
        p.loss[m] = 0.0;
        p.covered[m] = p.correct[m] = 0;
      }
      continue;
    }
    const bf16* gp = p.g + static_cast<int64_t>(row) * r;
    const bf16* pp = p.P + static_cast<int64_t>(prv) * r;
    for (int64_t j = 0; j < K; ++j) {
      const bf16* sp = p.S + static_cast<int64_t>(cm[j]) * r;
      float acc = 0.f;
      for (int64_t q = lane * W; q < r; q += 32 * W) {
        float a[W], b[W], c[W];
        load_f<W>(gp + q, a);
        load_f<W>(pp + q, b);
        load_f<W>(sp + q, c);
        DFLASH_UNROLL
        for (int i = 0; i < W; ++i) acc += (b[i] * a[i]) * c[i];
      }
      acc = warp_sum(acc);
      if (lane == 0) em[j] = p.U[m * K + j] + acc;
    }
    if (!p.loss) continue;
    __syncwarp();  // lane 0's scores are visible to the warp
    const int lab = p.labels[m];
    float mv = -INFINITY;
    int am = INT_MAX, js = INT_MAX;  // first argmax, first j with cand == label (INT_MAX: none in this lane)
    for (int j = lane; j < K; j += 32) {
      const float v = em[j];
      if (am == INT_MAX || v > mv) {
        mv = v;
        am = j;
      }
      if (js == INT_MAX && cm[j] == lab) js = j;
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, mv, o);
      const int oa = __shfl_xor_sync(0xffffffffu, am, o), oj = __shfl_xor_sync(0xffffffffu, js, o);
      if (ov > mv || (ov == mv && oa < am)) {
        mv = ov;
        am = oa;
      }
      js = min(js, oj);
    }
    mv = em[am];  // (a lane without candidates carried -inf)
    double se = 0.0;
    for (int j = lane; j < K; j += 32) se += exp(static_cast<double>(em[j]) - mv);
    se = warp_sum(se);
    const bool cov = js < K;
    if (lane == 0) {
      p.loss[m] = cov ? static_cast<double>(mv) + log(se) - static_cast<double>(em[js]) : 0.0;
      p.covered[m] = cov ? 1 : 0;
      p.correct[m] = cm[am] == lab ? 1 : 0;
    }
    if (!grad) continue;
    const double w = p.weights[m];
    float* dem = p.de + m * K;
    for (int j = lane; j < K; j += 32)
      dem[j] = cov ? static_cast<float>(w * (exp(static_cast<double>(em[j]) - mv) / se - (j == js ? 1.0 : 0.0))) : 0.f;
    if (!cov) continue;
    __syncwarp();  // every lane's de is visible to the warp
    for (int64_t q = lane * W; q < r; q += 32 * W) {
      float gv[W], pv[W], pg[W], sd[W];
      load_f<W>(gp + q, gv);
      load_f<W>(pp + q, pv);
      DFLASH_UNROLL
      for (int i = 0; i < W; ++i) {
        pg[i] = pv[i] * gv[i];
        sd[i] = 0.f;
      }
      for (int64_t j = 0; j < K; ++j) {
        const float d = dem[j];
        const int64_t cj = cm[j];
        float sv[W];
        load_f<W>(p.S + cj * r + q, sv);
        DFLASH_UNROLL
        for (int i = 0; i < W; ++i) {
          sd[i] += d * sv[i];
          atomicAdd(p.dS + cj * r + q + i, d * pg[i]);
        }
      }
      bf16* dgp = p.dg + static_cast<int64_t>(row) * r + q;
      float dv[W];
      load_f<W>(dgp, dv);
      DFLASH_UNROLL
      for (int i = 0; i < W; ++i) {
        dv[i] += sd[i] * pv[i];
        atomicAdd(p.dP + static_cast<int64_t>(prv) * r + q + i, sd[i] * gv[i]);
      }
      store_f<W>(dgp, dv);
    }
  }
}

template <int W>
__global__ void __launch_bounds__(kDhThreads) k_sel_dh(SelParams p) {
  constexpr int U = 4;  // lm_head loads in flight per thread
  const int64_t K = p.K, H = p.H;
  for (int64_t m = blockIdx.x; m < p.M; m += gridDim.x) {
    if (!p.covered[m]) continue;  // uniform in the CTA (bad rows are not covered)
    const int* cm = p.cand + m * K;
    const float* dem = p.de + m * K;
    bf16* dhr = p.dh + static_cast<int64_t>(p.rows[m]) * H;
    for (int64_t c = threadIdx.x * static_cast<int64_t>(W); c < H; c += static_cast<int64_t>(blockDim.x) * W) {
      float acc[W], x[W];
      DFLASH_UNROLL
      for (int i = 0; i < W; ++i) acc[i] = 0.f;
      int64_t j = 0;
      for (; j + U <= K; j += U) {
        Raw<W> w[U];
        DFLASH_UNROLL
        for (int u = 0; u < U; ++u) w[u].load(p.lm + static_cast<int64_t>(cm[j + u]) * H + c);
        DFLASH_UNROLL
        for (int u = 0; u < U; ++u) {
          const float d = dem[j + u];
          w[u].to_f(x);
          DFLASH_UNROLL
          for (int i = 0; i < W; ++i) acc[i] += d * x[i];
        }
      }
      for (; j < K; ++j) {
        const float d = dem[j];
        load_f<W>(p.lm + static_cast<int64_t>(cm[j]) * H + c, x);
        DFLASH_UNROLL
        for (int i = 0; i < W; ++i) acc[i] += d * x[i];
      }
      load_f<W>(dhr + c, x);
      DFLASH_UNROLL
      for (int i = 0; i < W; ++i) x[i] += acc[i];
      store_f<W>(dhr + c, x);
    }
  }
}

}  // namespace

SelectorStats candidate_selector(Env& e, const SelectorArgs& a, const Tensor& scores, const SelectorDims& d) {
  const char* op = "candidate_selector";
  for (const auto& [t, name] : {std::pair<const Tensor*, const char*>{&a.g, "g"}, {&a.pred_cb, "pred_cb"},
                                {&a.succ_cb, "succ_cb"}, {&a.rows, "rows"}, {&a.prev, "prev"}, {&a.cand, "cand"},
                                {&a.cand_logit, "cand_logit"}, {&scores, "scores"}})
    check_on_dev(op, *t, name);
  const bool stats = a.labels.defined(), grad = a.dg.defined();
  if (stats) check_on_dev(op, a.labels, "labels");
  if (grad)
    for (const auto& [t, name] : {std::pair<const Tensor*, const char*>{&a.weights, "weights"}, {&a.lm_head, "lm_head"},
                                  {&a.dg, "dg"}, {&a.dh, "dh"}, {&a.d_pred_cb, "d_pred_cb"}, {&a.d_succ_cb, "d_succ_cb"}})
      check_on_dev(op, *t, name);
  DFLASH_CHECK(d.V < (int64_t{1} << 31) && d.R < (int64_t{1} << 31) && d.K < (int64_t{1} << 31), op,
               ": vocabulary, rows and candidates must fit in int32");
  SelectorStats st;
  const int64_t M = d.M, K = d.K;
  if (stats) {
    st.loss.assign(static_cast<size_t>(M), 0.0);
    st.covered.assign(static_cast<size_t>(M), 0);
    st.correct.assign(static_cast<size_t>(M), 0);
  }
  if (M == 0) return st;

  SelParams p{};
  p.g = static_cast<const bf16*>(a.g.data);
  p.P = static_cast<const bf16*>(a.pred_cb.data);
  p.S = static_cast<const bf16*>(a.succ_cb.data);
  p.rows = a.rows.ptr<int>();
  p.prev = a.prev.ptr<int>();
  p.cand = a.cand.ptr<int>();
  p.U = a.cand_logit.ptr<float>();
  p.e = scores.ptr<float>();
  p.M = M;
  p.K = K;
  p.r = d.r;
  p.V = d.V;
  p.R = d.R;
  p.err = e.err_flag;
  // statistics: loss (double) at 0, covered at 8 M, correct at 9 M
  const Tensor sbuf = stats ? e.alloc(DType::U8, {10 * M}) : Tensor{};
  if (stats) {
    p.labels = a.labels.ptr<int>();
    p.loss = static_cast<double*>(sbuf.data);
    p.covered = static_cast<unsigned char*>(sbuf.data) + 8 * M;
    p.correct = p.covered + M;
  }
  const Tensor de = grad ? e.alloc(DType::F32, {M, K}) : Tensor{};
  if (grad) {
    p.de = de.ptr<float>();
    p.weights = a.weights.ptr<float>();
    p.lm = static_cast<const bf16*>(a.lm_head.data);
    p.H = a.lm_head.dim(1);
    p.dg = static_cast<bf16*>(a.dg.data);
    p.dh = static_cast<bf16*>(a.dh.data);
    p.dP = a.d_pred_cb.ptr<float>();
    p.dS = a.d_succ_cb.ptr<float>();
  }
  const bool vec = bf16x8_ok(d.r, p.g, p.P, p.S, grad ? static_cast<const bf16*>(p.dg) : p.g);
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>((M + kWarps - 1) / kWarps, 8 * int64_t{e.num_sms}));
  if (vec)
    DFLASH_LAUNCH(grid, kWarps * 32, 0, e.stream, k_sel_rows<8>)(p);
  else
    DFLASH_LAUNCH(grid, kWarps * 32, 0, e.stream, k_sel_rows<1>)(p);
  check_launch("candidate_selector");
  if (grad) {
    const unsigned gdh = static_cast<unsigned>(std::min<int64_t>(M, 8 * int64_t{e.num_sms}));
    if (bf16x8_ok(p.H, p.lm, static_cast<const bf16*>(p.dh)))
      DFLASH_LAUNCH(gdh, kDhThreads, 0, e.stream, k_sel_dh<8>)(p);
    else
      DFLASH_LAUNCH(gdh, kDhThreads, 0, e.stream, k_sel_dh<1>)(p);
    check_launch("candidate_selector dh");
  }
  if (stats) {
    std::vector<unsigned char> h(static_cast<size_t>(10 * M));
    DFLASH_CUDA_CHECK(cudaMemcpyAsync(h.data(), sbuf.data, h.size(), cudaMemcpyDeviceToHost, e.stream));
    DFLASH_CUDA_CHECK(cudaStreamSynchronize(e.stream));
    std::memcpy(st.loss.data(), h.data(), static_cast<size_t>(M) * sizeof(double));
    std::copy_n(h.data() + 8 * M, M, st.covered.begin());
    std::copy_n(h.data() + 9 * M, M, st.correct.begin());
  }
  return st;
}

}  // namespace dflash::cuda
