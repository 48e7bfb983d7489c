// model/draft_loss.cpp — the loss head of model/draft_loss.h: fixed (decay) or D-PACE weights over lm_head_loss.
#include "model/draft_loss.h"

#include <cmath>

namespace dflash {

const char* loss_kind_name(LossKind k) { return k == LossKind::DPace ? "dpace" : "decay"; }

LossKind parse_loss_kind(const std::string& s, const char* field) {
  if (s == "decay") return LossKind::Decay;
  if (s == "dpace") return LossKind::DPace;
  DFLASH_FAIL(field, ": '", s, "' is not a loss (decay: spec 2.4's decayed cross-entropy; dpace: D-PACE)");
}

void check_dpace_alpha(double alpha, const char* field) {
  DFLASH_CHECK(alpha > 0 && alpha <= 1, field, " = ", alpha, ": D-PACE's smoothing alpha must lie in (0, 1] (default ",
               kDefaultDPaceAlpha, ")");
}

std::vector<double> dpace_weights(std::span<const int32_t> rows, std::span<const double> ce, int64_t B, double alpha) {
  check_dpace_alpha(alpha, "dpace_weights: alpha");
  DFLASH_CHECK(B > 0, "dpace_weights: block_size ", B, " must be > 0");
  DFLASH_CHECK(ce.size() == rows.size(), "dpace_weights: ", ce.size(), " ce values for ", rows.size(), " rows");
  const size_t n = rows.size();
  std::vector<double> w(n, 0.0);
  size_t b0 = 0;
  while (b0 < n) {  // one block: rows [b0, b1)
    const int64_t j = rows[b0] / B;
    size_t b1 = b0;
    double prefix = 1;
    for (; b1 < n && rows[b1] / B == j; ++b1) {
      DFLASH_CHECK(rows[b1] >= 0 && (b1 == 0 || rows[b1] > rows[b1 - 1]), "dpace_weights: rows[", b1, "] = ",
                   rows[b1], ": rows must be strictly ascending and >= 0");
      DFLASH_CHECK(std::isfinite(ce[b1]), "dpace_weights: ce[", b1, "] (row ", rows[b1], ") is ", ce[b1]);
      prefix *= (1 - alpha) * std::exp(-ce[b1]) + alpha;  // P of this row (Eq. 7-8)
      w[b1] = prefix;
    }
    double suffix = 0;
    for (size_t r = b1; r-- > b0;) {  // w = suffix sum of P (Eq. 8)
      suffix += w[r];
      w[r] = suffix;
    }
    b0 = b1;
  }
  return w;
}

LossHeadOut loss_head(Context& ctx, const LossArgs& a, double dpace_alpha, int64_t block_size) {
  const bool dpace = dpace_alpha > 0;
  LossArgs call = a;
  if (dpace) call.grad_scale = 1.0f;
  LossHeadOut out;
  out.stats = ctx.lm_head_loss(call);
  const Tensor wh = ctx.to_host(a.weights);
  const std::span<const float> given(wh.ptr<float>(), static_cast<size_t>(wh.numel()));
  if (dpace) {
    for (size_t r = 0; r < given.size(); ++r)
      DFLASH_CHECK(given[r] == 1.0f, "loss_head: with D-PACE the weights must be the mask m (1 per selected row); "
                   "weights[", r, "] = ", given[r]);
    const Tensor rows = ctx.to_host(a.rows);
    out.w = dpace_weights(std::span<const int32_t>(rows.ptr<int32_t>(), static_cast<size_t>(rows.numel())),
                          out.stats.ce, block_size, dpace_alpha);
    if (a.dh.defined() && !out.w.empty()) {  // dh rows were computed with weight 1: scale them by w grad_scale
      const DType pt = ctx.param_dtype();
      Tensor s = cpu_empty(pt, {static_cast<int64_t>(out.w.size())});
      for (size_t r = 0; r < out.w.size(); ++r) {
        const double v = out.w[r] * static_cast<double>(a.grad_scale);
        if (pt == DType::F64)
          s.ptr<double>()[r] = v;
        else
          s.ptr<float>()[r] = static_cast<float>(v);
      }
      ctx.scale_rows(a.dh, a.rows, ctx.to_device(s));
    }
  } else {
    out.w.assign(given.begin(), given.end());
  }
  for (size_t r = 0; r < out.w.size(); ++r) {
    out.ce_sum += out.w[r] * out.stats.ce[r];
    out.kl_sum += out.w[r] * out.stats.kl[r];
  }
  return out;
}

}  // namespace dflash
