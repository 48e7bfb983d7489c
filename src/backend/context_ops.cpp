// backend/context_ops.cpp — the public ops of Context, one for every backend: each checks its arguments (the shapes,
// dtypes and sizes that must agree; Error naming the op), opens its profiling scope (name and FLOP count), then calls
// the backend's <op>_impl, which only computes (backend/context.h).
// defines: Context's compute ops (linear ... fill_normal), Context::attention_causal_batch_impl (the default)
#include <algorithm>
#include <cmath>

#include "backend/context.h"

namespace dflash {

namespace {

// RopeArgs of an op over the rows of x [R, D] (rmsnorm, rmsnorm_backward): whole tokens of `heads` rows, a position
// each, at most D / 2 frequencies.
void check_rope_rows(const char* op, const Tensor& x, const RopeArgs& r) {
  const int64_t R = x.rows(), D = x.dim(-1), half = r.inv_freq.numel();
  DFLASH_CHECK(r.heads > 0 && R % r.heads == 0, op, ": ", R, " rows are not whole tokens of ", r.heads, " heads");
  DFLASH_CHECK(r.pos.dtype == DType::I32 && r.pos.numel() == R / r.heads, op, ": rope pos must be I32 [", R / r.heads,
               "] (", R, " rows / ", r.heads, " heads), got ", dtype_name(r.pos.dtype), " ", shape_str(r.pos.shape));
  DFLASH_CHECK(half >= 1 && 2 * half <= D, op, ": rope inv_freq has ", half, " entries, head_dim ", D,
               " (at most head_dim / 2)");
}

// attention_causal's shapes (op: the public op's name): q [Tq, nh, d], k and v [Tk, nkv, d], nh a multiple of nkv,
// out of q's size, queries at q_offset .. q_offset + Tq - 1 within the Tk keys.
void check_attention_causal(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                            int64_t q_offset) {
  DFLASH_CHECK(q.ndim() == 3 && k.ndim() == 3 && v.ndim() == 3, op, ": q/k/v must be [T, heads, d]");
  const int64_t Tq = q.dim(0), nh = q.dim(1), d = q.dim(2), Tk = k.dim(0), nkv = k.dim(1);
  DFLASH_CHECK(k.dim(2) == d && v.numel() == k.numel() && nkv > 0 && nh % nkv == 0 && out.numel() == q.numel(), op,
               ": q ", shape_str(q.shape), " k ", shape_str(k.shape), " v ", shape_str(v.shape), " out ",
               shape_str(out.shape));
  DFLASH_CHECK(q_offset >= 0 && q_offset + Tq <= Tk, op, ": queries at ", q_offset, "..", q_offset + Tq - 1,
               " need keys up to there, have ", Tk);
}

// DFlashAttnArgs (DFlash attention and its backward): q [N*B, nh, d], the context keys [S, nkv, d], the block keys
// [N*B, nkv, d], anchors I32 [N] and valid U8 [N]; out [N*B, nh, d] and lse [N*B, nh].
void check_dflash_attention(const char* op, const DFlashAttnArgs& a, const Tensor& out, const Tensor& lse) {
  DFLASH_CHECK(a.window >= 0, op, ": window ", a.window, " (0 = full attention, W > 0 a sliding window)");
  DFLASH_CHECK(a.q.ndim() == 3 && a.k_ctx.ndim() == 3 && a.k_blk.ndim() == 3, op, ": q/k/v must be [T, heads, d]");
  const int64_t B = a.block_size, N = a.anchors.numel(), nh = a.q.dim(1), d = a.q.dim(2), nkv = a.k_ctx.dim(1);
  DFLASH_CHECK(B > 0 && a.q.dim(0) == N * B, op, ": q has ", a.q.dim(0), " rows, expected N*B = ", N, "*", B);
  DFLASH_CHECK(nkv > 0 && nh % nkv == 0, op, ": ", nh, " query heads not a multiple of ", nkv, " kv heads");
  DFLASH_CHECK(a.k_ctx.dim(2) == d && a.v_ctx.numel() == a.k_ctx.numel() && a.k_blk.dim(0) == N * B &&
                   a.k_blk.dim(1) == nkv && a.k_blk.dim(2) == d && a.v_blk.numel() == a.k_blk.numel(),
               op, ": shapes q ", shape_str(a.q.shape), " k_ctx ", shape_str(a.k_ctx.shape), " k_blk ",
               shape_str(a.k_blk.shape));
  DFLASH_CHECK(a.anchors.dtype == DType::I32 && a.valid.dtype == DType::U8, op,
               ": anchors must be I32 [N] and valid U8 [N], got ", dtype_name(a.anchors.dtype), " and ",
               dtype_name(a.valid.dtype));
  DFLASH_CHECK(a.valid.numel() == N, op, ": valid has ", a.valid.numel(), " entries for ", N, " anchors");
  DFLASH_CHECK(out.numel() == a.q.numel() && lse.numel() == N * B * nh, op, ": out ", shape_str(out.shape), " lse ",
               shape_str(lse.shape), " for q ", shape_str(a.q.shape));
}

}  // namespace

// ---- dense algebra ------------------------------------------------------------------------------------------------
void Context::linear(const Tensor& x, const LinearWeight& w, const Tensor* bias, const Tensor& y, float beta,
                     const Tensor* c) {
  const char* op = w.fp8() ? "linear_fp8" : "linear";
  check_linear_weight("linear", w);
  const int64_t K = x.dim(-1), N = w.rows(), M = x.rows();
  DFLASH_CHECK(w.cols() == K && y.dim(-1) == N && y.rows() == M, op, ": x ", shape_str(x.shape), " w ",
               shape_str(w.w.shape), " y ", shape_str(y.shape));
  if (c && c->data != y.data)
    DFLASH_CHECK(c->numel() == y.numel(), op, ": c ", shape_str(c->shape), " vs y ", shape_str(y.shape));
  if (bias) DFLASH_CHECK(bias->numel() == N, op, ": bias ", shape_str(bias->shape), " for N = ", N);
  const OpScope scope = op_gemm(op, M, N, K);
  linear_impl(x, w, bias, y, beta, c);
}

LinearWeight Context::quantize_fp8(const Tensor& w, int64_t block_n, int64_t block_k) {
  DFLASH_CHECK(w.ndim() == 2 && block_n >= 1 && block_k >= 1, "quantize_fp8: w ", shape_str(w.shape), " block ",
               block_n, "x", block_k, ": expected w [N, K] and both block sizes >= 1");
  const OpScope scope = op("quantize_fp8");
  return quantize_fp8_impl(w, block_n, block_k);
}

Tensor Context::dequantize_fp8(const LinearWeight& w) {
  check_linear_weight("dequantize_fp8", w);
  const OpScope scope = op("dequantize_fp8");
  return dequantize_fp8_impl(w);
}

void Context::linear_dx(const Tensor& dy, const Tensor& w, const Tensor& dx, float beta) {
  DFLASH_CHECK(w.ndim() == 2, "linear_dx: w ", shape_str(w.shape), ", expected [N, K]");
  const int64_t N = w.dim(0), K = w.dim(1), M = dy.rows();
  DFLASH_CHECK(dy.dim(-1) == N && dx.dim(-1) == K && dx.rows() == M, "linear_dx: dy ", shape_str(dy.shape), " w ",
               shape_str(w.shape), " dx ", shape_str(dx.shape));
  const OpScope scope = op_gemm("linear_dx", M, N, K);
  linear_dx_impl(dy, w, dx, beta);
}

void Context::linear_dw(const Tensor& dy, const Tensor& x, const Tensor& dw, const Tensor* db) {
  const int64_t N = dy.dim(-1), K = x.dim(-1), M = dy.rows();
  DFLASH_CHECK(x.rows() == M && dw.ndim() == 2 && dw.dim(0) == N && dw.dim(1) == K, "linear_dw: dy ",
               shape_str(dy.shape), " x ", shape_str(x.shape), " dw ", shape_str(dw.shape));
  if (db) DFLASH_CHECK(db->numel() == N, "linear_dw: db ", shape_str(db->shape), " for N = ", N);
  const OpScope scope = op_gemm("linear_dw", M, N, K);
  linear_dw_impl(dy, x, dw, db);
}

// ---- normalisation, activations, elementwise ----------------------------------------------------------------------
void Context::rmsnorm(const Tensor& x, const Tensor& w, float eps, const Tensor& y, const Tensor& rstd,
                      const RopeArgs* rope) {
  const int64_t D = x.dim(-1), R = x.numel() / std::max<int64_t>(1, D);
  DFLASH_CHECK(w.numel() == D && y.numel() == x.numel(), "rmsnorm: x ", shape_str(x.shape), " w ", shape_str(w.shape),
               " y ", shape_str(y.shape));
  if (rstd.defined())
    DFLASH_CHECK(rstd.numel() == R, "rmsnorm: rstd ", shape_str(rstd.shape), " for ", R, " rows");
  if (rope) check_rope_rows("rmsnorm", x, *rope);
  const OpScope scope = op_rows("rmsnorm", R, D);
  rmsnorm_impl(x, w, eps, y, rstd, rope);
}

void Context::rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                               const Tensor& dx, const Tensor& dw, float beta, const RopeArgs* rope) {
  const char* op = "rmsnorm_backward";
  const int64_t D = x.dim(-1), R = x.numel() / std::max<int64_t>(1, D);
  DFLASH_CHECK(dy.numel() == x.numel() && dx.numel() == x.numel() && rstd.numel() == R && w.numel() == D, op,
               ": shapes dy ", shape_str(dy.shape), " x ", shape_str(x.shape), " dx ", shape_str(dx.shape), " rstd ",
               shape_str(rstd.shape));
  if (dw.defined()) DFLASH_CHECK(dw.numel() == D, op, ": dw ", shape_str(dw.shape));
  if (rope) check_rope_rows(op, x, *rope);
  const OpScope scope = op_rows(op, R, D);
  rmsnorm_backward_impl(dy, x, w, rstd, dx, dw, beta, rope);
}

void Context::rope(const Tensor& x, const Tensor& pos, const Tensor& inv_freq, bool inverse) {
  DFLASH_CHECK(x.ndim() == 3, "rope: x must be [T, heads, d], got ", shape_str(x.shape));
  const int64_t Tn = x.dim(0), d = x.dim(2), half = inv_freq.numel();
  DFLASH_CHECK(pos.dtype == DType::I32 && pos.numel() == Tn, "rope: pos must be I32 [", Tn, "], got ",
               dtype_name(pos.dtype), " ", shape_str(pos.shape));
  DFLASH_CHECK(half >= 1 && 2 * half <= d, "rope: inv_freq has ", half, " entries, head_dim ", d,
               " (at most head_dim / 2)");
  const OpScope scope = op("rope");
  rope_impl(x, pos, inv_freq, inverse);
}

void Context::silu_mul(const Tensor& gate, const Tensor& up, const Tensor& out) {
  DFLASH_CHECK(up.numel() == gate.numel() && out.numel() == gate.numel(), "silu_mul: shapes ", shape_str(gate.shape),
               " ", shape_str(up.shape), " ", shape_str(out.shape), " differ");
  const OpScope scope = op("silu_mul");
  silu_mul_impl(gate, up, out);
}

void Context::silu_mul_backward(const Tensor& dout, const Tensor& gate, const Tensor& up, const Tensor& dgate,
                                const Tensor& dup) {
  for (const Tensor* t : {&gate, &up, &dgate, &dup})
    DFLASH_CHECK(t->numel() == dout.numel(), "silu_mul_backward: shapes ", shape_str(dout.shape), " and ",
                 shape_str(t->shape), " differ");
  const OpScope scope = op("silu_mul_backward");
  silu_mul_backward_impl(dout, gate, up, dgate, dup);
}

void Context::gelu_tanh_mul(const Tensor& gate, const Tensor& up, const Tensor& out) {
  DFLASH_CHECK(up.numel() == gate.numel() && out.numel() == gate.numel(), "gelu_tanh_mul: shapes ",
               shape_str(gate.shape), " ", shape_str(up.shape), " ", shape_str(out.shape), " differ");
  DFLASH_CHECK(up.dtype == gate.dtype && out.dtype == gate.dtype, "gelu_tanh_mul: dtypes ", dtype_name(gate.dtype), " ",
               dtype_name(up.dtype), " ", dtype_name(out.dtype), " differ");
  const OpScope scope = op("gelu_tanh_mul");
  gelu_tanh_mul_impl(gate, up, out);
}

void Context::softcap(const Tensor& x, float cap) {
  DFLASH_CHECK(cap > 0 && std::isfinite(cap), "softcap: cap must be positive and finite, got ", cap);
  const OpScope scope = op("softcap");
  softcap_impl(x, cap);
}

void Context::embedding(const Tensor& table, const Tensor& ids, const Tensor& out) {
  DFLASH_CHECK(ids.dtype == DType::I32, "embedding: ids must be I32, got ", dtype_name(ids.dtype));
  DFLASH_CHECK(table.ndim() == 2, "embedding: table must be [V, H], got ", shape_str(table.shape));
  DFLASH_CHECK(table.dtype == out.dtype, "embedding: table ", dtype_name(table.dtype), " vs out ",
               dtype_name(out.dtype));
  const int64_t H = table.dim(1), T = ids.numel();
  DFLASH_CHECK(out.numel() == T * H, "embedding: out ", shape_str(out.shape), " for ", T, " ids of width ", H);
  const OpScope scope = op("embedding");
  embedding_impl(table, ids, out);
}

void Context::add(const Tensor& y, const Tensor& x, float alpha) {
  DFLASH_CHECK(x.numel() == y.numel(), "add: shapes ", shape_str(y.shape), " and ", shape_str(x.shape), " differ");
  const OpScope scope = op("add");
  add_impl(y, x, alpha);
}

void Context::copy_columns(const Tensor& dst, const Tensor& src, int64_t col0) {
  const int64_t R = src.rows(), C = src.dim(-1), Ct = dst.dim(-1);
  DFLASH_CHECK(dst.rows() == R && col0 >= 0 && col0 + C <= Ct, "copy_columns: src ", shape_str(src.shape), " dst ",
               shape_str(dst.shape), " col0 ", col0);
  const OpScope scope = op("copy_columns");
  copy_columns_impl(dst, src, col0);
}

void Context::gather_columns(const Tensor& dst, const Tensor& src, int64_t col0) {
  const int64_t R = dst.rows(), C = dst.dim(-1), Ct = src.dim(-1);
  DFLASH_CHECK(src.rows() == R && col0 >= 0 && col0 + C <= Ct, "gather_columns: src ", shape_str(src.shape), " dst ",
               shape_str(dst.shape), " col0 ", col0);
  const OpScope scope = op("gather_columns");
  gather_columns_impl(dst, src, col0);
}

void Context::gather_rows(const Tensor& dst, const Tensor& src, const Tensor& rows) {
  DFLASH_CHECK(dst.dtype == src.dtype && rows.dtype == DType::I32, "gather_rows: dtypes dst ", dtype_name(dst.dtype),
               " src ", dtype_name(src.dtype), " rows ", dtype_name(rows.dtype), " (dst and src alike, rows I32)");
  const int64_t R = rows.numel(), C = src.dim(-1);
  DFLASH_CHECK(dst.rows() == R && dst.dim(-1) == C, "gather_rows: dst ", shape_str(dst.shape), " for ", R,
               " rows of width ", C);
  const OpScope scope = op("gather_rows");
  gather_rows_impl(dst, src, rows);
}

void Context::argmax(const Tensor& x, const Tensor& out) {
  const int64_t R = x.rows();
  DFLASH_CHECK(out.dtype == DType::I32 && out.numel() == R, "argmax: out must be I32 [", R, "], got ",
               dtype_name(out.dtype), " ", shape_str(out.shape));
  const OpScope scope = op("argmax");
  argmax_impl(x, out);
}

void Context::scale_rows(const Tensor& x, const Tensor& rows, const Tensor& scale) {
  DFLASH_CHECK(rows.dtype == DType::I32, "scale_rows: rows must be I32, got ", dtype_name(rows.dtype));
  DFLASH_CHECK(scale.numel() == rows.numel(), "scale_rows: scale ", shape_str(scale.shape), " for ", rows.numel(),
               " rows");
  const OpScope scope = op("scale_rows");
  scale_rows_impl(x, rows, scale);
}

// ---- attention ------------------------------------------------------------------------------------------------------
void Context::attention_causal(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, int64_t q_offset,
                               float scale, const CausalAttnOpts& opts) {
  check_attention_causal("attention_causal", q, k, v, out, q_offset);
  check_causal_attn_opts("attention_causal", opts, q);
  const OpScope scope = op("attention_causal");
  attention_causal_impl(q, k, v, out, q_offset, scale, opts);
}

void Context::attention_causal_batch(const Tensor& q, const Tensor& out, std::span<const CausalSeq> seqs, float scale,
                                     const CausalAttnOpts& opts) {
  const char* op_name = "attention_causal_batch";
  for (const CausalSeq& s : seqs) {
    DFLASH_CHECK(s.begin >= 0 && s.begin <= s.end && s.end <= q.dim(0), op_name, ": sequence rows [", s.begin, ", ",
                 s.end, ") outside q's ", q.dim(0));
    if (s.end > s.begin)
      check_attention_causal(op_name, q.slice(s.begin, s.end), s.k, s.v, out.slice(s.begin, s.end), s.q_offset);
  }
  check_causal_attn_opts(op_name, opts, q);
  const OpScope scope = op("attention_causal");
  attention_causal_batch_impl(q, out, seqs, scale, opts);
}

void Context::attention_causal_batch_impl(const Tensor& q, const Tensor& out, std::span<const CausalSeq> seqs,
                                          float scale, const CausalAttnOpts& opts) {
  for (const CausalSeq& s : seqs)
    if (s.end > s.begin)
      attention_causal_impl(q.slice(s.begin, s.end), s.k, s.v, out.slice(s.begin, s.end), s.q_offset, scale, opts);
}

void Context::dflash_attention(const DFlashAttnArgs& a, const Tensor& out, const Tensor& lse) {
  check_dflash_attention("dflash_attention", a, out, lse);
  const OpScope scope =
      op("dflash_attention", profiling() ? dflash_attn_fwd_flop(a, a.q.shape[1], a.q.shape[2]) : 0);
  dflash_attention_impl(a, out, lse);
}

void Context::dflash_attention_backward(const DFlashAttnArgs& a, const Tensor& out, const Tensor& lse,
                                        const Tensor& dout, const Tensor& dq, const Tensor& dk_ctx,
                                        const Tensor& dv_ctx, const Tensor& dk_blk, const Tensor& dv_blk) {
  const char* op_name = "dflash_attention_backward";
  check_dflash_attention(op_name, a, out, lse);
  DFLASH_CHECK(dout.numel() == a.q.numel() && dq.numel() == a.q.numel() && dk_ctx.numel() == a.k_ctx.numel() &&
                   dv_ctx.numel() == a.v_ctx.numel() && dk_blk.numel() == a.k_blk.numel() &&
                   dv_blk.numel() == a.v_blk.numel(),
               op_name, ": gradient shapes differ from the inputs' (dout ", shape_str(dout.shape), " dq ",
               shape_str(dq.shape), " dk_ctx ", shape_str(dk_ctx.shape), " dv_ctx ", shape_str(dv_ctx.shape),
               " dk_blk ", shape_str(dk_blk.shape), " dv_blk ", shape_str(dv_blk.shape), ")");
  const OpScope scope =
      op(op_name, profiling() ? 2.5 * dflash_attn_fwd_flop(a, a.q.shape[1], a.q.shape[2]) : 0);
  dflash_attention_backward_impl(a, out, lse, dout, dq, dk_ctx, dv_ctx, dk_blk, dv_blk);
}

// ---- Mixture of Experts ---------------------------------------------------------------------------------------------
void Context::moe_route(const Tensor& logits, int64_t k, bool normalize, const Tensor& idx, const Tensor& weights,
                        const MoeRouteOpts& opts) {
  check_moe_route(logits, k, idx, weights, compute_dtype(), param_dtype(), opts);
  const OpScope scope = op(opts.score == MoeScore::Sigmoid ? "moe_route_sigmoid" : "moe_route");
  moe_route_impl(logits, k, normalize, idx, weights, opts);
}

void Context::moe_group(const Tensor& idx, const Tensor& offsets, const Tensor& rows, const Tensor& slot) {
  check_moe_group(idx, offsets, rows, slot);
  const OpScope scope = op("moe_group");
  moe_group_impl(idx, offsets, rows, slot);
}

void Context::moe_linear(const Tensor& x, const Tensor* rows, const MoeWeights& w, const Tensor& offsets,
                         const Tensor& y, MoeAct act) {
  const MoeLinearDims d = check_moe_linear(x, rows, w, offsets, y, act, compute_dtype());
  const OpScope scope = op_gemm(moe_linear_op_name(act, w), d.R, act == MoeAct::None ? d.N : 2 * d.N, d.K);
  moe_linear_impl(x, rows, w, offsets, y, act, d);
}

void Context::moe_combine(const Tensor& y, const Tensor& slot, const Tensor& weights, const Tensor& out, float beta) {
  check_moe_combine(y, slot, weights, out, compute_dtype(), param_dtype());
  const OpScope scope = op("moe_combine");
  moe_combine_impl(y, slot, weights, out, beta);
}

// ---- hybrid linear-attention targets --------------------------------------------------------------------------------
void Context::rmsnorm_gated(const Tensor& x, const Tensor& w, const Tensor* z, float eps, bool zero_centred,
                            const Tensor& y) {
  const RowsDims d = check_rmsnorm_gated(x, w, z, y, compute_dtype());
  const OpScope scope = op_rows("rmsnorm_gated", d.R, d.D);
  rmsnorm_gated_impl(x, w, z, eps, zero_centred, y, d);
}

void Context::sigmoid_gate(const Tensor& y, const Tensor& gate) {
  const RowsDims d = check_sigmoid_gate(y, gate, compute_dtype());
  const OpScope scope = op("sigmoid_gate");
  sigmoid_gate_impl(y, gate, d);
}

void Context::conv1d_causal(const Tensor& x, const Tensor& w, const Tensor& state, const Tensor& y,
                            std::span<const int64_t> seqs) {
  const Conv1dDims d = check_conv1d_causal(x, w, state, y, compute_dtype(), seqs);
  const OpScope scope = op("conv1d_causal");
  conv1d_causal_impl(x, w, state, y, d);
}

void Context::gdn_gate(const Tensor& ba, const Tensor& A_log, const Tensor& dt_bias, const Tensor& g,
                       const Tensor& beta) {
  const int64_t T = check_gdn_gate(ba, A_log, dt_bias, g, beta, compute_dtype(), param_dtype());
  const OpScope scope = op("gdn_gate");
  gdn_gate_impl(ba, A_log, dt_bias, g, beta, T);
}

void Context::gated_delta_rule(const GatedDeltaArgs& a, const Tensor& out) {
  const int64_t T = check_gated_delta_rule(a, out, compute_dtype(), param_dtype());
  // FLOPs of the recurrence per token and value head: decay, S^T k, the rank-1 update, S^T q (CUDA's chunked form
  // does more; bench_gdn counts its own)
  const OpScope scope = op("gated_delta_rule", 8.0 * double(T) * double(a.nv) * double(a.dk) * double(a.dv));
  gated_delta_rule_impl(a, out, T);
}

// ---- loss and optimizer ---------------------------------------------------------------------------------------------
LossStats Context::lm_head_loss(const LossArgs& a) {
  const char* op_name = "lm_head_loss";
  const int64_t H = a.h.dim(-1), Rs = a.rows.numel();
  DFLASH_CHECK(a.lm_head.ndim() == 2 && a.lm_head.dim(1) == H, op_name, ": lm_head ", shape_str(a.lm_head.shape),
               " vs hidden ", H);
  const int64_t V = a.lm_head.dim(0);
  DFLASH_CHECK(a.rows.dtype == DType::I32 && a.labels.dtype == DType::I32 && a.labels.numel() == Rs &&
                   a.weights.dtype == DType::F32 && a.weights.numel() == Rs,
               op_name, ": rows/labels I32 and weights F32 of equal length, got rows ", shape_str(a.rows.shape),
               ", labels ", dtype_name(a.labels.dtype), " ", shape_str(a.labels.shape), ", weights ",
               dtype_name(a.weights.dtype), " ", shape_str(a.weights.shape));
  if (a.teacher_h.defined())
    DFLASH_CHECK(a.teacher_h.rows() == Rs && a.teacher_h.dim(-1) == H, op_name, ": teacher_h ",
                 shape_str(a.teacher_h.shape), " for ", Rs, " rows");
  const int64_t K = a.topk;
  if (K > 0) {
    DFLASH_CHECK(K <= V, op_name, ": topk ", K, " exceeds the ", V, "-token vocabulary");
    DFLASH_CHECK(a.topk_ids.dtype == DType::I32 && a.topk_ids.numel() == Rs * K &&
                     a.topk_logits.dtype == param_dtype() && a.topk_logits.numel() == Rs * K,
                 op_name, ": topk_ids I32 and topk_logits ", dtype_name(param_dtype()), " [", Rs, ", ", K,
                 "], got topk_ids ", dtype_name(a.topk_ids.dtype), " ", shape_str(a.topk_ids.shape),
                 " and topk_logits ", dtype_name(a.topk_logits.dtype), " ", shape_str(a.topk_logits.shape));
  }
  if (a.dh.defined())
    DFLASH_CHECK(a.dh.numel() == a.h.numel(), op_name, ": dh ", shape_str(a.dh.shape), " vs h ", shape_str(a.h.shape));
  const double passes = 1.0 + (a.dh.defined() ? 1.0 : 0.0) + (a.teacher_h.defined() ? 1.0 : 0.0);
  const OpScope scope = op(op_name, 2.0 * passes * double(Rs) * double(a.lm_head.numel()));
  return lm_head_loss_impl(a);
}

// ---- DFlash2 --------------------------------------------------------------------------------------------------------
void Context::dynamic_conv(const DynConvArgs& a, const Tensor& y, const Tensor* res) {
  const DynConvDims d = check_dynamic_conv(a, y, res, compute_dtype());
  const OpScope scope = op("dynamic_conv", 2.0 * double(d.R) * double(d.C) * double(d.T));
  dynamic_conv_impl(a, y, res, d);
}

void Context::dynamic_conv_backward(const DynConvArgs& a, const Tensor& dy, const Tensor& du, const Tensor& d_delta,
                                    const Tensor& d_base) {
  const DynConvDims d = check_dynamic_conv(a, dy, nullptr, compute_dtype());
  DFLASH_CHECK(du.numel() == d.R * d.C && d_delta.numel() == a.delta.numel() && d_base.numel() == a.base.numel(),
               "dynamic_conv_backward: du ", shape_str(du.shape), ", d_delta ", shape_str(d_delta.shape), ", d_base ",
               shape_str(d_base.shape), " must have the shapes of u, delta, base");
  const OpScope scope = op("dynamic_conv_backward", 6.0 * double(d.R) * double(d.C) * double(d.T));
  dynamic_conv_backward_impl(a, dy, du, d_delta, d_base, d);
}

SelectorStats Context::candidate_selector(const SelectorArgs& a, const Tensor& scores) {
  const SelectorDims d = check_candidate_selector(a, scores, compute_dtype(), param_dtype());
  const OpScope scope =
      op("candidate_selector", (a.dg.defined() ? 6.0 : 2.0) * double(d.M) * double(d.K) * double(d.r));
  return candidate_selector_impl(a, scores, d);
}

void Context::adamw(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v, const AdamWArgs& a,
                    const Tensor& param_compute) {
  const int64_t n = param.numel();
  DFLASH_CHECK(grad.numel() == n && m.numel() == n && v.numel() == n, "adamw: param ", shape_str(param.shape),
               " grad ", shape_str(grad.shape), " m ", shape_str(m.shape), " v ", shape_str(v.shape));
  if (param_compute.defined() && param_compute.data != param.data)
    DFLASH_CHECK(param_compute.numel() == n, "adamw: param_compute ", shape_str(param_compute.shape), " for param ",
                 shape_str(param.shape));
  const OpScope scope = op("adamw");
  adamw_impl(param, grad, m, v, a, param_compute);
}

double Context::sum_squares(const Tensor& x) {
  const OpScope scope = op("sum_squares");
  return sum_squares_impl(x);
}

void Context::fill_normal(const Tensor& out, double std, uint64_t seed, RngPurpose purpose, uint64_t stream) {
  const OpScope scope = op("fill_normal");
  fill_normal_impl(out, std, seed, purpose, stream);
}

}  // namespace dflash
