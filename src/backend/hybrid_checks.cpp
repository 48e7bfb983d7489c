// backend/hybrid_checks.cpp — argument checks of the hybrid linear-attention ops (backend/context.h: rmsnorm_gated,
// sigmoid_gate, conv1d_causal, gdn_gate, gated_delta_rule), shared by every backend so that a bad call fails the same
// way on the CPU and on CUDA, naming the op, the tensor, what it is and what was expected.
#include "backend/context.h"
#include "core/error.h"

namespace dflash {

namespace {
// Throws "op: what is DTYPE [shape], expected EXPECT" unless ok.
void expect(bool ok, const char* op, const char* what, const Tensor& t, const std::string& want) {
  DFLASH_CHECK(ok, op, ": ", what, " is ", t.defined() ? cat(dtype_name(t.dtype), " ", shape_str(t.shape)) : "undefined",
               ", expected ", want);
}
}  // namespace

RowsDims check_rmsnorm_gated(const Tensor& x, const Tensor& w, const Tensor* z, const Tensor& y, DType act) {
  const char* op = "rmsnorm_gated";
  expect(x.defined() && x.dtype == act && x.ndim() >= 1, op, "x", x, cat(dtype_name(act), " [R, D]"));
  const int64_t D = x.shape.back(), R = x.rows();
  expect(w.defined() && w.dtype == act && w.numel() == D, op, "w", w, cat(dtype_name(act), " [", D, "]"));
  expect(y.defined() && y.dtype == act && y.numel() == x.numel() && y.shape.back() == D, op, "y", y,
         cat(dtype_name(act), " ", shape_str(x.shape)));
  if (z)
    expect(z->defined() && z->dtype == act && z->numel() == x.numel() && z->shape.back() == D, op, "z", *z,
           cat(dtype_name(act), " ", shape_str(x.shape)));
  return {R, D};
}

RowsDims check_sigmoid_gate(const Tensor& y, const Tensor& gate, DType act) {
  const char* op = "sigmoid_gate";
  expect(y.defined() && y.dtype == act && y.ndim() >= 1, op, "y", y, cat(dtype_name(act), " [R, D]"));
  const int64_t R = y.rows(), D = y.shape.back();
  expect(gate.defined() && gate.dtype == act && gate.ndim() >= 1 && gate.rows() == R &&
             (gate.shape.back() == D || gate.shape.back() == 1),
         op, "gate", gate, cat(dtype_name(act), " [", R, ", ", D, "] or [", R, ", 1]"));
  return {R, gate.shape.back()};
}

Conv1dDims check_conv1d_causal(const Tensor& x, const Tensor& w, const Tensor& state, const Tensor& y, DType act,
                               std::span<const int64_t> seqs) {
  const char* op = "conv1d_causal";
  expect(x.defined() && x.dtype == act && x.ndim() == 2, op, "x", x, cat(dtype_name(act), " [T, C]"));
  const int64_t T = x.shape[0], C = x.shape[1];
  expect(w.defined() && w.dtype == act && w.ndim() == 2 && w.shape[0] == C && w.shape[1] >= 1, op, "w", w,
         cat(dtype_name(act), " [", C, ", K]"));
  const int64_t K = w.shape[1];
  expect(y.defined() && y.dtype == act && y.numel() == T * C, op, "y", y, cat(dtype_name(act), " [", T, ", ", C, "]"));
  DFLASH_CHECK(y.data != x.data || T == 0, op, ": y must not alias x");
  if (state.defined())
    expect(state.dtype == act && state.numel() == (K - 1) * C, op, "state", state,
           cat(dtype_name(act), " [", K - 1, ", ", C, "]"));
  if (!seqs.empty()) {
    DFLASH_CHECK(!state.defined(), op, ": several sequences (seqs) start from zero windows; state must be undefined");
    DFLASH_CHECK(seqs.size() >= 2 && seqs.front() == 0 && seqs.back() == T, op, ": seqs must run from 0 to T = ", T,
                 " (", seqs.size(), " offsets given)");
    for (size_t i = 1; i < seqs.size(); ++i)
      DFLASH_CHECK(seqs[i] >= seqs[i - 1], op, ": seqs not ascending at ", i, " (", seqs[i - 1], ", ", seqs[i], ")");
  }
  return {T, C, K, seqs};
}

int64_t check_gdn_gate(const Tensor& ba, const Tensor& A_log, const Tensor& dt_bias, const Tensor& g,
                       const Tensor& beta, DType act, DType param) {
  const char* op = "gdn_gate";
  expect(ba.defined() && ba.dtype == act && ba.ndim() == 2 && ba.shape[1] % 2 == 0, op, "ba", ba,
         cat(dtype_name(act), " [T, 2 nv]"));
  const int64_t T = ba.shape[0], nv = ba.shape[1] / 2;
  expect(A_log.defined() && A_log.dtype == act && A_log.numel() == nv, op, "A_log", A_log,
         cat(dtype_name(act), " [", nv, "]"));
  expect(dt_bias.defined() && dt_bias.dtype == act && dt_bias.numel() == nv, op, "dt_bias", dt_bias,
         cat(dtype_name(act), " [", nv, "]"));
  const std::string pt = dtype_name(param);
  expect(g.defined() && g.dtype == param && g.numel() == T * nv, op, "g", g, cat(pt, " [", T, ", ", nv, "]"));
  expect(beta.defined() && beta.dtype == param && beta.numel() == T * nv, op, "beta", beta,
         cat(pt, " [", T, ", ", nv, "]"));
  return T;
}

int64_t check_gated_delta_rule(const GatedDeltaArgs& a, const Tensor& out, DType act, DType param) {
  const char* op = "gated_delta_rule";
  DFLASH_CHECK(a.nk > 0 && a.dk > 0 && a.nv > 0 && a.dv > 0 && a.nv % a.nk == 0, op, ": heads nk ", a.nk, " x dk ",
               a.dk, ", nv ", a.nv, " x dv ", a.dv, ": all positive and nv a multiple of nk");
  const int64_t C = 2 * a.nk * a.dk + a.nv * a.dv;
  expect(a.qkv.defined() && a.qkv.dtype == act && a.qkv.ndim() == 2 && a.qkv.shape[1] == C, op, "qkv", a.qkv,
         cat(dtype_name(act), " [T, ", C, "] (q, k: ", a.nk, " x ", a.dk, "; v: ", a.nv, " x ", a.dv, ")"));
  const int64_t T = a.qkv.shape[0];
  const std::string pt = dtype_name(param);
  expect(a.g.defined() && a.g.dtype == param && a.g.numel() == T * a.nv, op, "g", a.g, cat(pt, " [", T, ", ", a.nv, "]"));
  expect(a.beta.defined() && a.beta.dtype == param && a.beta.numel() == T * a.nv, op, "beta", a.beta,
         cat(pt, " [", T, ", ", a.nv, "]"));
  if (a.state.defined())
    expect(a.state.dtype == param && a.state.numel() == a.nv * a.dk * a.dv, op, "state", a.state,
           cat(pt, " [", a.nv, ", ", a.dk, ", ", a.dv, "]"));
  expect(out.defined() && out.dtype == act && out.numel() == T * a.nv * a.dv, op, "out", out,
         cat(dtype_name(act), " [", T, ", ", a.nv, ", ", a.dv, "]"));
  if (!a.seqs.empty()) {
    DFLASH_CHECK(!a.state.defined(), op, ": several sequences (seqs) start from zero states; state must be undefined");
    DFLASH_CHECK(a.seqs.size() >= 2 && a.seqs.front() == 0 && a.seqs.back() == T, op, ": seqs must run from 0 to T = ",
                 T, " (", a.seqs.size(), " offsets given)");
    for (size_t i = 1; i < a.seqs.size(); ++i)
      DFLASH_CHECK(a.seqs[i] >= a.seqs[i - 1], op, ": seqs not ascending at ", i, " (", a.seqs[i - 1], ", ",
                   a.seqs[i], ")");
  }
  return T;
}

}  // namespace dflash
