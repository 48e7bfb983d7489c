// backend/dflash2_ops.cpp — the argument checks of DFlash2's ops (Context::dynamic_conv, dynamic_conv_backward,
// candidate_selector; backend/context.h), shared by every backend: each throws Error naming the op, the tensor, its
// dtype and shape and what was expected.
// defines: check_dynamic_conv, check_candidate_selector
#include "backend/context.h"

namespace dflash {

namespace {
void need(bool ok, const char* op, const char* what, const Tensor& t, const std::string& expect) {
  DFLASH_CHECK(ok, op, ": ", what, " is ", t.defined() ? dtype_name(t.dtype) : "undefined", " ",
               t.defined() ? shape_str(t.shape) : "", ", expected ", expect);
}
}  // namespace

DynConvDims check_dynamic_conv(const DynConvArgs& a, const Tensor& y, const Tensor* res, DType act) {
  const char* op = "dynamic_conv";
  need(a.u.defined() && a.u.dtype == act && a.u.ndim() == 2, op, "u", a.u, cat(dtype_name(act), " [R, C]"));
  const int64_t R = a.u.shape[0], C = a.u.shape[1];
  DFLASH_CHECK(a.group > 0 && C % a.group == 0, op, ": group ", a.group, " does not divide the ", C, " channels");
  DFLASH_CHECK(a.block_size > 0 && R % a.block_size == 0, op, ": block_size ", a.block_size, " does not divide the ",
               R, " rows");
  DFLASH_CHECK(a.side == 0 || a.side == 1, op, ": side ", a.side, " is not 0 (pre) or 1 (post)");
  need(a.base.defined() && a.base.dtype == act && a.base.ndim() == 3 && a.base.shape[0] == 2 && a.base.shape[2] == C &&
           a.base.shape[1] >= 1,
       op, "base", a.base, cat(dtype_name(act), " [2, T, ", C, "]"));
  const int64_t T = a.base.shape[1], G = C / a.group;
  need(a.delta.defined() && a.delta.dtype == act && a.delta.ndim() == 2 && a.delta.shape[0] == R &&
           a.delta.shape[1] == 2 * T * G,
       op, "delta", a.delta, cat(dtype_name(act), " [", R, ", ", 2 * T * G, "]"));
  need(y.defined() && y.dtype == act && y.numel() == R * C, op, "y", y, cat(dtype_name(act), " [", R, ", ", C, "]"));
  DFLASH_CHECK(y.data != a.u.data, op, ": y must not alias u");
  if (res) need(res->dtype == act && res->numel() == R * C, op, "res", *res, cat(dtype_name(act), " [", R, ", ", C, "]"));
  return {R, C, T, G};
}

SelectorDims check_candidate_selector(const SelectorArgs& a, const Tensor& scores, DType act, DType param) {
  const char* op = "candidate_selector";
  need(a.g.defined() && a.g.dtype == act && a.g.ndim() == 2, op, "g", a.g, cat(dtype_name(act), " [R, r]"));
  const int64_t R = a.g.shape[0], r = a.g.shape[1];
  need(a.pred_cb.defined() && a.pred_cb.dtype == act && a.pred_cb.ndim() == 2 && a.pred_cb.shape[1] == r, op,
       "pred_cb", a.pred_cb, cat(dtype_name(act), " [V, ", r, "]"));
  const int64_t V = a.pred_cb.shape[0];
  need(a.succ_cb.defined() && a.succ_cb.dtype == act && a.succ_cb.ndim() == 2 && a.succ_cb.shape[0] == V &&
           a.succ_cb.shape[1] == r,
       op, "succ_cb", a.succ_cb, cat(dtype_name(act), " [", V, ", ", r, "]"));
  need(a.rows.defined() && a.rows.dtype == DType::I32 && a.rows.ndim() == 1, op, "rows", a.rows, "I32 [M]");
  const int64_t M = a.rows.numel();
  need(a.prev.defined() && a.prev.dtype == DType::I32 && a.prev.numel() == M, op, "prev", a.prev, cat("I32 [", M, "]"));
  need(a.cand.defined() && a.cand.dtype == DType::I32 && a.cand.ndim() == 2 && a.cand.shape[0] == M, op, "cand", a.cand,
       cat("I32 [", M, ", K]"));
  const int64_t K = a.cand.shape[1];
  DFLASH_CHECK(K >= 1 && K <= V, op, ": ", K, " candidates per row for a ", V, "-token vocabulary");
  need(a.cand_logit.defined() && a.cand_logit.dtype == param && a.cand_logit.numel() == M * K, op, "cand_logit",
       a.cand_logit, cat(dtype_name(param), " [", M, ", ", K, "]"));
  need(scores.defined() && scores.dtype == param && scores.numel() == M * K, op, "scores", scores,
       cat(dtype_name(param), " [", M, ", ", K, "]"));
  if (a.labels.defined())
    need(a.labels.dtype == DType::I32 && a.labels.numel() == M, op, "labels", a.labels, cat("I32 [", M, "]"));
  if (a.dg.defined()) {
    DFLASH_CHECK(a.labels.defined(), op, ": gradients need labels");
    need(a.dg.dtype == act && a.dg.numel() == R * r, op, "dg", a.dg, cat(dtype_name(act), " [", R, ", ", r, "]"));
    need(a.weights.defined() && a.weights.dtype == DType::F32 && a.weights.numel() == M, op, "weights", a.weights,
         cat("F32 [", M, "]"));
    need(a.lm_head.defined() && a.lm_head.dtype == act && a.lm_head.ndim() == 2 && a.lm_head.shape[0] == V, op,
         "lm_head", a.lm_head, cat(dtype_name(act), " [", V, ", H]"));
    const int64_t H = a.lm_head.shape[1];
    need(a.dh.defined() && a.dh.dtype == act && a.dh.numel() == R * H, op, "dh", a.dh,
         cat(dtype_name(act), " [", R, ", ", H, "]"));
    need(a.d_pred_cb.defined() && a.d_pred_cb.dtype == param && a.d_pred_cb.numel() == V * r, op, "d_pred_cb",
         a.d_pred_cb, cat(dtype_name(param), " [", V, ", ", r, "]"));
    need(a.d_succ_cb.defined() && a.d_succ_cb.dtype == param && a.d_succ_cb.numel() == V * r, op, "d_succ_cb",
         a.d_succ_cb, cat(dtype_name(param), " [", V, ", ", r, "]"));
  }
  return {M, K, r, V, R};
}

}  // namespace dflash
