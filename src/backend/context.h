// backend/context.h — the per-device, per-worker execution context and the op interface.
// defines: Context (abstract), Event, RopeArgs, DFlashAttnArgs, LossArgs, LossStats, AdamWArgs, MoeAct, MoeWeights,
//          CausalAttnOpts, GatedDeltaArgs, make_context, ContextOptions, lazy_init_count, note_lazy_init,
//          mxfp4_dequantize, int4_dequantize, LinearWeight, check_linear_weight, fp8_dequantize
//
// One Context per device per worker thread. It owns everything mutable that executing ops needs: on the CPU a
// thread pool; on CUDA the stream, the cuBLASLt handle, its workspace and a stream-ordered memory pool. There is
// no process-global mutable state behind it, so worker threads that each own a Context never share anything
// mutable (case C01). Weights shared between workers are immutable tensors allocated before the workers start.
//
// Each op is one non-virtual method below, the same for every backend (backend/context_ops.cpp; ggml's rule: shapes
// are checked where an op is built, its backends only compute). It (1) checks its arguments: the shapes, dtypes and
// sizes that must agree (the check_* functions below and the op's own; Error naming the op, the tensor and its
// shape), (2) opens the op's profiling scope (OpScope: its name and FLOP count, backend/op_profile.h), then (3) calls
// the protected virtual <op>_impl, implemented once for the CPU (cpu/context.cpp -> src/backend/cpu/<op>.cpp) and once
// for CUDA (cuda/context.cpp -> src/backend/cuda/<op>.cu). An _impl only computes: it checks nothing of the above,
// only what is its own (its tensors on its device in the dtypes it computes in, e.g. CUDA's BF16 activations; its
// kernels' limits; index values, on the host by the CPU, on the device by CUDA). Memory, copies, events and
// synchronisation are plain virtual methods of the backends. Conventions for every op:
//  * Tensors are contiguous row-major; "[R, D]" means any leading shape whose product is R.
//  * "act" tensors use the context's compute_dtype(): F32 on "cpu", F64 on "cpu64" (fp64 gradient checks),
//    BF16 on CUDA. Weights likewise. Parameter gradients ("dw", "db"), master weights, optimizer moments and
//    saved statistics (rstd, lse) use param_dtype(): F32, or F64 on "cpu64". Gradients are ACCUMULATED (+=).
//  * Unless stated otherwise an op writes (overwrites) its outputs; `beta` = 1 accumulates into the output.
//  * Ops are asynchronous on CUDA (ordered on the context's stream); methods returning host values sync.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "backend/op_profile.h"
#include "core/rng.h"
#include "core/tensor.h"

namespace dflash {

// The RoPE that rmsnorm / rmsnorm_backward apply to their rows (the per-head q / k norms of attention, RoPE fused
// in): the rows of x [R, D] are (token, head) pairs, row r of token r / heads at position pos[r / heads]; angles
// pos * inv_freq[i], the rotate-half convention of Context::rope (D = head_dim, R = T heads).
struct RopeArgs {
  Tensor pos;         // [T] I32, T = R / heads
  Tensor inv_freq;    // [D/2] F32, from rope_inv_freq()
  int64_t heads = 1;  // rows per token
};

// DFlash attention (spec 2.2-2.3) of one sequence. Block j (anchor a_j, slot i) attends to context keys
// k < a_j (strictly) and to the B keys of its own block (bidirectional); a padding block (valid_j = 0) attends
// to nothing and outputs zeros. With window > 0 (sliding-window layer option), context keys also need
// k >= a_j + i - (window - 1) and block keys become causal within the block.
struct DFlashAttnArgs {
  Tensor q;        // [N*B, nh, d]   act, RoPE already applied
  Tensor k_ctx;    // [S, nkv, d]    act, context keys (from the fused target features)
  Tensor v_ctx;    // [S, nkv, d]
  Tensor k_blk;    // [N*B, nkv, d]  act, keys of the block tokens
  Tensor v_blk;    // [N*B, nkv, d]
  Tensor anchors;  // [N] I32, sorted ascending, 0 <= a_j <= S (training: <= S-2; inference: a_j = S, the
                   // whole cached context visible); any value for padding blocks
  Tensor valid;    // [N] U8, 0 = padding block
  int block_size = 16;
  float scale = 0.0f;  // softmax scale, usually 1/sqrt(d)
  int window = 0;      // 0 = full attention
};

// Fused lm_head + loss over selected rows, chunked so that at most `chunk_rows` x V logits exist at once
// (spec 2.4). For each selected row r (h row index rows[r]):
//   z = h[rows[r]] @ lm_head^T                     (student logits, fp32)
//   ce_r = logsumexp(z) - z[label_r]
//   with teacher_h: p = softmax(teacher_h[r] @ lm_head^T), kl_r = sum p (log p - log softmax(z))
//   loss contribution = weight_r * (ce_r + kl_weight * kl_r) * grad_scale
// dh[rows[r]] = d(contribution)/dh  (written; rows not selected are left untouched: zero dh beforehand).
struct LossArgs {
  Tensor h;          // [R, H] act, final-normed drafter hidden states
  Tensor lm_head;    // [V, H] act (frozen target weight)
  Tensor rows;       // [Rs] I32 indices into h of the rows to score (rows with weight > 0)
  Tensor labels;     // [Rs] I32 target ids
  Tensor weights;    // [Rs] F32 loss weights w
  Tensor teacher_h;  // [Rs, H] act or undefined: target final-norm hidden rows for soft labels
  float kl_weight = 0.0f;
  float grad_scale = 1.0f;  // 1 / (global sum of w); D-PACE's loss head passes 1 (model/draft_loss.h)
  int64_t chunk_rows = 1024;
  Tensor dh;         // [R, H] act, output gradient (may be undefined for forward-only evaluation)
  // DFlash2's candidates (optional): with topk > 0, the topk largest student logits z of each selected row r, in
  // descending order, ties to the lower token id: topk_ids [Rs, topk] I32 and topk_logits [Rs, topk] param dtype
  // (F32; F64 on cpu64: z as the loss sees it). 0 < topk <= V.
  int64_t topk = 0;
  Tensor topk_ids, topk_logits;
};
// Per selected row: ce, kl (0 without teacher) and whether argmax(z) == label. Host vectors after the call.
struct LossStats {
  std::vector<double> ce, kl;
  std::vector<uint8_t> correct;
};

// DFlash2's grouped dynamic convolution of one side of a sublayer (docs/spec.md 1.1; vLLM qwen3_dflash2.py
// DFlashGroupedConv, SpecForge dflash2.py). The R rows of u are block tokens in blocks of block_size consecutive rows
// (row t is slot t mod block_size of its block); C channels in G = C / group groups of `group` consecutive channels;
// T = base.dim(1) taps. For the side s (0: before the sublayer, 1: after it):
//   w_t[k, c] = base[s, k, c] + delta[t, s T G + k G + c / group]            (per-token kernel: base + dynamic part)
//   y[t, c]   = sum over k < T with (t mod block_size) >= k of w_t[k, c] u[t - k, c]    (+ res[t, c] when given)
// A tap never reaches back past its block's first row. Sums in fp32 (fp64 on cpu64), rounded once.
struct DynConvArgs {
  Tensor u;       // [R, C] act: the sublayer's normed input (side 0) or its output (side 1)
  Tensor delta;   // [R, 2 T G] act: kernel_projection(normed sublayer input), both sides
  Tensor base;    // [2, T, C] act: base_kernel
  int side = 0;   // 0 or 1
  int64_t block_size = 0;  // > 0, divides R
  int64_t group = 0;       // > 0, divides C
};

// DFlash2's candidate selector, the pair scores of one step (docs/spec.md 1.2; vLLM qwen3_dflash2.py
// CandidateSelector._score_edges, SpecForge's selector loss). M scored rows; row m reads row rows[m] of g and scores
// the K candidates cand[m, :] after the predecessor token prev[m]:
//   e[m, j] = U[m, j] + sum_q P[prev[m], q] g[rows[m], q] S[cand[m, j], q]          (no scale)
// U = cand_logit (the candidates' lm_head logits), P / S the predecessor / successor codebooks, g = hidden_projection
// of the final-normed drafter hidden. With labels (training or teacher-forced statistics), per row:
//   covered[m] = label[m] is among cand[m, :] (at j*),  correct[m] = argmax_j e[m, j] == label[m] (first on ties),
//   loss[m]    = covered ? logsumexp_j e[m, j] - e[m, j*] : 0                      (SpecForge's strict top-k CE)
// and with gradients (dg defined), for the weighted loss sum_m weights[m] loss[m], de[m, j] = weights[m] (softmax(e)_j -
// [j = j*]) on covered rows:
//   dg[rows[m]]       += sum_j de[m, j] P[prev[m]] * S[cand[m, j]]
//   d_pred_cb[prev[m]] += sum_j de[m, j] g[rows[m]] * S[cand[m, j]]          (F32 / F64, scatter-add)
//   d_succ_cb[cand[m,j]] += de[m, j] P[prev[m]] * g[rows[m]]
//   dh[rows[m]]       += sum_j de[m, j] lm_head[cand[m, j]]                   (dU = de: through the unary logits)
// Training rows must be distinct (rows strictly ascending). Products and sums in fp32 (fp64 on cpu64).
struct SelectorArgs {
  Tensor g;           // [R, r] act
  Tensor rows;        // [M] I32 in [0, R)
  Tensor prev;        // [M] I32 token ids in [0, V)
  Tensor cand;        // [M, K] I32 token ids
  Tensor cand_logit;  // [M, K] param dtype (F32; F64 on cpu64)
  Tensor pred_cb, succ_cb;  // [V, r] act
  Tensor labels;      // [M] I32, or undefined: scores only
  Tensor weights;     // [M] F32 (gradients only)
  Tensor lm_head;     // [V, H] act (gradients only)
  Tensor dg, dh;      // [R, r], [R, H] act, accumulated; undefined: no gradients
  Tensor d_pred_cb, d_succ_cb;  // [V, r] param dtype, accumulated
};
// Per scored row (host vectors; empty without labels).
struct SelectorStats {
  std::vector<double> loss;
  std::vector<uint8_t> covered, correct;
};

struct AdamWArgs {
  float lr = 6e-4f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.0f;
  float grad_scale = 1.0f;  // multiplies the gradient first (global-norm clipping)
  int64_t step = 1;         // 1-based, for bias correction
};

// A point in one context's stream of ops (CUDA: a cudaEvent_t). Another context, on the same or another device, can
// order its later ops after that point without blocking the host (the transport between training workers). On
// the CPU every op has finished when it returns, so an event is complete as soon as it is recorded.
class Event {
 public:
  virtual ~Event() = default;
};

// How Context::moe_route scores the experts: a softmax over all E logits (Qwen3-MoE, gpt-oss), or a sigmoid of each
// (MiniMax-M2, DeepSeek-V3), optionally with a bias added for choosing only (their e_score_correction_bias).
enum class MoeScore { Softmax, Sigmoid };
struct MoeRouteOpts {
  MoeScore score = MoeScore::Softmax;
  Tensor choice_bias;  // [E] F32 on the op's device, or undefined; Sigmoid only: the top k of p + b are chosen
  // Group-limited choice (Sigmoid only; DeepSeek-V3's "noaux_tc", DeepseekV3MoE.route_tokens_to_experts): the E
  // experts are n_group groups of E / n_group consecutive ones; a group's score is the sum of its two largest choice
  // values c = p + b; the topk_group groups of largest score are kept (ties to the lower group) and the top k are
  // chosen among their experts only. The experts of the other groups are excluded, as DeepSeek's reference Gate and
  // the serving engines' grouped top-k mask them (-inf); transformers' masked_fill(0.0) chooses the same experts
  // unless fewer than k of the kept ones have c > 0. n_group 1: no groups (then topk_group must be 1).
  int64_t n_group = 1, topk_group = 1;
  // The weights times this after any renormalisation (DeepSeek-V3's routed_scaling_factor, 2.5).
  double scale = 1.0;
};

// The epilogue of Context::moe_linear.
enum class MoeAct {
  None,       // y = a W_e^T (+ b_e)
  SwiGLU,     // y = silu(g) * u,  g = a G_e^T (+ b_g), u = a U_e^T (+ b_u); W_e = [G_e ; U_e] (gate rows first)
  ClampedSwiGLU,  // g and u as SwiGLU (biases added first), clamped at L = kClampedSwiGLULimit, alpha =
                  // kClampedSwiGLUAlpha: g = min(g, L), u = clamp(u, -L, L), y = (u + 1) * g * sigmoid(alpha g)
                  // (vLLM's "swigluoai", llama.cpp's SWIGLU_OAI; gpt-oss's experts use it: transformers'
                  // GptOssExperts._apply_gate)
};
// The parameters of MoeAct::ClampedSwiGLU, fixed at compile time (the kernels' epilogue constants).
inline constexpr double kClampedSwiGLUAlpha = 1.702;
inline constexpr double kClampedSwiGLULimit = 7.0;

// The expert weights of Context::moe_linear: plain, MXFP4 (OCP Microscaling Formats v1.0: e2m1 elements, one e8m0
// scale per 32 consecutive elements along K) or INT4 (symmetric integers in groups along K with one bf16 scale each:
// compressed-tensors' pack-quantized, io/hf_config.h Int4Format), each with an optional bias. N' = N for MoeAct::None,
// 2N for the gated acts (gate rows 0..N-1, then up rows N..2N-1).
struct MoeWeights {
  // [E, N', K] act dtype; or U8 [E, N', K/2] when scales is defined: byte j of a row holds elements 2j (low nibble)
  // and 2j+1 (high nibble). MXFP4: e2m1 codes, bits 0-2 index {0, .5, 1, 1.5, 2, 3, 4, 6}, bit 3 the sign. INT4: the
  // code c (0..15) is the integer c - 8 (compressed-tensors' pack_to_int32 offset; its little-endian int32 words are
  // these bytes).
  Tensor w;
  // MXFP4: U8 [E, N', K/32], element value = e2m1 * 2^(scale - 127), K % 32 == 0. INT4: BF16 [E, N', K/int4_group],
  // element (n, k) = (c - 8) * scales[n, k / int4_group]. Undefined = plain weights.
  Tensor scales;
  Tensor bias;  // [E, N'] act dtype, added to a w^T before the activation; undefined = none
  // INT4: the elements per scale along K, a multiple of 32 dividing K; 0 = MXFP4 (when scales is defined).
  int64_t int4_group = 0;
  MoeWeights() = default;
  MoeWeights(const Tensor& w_) : w(w_) {}  // implicit: existing callers pass a plain weight tensor
  bool mxfp4() const { return scales.defined() && int4_group == 0; }
  bool int4() const { return scales.defined() && int4_group > 0; }
  bool quantized() const { return scales.defined(); }
};

// The weight of Context::linear: plain, or FP8 with block scales. Plain: w [N, K] in the act dtype. FP8: w F8E4M3
// [N, K] and scale F32 [ceil(N / block_n), ceil(K / block_k)], element (n, k) = fp8(w[n, k]) * scale[n / block_n,
// k / block_k] (an FP8 checkpoint's weight and weight_scale_inv / weight_scale: io/hf_config.h Fp8Format; per
// channel is block 1 x K, per tensor N x K). Partial blocks at the edges.
struct LinearWeight {
  Tensor w;
  Tensor scale;  // undefined = plain
  int64_t block_n = 0, block_k = 0;
  LinearWeight() = default;
  LinearWeight(const Tensor& w_) : w(w_) {}  // implicit: a plain weight tensor
  bool fp8() const { return scale.defined(); }
  bool defined() const { return w.defined(); }
  int64_t rows() const { return w.shape[0]; }
  int64_t cols() const { return w.shape[1]; }
  // Bytes on the device (elements and scales).
  int64_t nbytes() const { return w.nbytes() + (scale.defined() ? scale.nbytes() : 0); }
};

// Checks an FP8 LinearWeight (Error naming `op` and the shapes): w F8E4M3 [N, K], block sizes positive, scale F32
// [ceil(N / block_n), ceil(K / block_k)]. A plain one must be 2-D. Run by Context::linear and dequantize_fp8.
void check_linear_weight(const char* op, const LinearWeight& w);

// Host dequantisation of an FP8 LinearWeight (host tensors) -> F32 [N, K] on the host, exact (an e4m3 value times an
// F32 scale is one f32 product). Throws Error as check_linear_weight.
Tensor fp8_dequantize(const LinearWeight& w);

// Host dequantisation of MXFP4 rows (the layout of MoeWeights): blocks U8 [*, G, 16] (a published checkpoint's
// `*_blocks`) or [*, 16 G], scales U8 [*, G] (`*_scales`), on the host -> F32 [*, 32 G] on the host, element
// 2j + h of a row = FP4[(byte j >> 4h) & 15] * 2^(scale - 127) of its block of 32 (ldexp, exact while in range).
// Equals transformers' integrations/mxfp4.py _convert_moe_packed_tensors before its final transpose(1, 2), i.e.
// HF's dequantised [E, K, N'] is this [E, N', K] transposed. Throws Error naming the shapes when they disagree.
Tensor mxfp4_dequantize(const Tensor& blocks, const Tensor& scales);

// Host dequantisation of INT4 rows (the layout of MoeWeights): codes U8 [*, K/2] (or a checkpoint's weight_packed
// I32 [*, K/8], the same bytes), scales [*, K/group] BF16, F16 or F32 on the host -> F32 [*, K] on the host, element k of
// a row = (((byte k/2 >> 4 (k % 2)) & 15) - 8) * scale[k / group], exact in F32 (a 4-bit integer times a scale of at
// most 24 significant bits). compressed-tensors' unpack_from_int32 then dequantize with zero point 0. Throws Error
// naming the shapes when they disagree or group does not divide K.
Tensor int4_dequantize(const Tensor& codes, const Tensor& scales, int64_t group);

struct MemoryStats {
  int64_t in_use_bytes = 0, peak_bytes = 0, limit_bytes = 0;
};

// The gated delta rule of one sequence (Context::gated_delta_rule; Yang, Kautz, Hatamizadeh 2024, "Gated Delta
// Networks", arXiv 2412.06464; transformers' torch_recurrent_gated_delta_rule with use_qk_l2norm_in_kernel=True).
// T tokens; nk key heads of dk, nv value heads of dv, nv a multiple of nk: value head h reads key head h / (nv / nk)
// (transformers' repeat_interleave). Per value head, in fp32, with S the [dk, dv] state:
//   q_t = l2norm(q_t) / sqrt(dk),  k_t = l2norm(k_t)       l2norm(x) = x / sqrt(sum x^2 + 1e-6)
//   S   = exp(g_t) S
//   S  += k_t (beta_t (v_t - S^T k_t))^T                     (the delta rule: S^T k_t moves towards v_t)
//   o_t = S^T q_t
struct GatedDeltaArgs {
  Tensor qkv;    // [T, 2 nk dk + nv dv] act: per row q (nk heads x dk), k (nk x dk), v (nv x dv) (the conv's output)
  // g, beta, state: param dtype (F32; F64 on cpu64)
  Tensor g;      // [T, nv], log of the decay (<= 0)
  Tensor beta;   // [T, nv], the delta rule's step (in (0, 1))
  Tensor state;  // [nv, dk, dv]: the state before token 0, replaced by the state after token T-1; undefined:
                 // start from zeros and drop the final state (a prefill without a cache)
  int64_t nk = 0, dk = 0, nv = 0, dv = 0;
  // Optional: the T rows are several independent sequences, rows [seqs[i], seqs[i+1]) (seqs[0] = 0, ascending,
  // seqs.back() = T), each from a zero state (state must be undefined): a packed prefill in one call (CUDA: one
  // launch for all of them). Empty: one sequence.
  std::vector<int64_t> seqs;
};

// One sequence of Context::attention_causal_batch: queries = rows [begin, end) of the batch's q / out, at positions
// q_offset, q_offset + 1, ...; k, v [Tk, nkv, d] its keys (a KV cache prefix, or rows of the batch's own k / v), with
// q_offset + (end - begin) <= Tk.
struct CausalSeq {
  int64_t begin = 0, end = 0;
  Tensor k, v;
  int64_t q_offset = 0;
};

// Options of Context::attention_causal / attention_causal_batch beyond plain causal GQA (gpt-oss: transformers'
// GptOssAttention with eager_attention_forward):
//   window > 0: the query at position p sees keys max(0, p - window + 1) .. p (masking_utils'
//     sliding_window_overlay: a key is masked when kv_idx <= q_idx - sliding_window); 0 = every key 0 .. p.
//   sinks [nh] F32, when defined: per head a logit s_h that joins every row's softmax denominator and adds no output:
//     p_j = exp(x_j - m) / (sum_i exp(x_i - m) + exp(s_h - m)), m = max(max_i x_i, s_h), x = scaled scores.
struct CausalAttnOpts {
  int64_t window = 0;
  Tensor sinks;
};

// Argument checks of the MoE ops, run by Context's public ops (throw Error naming the op, the tensor and its shape):
// dtypes, ranks and the sizes that must agree. `act` is the context's compute dtype, `param` its param dtype.
struct MoeLinearDims {
  int64_t R, N, K, E;  // grouped rows, output columns, inner size, experts
};
void check_moe_route(const Tensor& logits, int64_t k, const Tensor& idx, const Tensor& weights, DType act, DType param,
                     const MoeRouteOpts& opts = {});
void check_moe_group(const Tensor& idx, const Tensor& offsets, const Tensor& rows, const Tensor& slot);
// moe_linear: MXFP4 weights need U8 w [E, N', K/2] and scales [E, N', K/32] with K % 32 == 0; INT4 weights U8 w
// [E, N', K/2] and BF16 scales [E, N', K/g] with g = int4_group a multiple of 32 dividing K; a bias [E, N'] of dt.
MoeLinearDims check_moe_linear(const Tensor& x, const Tensor* rows, const MoeWeights& w, const Tensor& offsets,
                               const Tensor& y, MoeAct act, DType dt);
// The name moe_linear is profiled under: "moe_linear", "moe_linear_swiglu" or "moe_linear_clamped_swiglu", with
// "_mxfp4" for MXFP4 weights, "_int4" for INT4 ones.
const char* moe_linear_op_name(MoeAct act, const MoeWeights& w);
// attention_causal's options (CausalAttnOpts): window >= 0, sinks undefined or F32 [nh] (nh = q's heads) on q's device
// or the host (a device backend uploads them). `op` names the op in the error.
void check_causal_attn_opts(const char* op, const CausalAttnOpts& opts, const Tensor& q);
// DFlash2's ops (run by Context's public ops; Error naming the op, the tensor and its shape).
struct DynConvDims {
  int64_t R, C, T, G;
};
DynConvDims check_dynamic_conv(const DynConvArgs& a, const Tensor& y, const Tensor* res, DType act);
struct SelectorDims {
  int64_t M, K, r, V, R;
};
SelectorDims check_candidate_selector(const SelectorArgs& a, const Tensor& scores, DType act, DType param);
void check_moe_combine(const Tensor& y, const Tensor& slot, const Tensor& weights, const Tensor& out, DType act,
                       DType param);

// Argument checks of the hybrid ops, run by Context's public ops (Error naming the op, the tensor and its shape); `act`
// is the context's compute dtype, `param` its param dtype. Return the dimensions the kernels use.
struct RowsDims {
  int64_t R, D;
};
RowsDims check_rmsnorm_gated(const Tensor& x, const Tensor& w, const Tensor* z, const Tensor& y, DType act);
RowsDims check_sigmoid_gate(const Tensor& y, const Tensor& gate, DType act);  // D = gate's columns (D or 1)
struct Conv1dDims {
  int64_t T, C, K;
  std::span<const int64_t> seqs;  // several sequences (conv1d_causal's seqs), or empty: one
};
Conv1dDims check_conv1d_causal(const Tensor& x, const Tensor& w, const Tensor& state, const Tensor& y, DType act,
                               std::span<const int64_t> seqs = {});
int64_t check_gdn_gate(const Tensor& ba, const Tensor& A_log, const Tensor& dt_bias, const Tensor& g,
                       const Tensor& beta, DType act, DType param);  // returns T
int64_t check_gated_delta_rule(const GatedDeltaArgs& a, const Tensor& out, DType act, DType param);  // returns T

class Context {
 public:
  virtual ~Context() = default;
  virtual Device device() const = 0;
  virtual DType compute_dtype() const = 0;
  virtual DType param_dtype() const = 0;
  virtual std::string describe() const = 0;  // e.g. "cpu (2 threads)", "cuda:0 NVIDIA H200 (hopper kernels)"
  // What runs each group of ops here, as {ops, kernel} rows for `dflash info --device` and a run's log (the CUDA
  // kernel tiers: backend/kernel_tier.h, docs/gpus.md).
  virtual std::vector<std::pair<std::string, std::string>> kernel_table() const {
    return {{"every op", "the CPU reference (GEMMs through OpenBLAS)"}};
  }

  // ---- memory -------------------------------------------------------------------------------------------
  virtual Tensor empty(DType t, Shape s) = 0;
  Tensor zeros(DType t, Shape s);
  virtual void zero(const Tensor& t) = 0;
  // Copies between any two tensors of equal numel where each is on the host or on this context's device.
  // dtypes must be equal, or F32 <-> BF16 (converted, round to nearest even).
  virtual void copy(const Tensor& dst, const Tensor& src) = 0;
  // A copy of `t` on this context's device converted to `dt` (a no-op view if already there and dt matches).
  Tensor to_device(const Tensor& t, DType dt);
  Tensor to_device(const Tensor& t) { return to_device(t, t.dtype); }
  // A host copy (F32 for float tensors if as_f32, else same dtype). Synchronises.
  Tensor to_host(const Tensor& t, bool as_f32 = true);
  virtual void synchronize() = 0;
  // ---- ordering between contexts ------------------------------------------------------------------------
  // create_event() belongs to this context (make events in the warm-up: creating one counts as a lazy init
  // after it). record(e): e (created by THIS context) marks everything enqueued so far. wait(e): ops enqueued on
  // this context from now on run after e's point; e may come from any context; an event never recorded is
  // complete. host_wait(e): blocks the calling thread until e's point has run. copy() between two device tensors
  // of the same dtype also works across devices (peer copy, on this context's stream).
  virtual std::unique_ptr<Event> create_event() = 0;
  virtual void record(Event& e) = 0;
  virtual void wait(const Event& e) = 0;
  virtual void host_wait(const Event& e) = 0;
  // Lets `other`'s device read and write this context's memory and this device reach `other`'s directly (CUDA peer
  // access and the pool's access list; a no-op on the CPU, on the same device, or where the hardware has no peer
  // path: copies are then staged by the driver). Call for both contexts of a pair, in the warm-up.
  virtual void enable_peer_access(const Context& other) {}
  // The device ordinal (CUDA) or 0, and the native stream (cudaStream_t) or nullptr on the CPU.
  virtual int device_index() const { return 0; }
  virtual void* native_stream() const { return nullptr; }
  virtual MemoryStats memory() const = 0;
  virtual void reset_peak_memory() = 0;

  // ---- dense algebra ------------------------------------------------------------------------------------
  // y[M,N] = x[M,K] @ w[N,K]^T (+ bias[N]) + beta * c, with c[M,N] of y's dtype, or y itself when c is null (an
  // accumulation). c != y: a residual add without a copy (the drafter's h_mid = h_in + o Wo^T; h_in is kept).
  // w plain or FP8 (LinearWeight). FP8: the CPU multiplies by the dequantised weight (the reference); CUDA quantizes
  // x per row and 128 columns to e4m3 (scale amax / 448) and runs the FP8 tensor cores with both scales applied in
  // the fp32 accumulation where it can (Hopper, block 128 x 128), else multiplies by the dequantised weight.
  void linear(const Tensor& x, const LinearWeight& w, const Tensor* bias, const Tensor& y, float beta = 0.f,
              const Tensor* c = nullptr);
  // FP8 E4M3 quantization of w [N, K] (act dtype) in blocks of block_n x block_k (>= 1; partial blocks at the
  // edges): scale = amax(|block|) / 448 (1 for an all-zero block), q = e4m3(w / scale) rounded to nearest even,
  // the scheme of FP8 checkpoints and of transformers' FineGrainedFP8 act_quant. Returns the LinearWeight on this
  // context's device.
  LinearWeight quantize_fp8(const Tensor& w, int64_t block_n, int64_t block_k);
  // The FP8 weight w (on this context's device) dequantised: [N, K] in the act dtype, element q * scale (rounded to
  // the act dtype). For the weights no FP8 kernel takes (routed experts: they run through moe_linear in bf16).
  Tensor dequantize_fp8(const LinearWeight& w);
  // dx[M,K] = dy[M,N] @ w[N,K] + beta * dx
  void linear_dx(const Tensor& dy, const Tensor& w, const Tensor& dx, float beta = 0.f);
  // dw[N,K] += dy[M,N]^T @ x[M,K] (F32);  db[N] += sum_rows dy (F32) when db != nullptr
  void linear_dw(const Tensor& dy, const Tensor& x, const Tensor& dw, const Tensor* db);

  // ---- normalisation, activations, elementwise -----------------------------------------------------------
  // y = x / sqrt(mean(x^2) + eps) * w over the last dim D; x, y [R, D]; w [D]; rstd [R] F32 (saved for
  // backward) when defined. y may alias x. With rope: y = RoPE(x / sqrt(mean(x^2) + eps) * w), each row rotated
  // at its token's position (RopeArgs; R = T heads, D = head_dim even); rstd is still the norm's.
  void rmsnorm(const Tensor& x, const Tensor& w, float eps, const Tensor& y, const Tensor& rstd,
               const RopeArgs* rope = nullptr);
  // dx = d/dx (+ beta*dx); dw [D] F32 += d/dw. Needs the forward's x and rstd. dx may alias dy or x. With rope
  // (the forward's): dy is the gradient of the rotated y; it is rotated back (rope(..., inverse = true)) and the
  // above runs on that. dy itself is not modified (unless dx aliases it).
  void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                        const Tensor& dx, const Tensor& dw, float beta = 0.f,
                        const RopeArgs* rope = nullptr);
  // In-place rotate-half RoPE of x [T, heads, d] at positions pos [T] (I32), angles pos * inv_freq[i]
  // (inv_freq [d/2] F32, computed by rope_inv_freq() incl. rope scaling). inverse = rotate by -angle
  // (the backward of RoPE).
  void rope(const Tensor& x, const Tensor& pos, const Tensor& inv_freq, bool inverse);
  // out = silu(gate) * up; all [R, I]
  void silu_mul(const Tensor& gate, const Tensor& up, const Tensor& out);
  void silu_mul_backward(const Tensor& dout, const Tensor& gate, const Tensor& up, const Tensor& dgate,
                         const Tensor& dup);
  // out = gelu_tanh(gate) * up (the GeGLU of Gemma's MLPs; gelu_pytorch_tanh(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g +
  // 0.044715 g^3)))); all [R, I], fp32 math (fp64 on cpu64), out may alias gate or up.
  void gelu_tanh_mul(const Tensor& gate, const Tensor& up, const Tensor& out);
  // x = cap * tanh(x / cap) in place (Gemma's final_logit_softcapping); x act, cap > 0.
  void softcap(const Tensor& x, float cap);
  // out[T, H] = table[ids[t], :]   (ids I32, checked to be in [0, V))
  void embedding(const Tensor& table, const Tensor& ids, const Tensor& out);
  // y += alpha * x  (same shape and dtype)
  void add(const Tensor& y, const Tensor& x, float alpha = 1.f);
  // dst[r, col0 : col0 + C] = src[r, :] for dst [R, Ctot], src [R, C]  (and the reverse with to_src)
  void copy_columns(const Tensor& dst, const Tensor& src, int64_t col0);
  void gather_columns(const Tensor& dst, const Tensor& src, int64_t col0);  // dst[r,:] = src[r, col0:]
  // dst[r, :] = src[rows[r], :]
  void gather_rows(const Tensor& dst, const Tensor& src, const Tensor& rows);
  // Row argmax of x [R, V] -> out [R] I32 (first index on ties).
  void argmax(const Tensor& x, const Tensor& out);
  // x[rows[r], :] *= scale[r] in place: x [R, D] act dtype, rows [Rs] I32 strictly ascending in [0, R), scale [Rs]
  // param dtype (F32; F64 on cpu64); each product computed in fp32 (fp64 on cpu64) and rounded once to x's dtype.
  // Rows not listed are untouched. Bad rows: Error naming scale_rows and the row (CUDA: reported at the next
  // synchronising call). The loss head scales its gradient rows by D-PACE's weights with it (model/draft_loss.h).
  void scale_rows(const Tensor& x, const Tensor& rows, const Tensor& scale);

  // ---- attention -----------------------------------------------------------------------------------------
  // Causal GQA attention for the target: q [T, nh, d] at positions q_offset + t; k, v [Tk, nkv, d] at
  // positions 0..Tk-1 (a prefix, e.g. a KV cache); query t sees keys 0..q_offset+t (within opts.window, with
  // opts.sinks: CausalAttnOpts). out [T, nh, d].
  void attention_causal(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        int64_t q_offset, float scale, const CausalAttnOpts& opts = {});
  // The same for a batch of sequences stacked along T (the target's forward over several sequences): for each s
  // of seqs, rows [s.begin, s.end) of q and out attend to s.k / s.v as attention_causal(q rows, s.k, s.v, out rows,
  // s.q_offset, scale, opts). Rows outside every sequence are untouched. One op (profiled once as
  // "attention_causal"): the CPU runs the sequences one after the other; CUDA launches once for the whole batch (up
  // to 32 sequences per launch).
  void attention_causal_batch(const Tensor& q, const Tensor& out, std::span<const CausalSeq> seqs, float scale,
                              const CausalAttnOpts& opts = {});
  // DFlash block attention, forward: out [N*B, nh, d] act, lse [N*B, nh] F32 (log-sum-exp of the scaled
  // scores per row; -inf for rows that see nothing).
  void dflash_attention(const DFlashAttnArgs& a, const Tensor& out, const Tensor& lse);
  // Backward: writes dq, dk_ctx, dv_ctx, dk_blk, dv_blk (act, shapes of the inputs).
  void dflash_attention_backward(const DFlashAttnArgs& a, const Tensor& out, const Tensor& lse,
                                 const Tensor& dout, const Tensor& dq, const Tensor& dk_ctx,
                                 const Tensor& dv_ctx, const Tensor& dk_blk, const Tensor& dv_blk);

  // ---- Mixture of Experts (the target's MoE layers: model/target/mlp.h) ------------------------------------
  // Router: logits [T, E] act -> per token the k experts of largest logit, in descending order, ties to the lower
  // expert index (softmax is monotonic: these are transformers' torch.topk(softmax(logits)) choices, case C21):
  // idx [T, k] I32; weights [T, k] param dtype (F32; F64 on cpu64): p = softmax(logits) in fp32 over all E, w_j = p[idx_j], divided by
  // sum_j p[idx_j] when normalize (Qwen3MoeTopKRouter's norm_topk_prob).
  // opts.score Sigmoid (MiniMaxM2TopKRouter, DeepseekV3MoE): p = sigmoid(logits) in fp32 per expert; the k experts of
  // largest c = p + opts.choice_bias (the bias only chooses; ties to the lower index) among those of the kept groups
  // (MoeRouteOpts::n_group / topk_group), in descending order of c; w_j = p[idx_j], divided by sum_j p[idx_j] + 1e-20
  // when normalize (DeepseekV3MoE's guard; it leaves any sum above 1e-12 unchanged in fp32), times opts.scale.
  void moe_route(const Tensor& logits, int64_t k, bool normalize, const Tensor& idx, const Tensor& weights,
                 const MoeRouteOpts& opts = {});
  // The (token, slot) pairs of idx [T, k] (I32) grouped by expert, each expert's in token order: offsets [E + 1] I32
  // (expert e's pairs are the grouped rows offsets[e] .. offsets[e + 1] - 1; offsets[E] = T k), rows [T k] I32 (the
  // token of each grouped row), slot [T k] I32 (the grouped row of pair (t, j), at t k + j). An expert id outside
  // [0, E) throws (CUDA: the pair is dropped and the error reported at the next synchronising call).
  void moe_group(const Tensor& idx, const Tensor& offsets, const Tensor& rows, const Tensor& slot);
  // Grouped expert GEMM, one call per projection for all experts: for expert e and every grouped row r in
  // [offsets[e], offsets[e + 1]) (offsets [E + 1] I32 on the device), a = x[rows[r]] when rows is given (a gather of
  // x's rows; x [*, K]) or x[r] (x [R, K]), act dtype, W = w.w[e] (dequantised when w.scales is defined, MXFP4 or
  // INT4: MoeWeights; the CPU exactly in its compute dtype, CUDA to bf16 on chip, each INT4 weight (c - 8) * scale
  // rounded to bf16 as compressed-tensors' decompression into the bf16 scale dtype and vLLM's Marlin kernels do),
  // b = w.bias[e] or 0, and
  //   act None:      y[r] = a W^T + b                          W [N, K],   y [R, N]
  //   act SwiGLU:    y[r] = silu(g) * u                        W [2N, K]:  g = a W[0:N]^T + b[0:N], u = a W[N:2N]^T + b[N:2N]
  //   act ClampedSwiGLU: y[r] = (clamp(u, -7, 7) + 1) * min(g, 7) * sigmoid(1.702 min(g, 7)), g, u as SwiGLU
  // with fp32 accumulation; R = offsets[E] = y's rows. Reads no count back to the host.
  void moe_linear(const Tensor& x, const Tensor* rows, const MoeWeights& w, const Tensor& offsets,
                  const Tensor& y, MoeAct act);
  // Weighted combine: out[t] = sum_j weights[t, j] y[slot[t k + j]] + beta out[t], summed in fp32 in slot order
  // and rounded once; y [T k, H] act, slot [T k] I32, weights [T, k] param dtype, out [T, H] act.
  void moe_combine(const Tensor& y, const Tensor& slot, const Tensor& weights, const Tensor& out,
                   float beta);

  // ---- hybrid linear-attention targets (Qwen3-Next, Qwen3.5: model/target/linear_attention.h) ---------------
  // RMSNorm of the hybrid models, forward only: y = x / sqrt(mean(x^2) + eps) * (zero_centred ? 1 + w : w), times
  // silu(z) when z is given (the gated norm of the linear attention's output, Qwen3NextRMSNormGated: norm before
  // gate); fp32 math, rounded once. x, y, z [R, D] act; w [D] act. y may alias x. (zero_centred: Qwen3NextRMSNorm,
  // whose weights are stored as w with the norm scaling by 1 + w.)
  void rmsnorm_gated(const Tensor& x, const Tensor& w, const Tensor* z, float eps, bool zero_centred,
                     const Tensor& y);
  // y *= sigmoid(gate), in place; y [R, D] act, gate [R, D] act or [R, 1] (one gate per row). The output gate of
  // gated attention, and the shared expert's gate.
  void sigmoid_gate(const Tensor& y, const Tensor& gate);
  // Depthwise causal convolution with SiLU over one sequence (transformers' causal_conv1d_fn / _update):
  //   y[t, c] = silu(sum_{j < K} w[c, j] xin[t + j, c]),   xin = [state ; x]   ([K - 1 + T, C])
  // x, y [T, C] act (y must not alias x); w [C, K] act (Conv1d.weight [C, 1, K]); state [K - 1, C] act: the K - 1
  // inputs before x, replaced by the last K - 1 rows of xin (the window the next call continues from); undefined:
  // zeros (a sequence's start), nothing kept. seqs (optional, as GatedDeltaArgs::seqs): the T rows are several
  // independent sequences, rows [seqs[i], seqs[i+1]) (seqs[0] = 0, ascending, seqs.back() = T), each from a zero
  // window (state must be undefined): a packed prefill in one call (CUDA: one launch for all of them).
  void conv1d_causal(const Tensor& x, const Tensor& w, const Tensor& state, const Tensor& y,
                     std::span<const int64_t> seqs = {});
  // The Gated DeltaNet's per-head gates, fp32: beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias) (softplus
  // as torch: x above 20 passes through). ba [T, 2 nv] act: b in columns 0..nv-1, a in nv..2nv-1; A_log, dt_bias [nv]
  // act; g, beta [T, nv] param dtype.
  void gdn_gate(const Tensor& ba, const Tensor& A_log, const Tensor& dt_bias, const Tensor& g,
                const Tensor& beta);
  // The gated delta rule (GatedDeltaArgs) of one sequence: out [T, nv, dv] act = o_t. The CPU runs the recurrence
  // token by token (the reference); CUDA the chunked form (exact up to rounding).
  void gated_delta_rule(const GatedDeltaArgs& a, const Tensor& out);

  // ---- loss and optimizer --------------------------------------------------------------------------------
  LossStats lm_head_loss(const LossArgs& a);

  // ---- DFlash2 (model/drafter.h) ---------------------------------------------------------------------------
  // The grouped dynamic convolution (DynConvArgs): y [R, C] act (must not alias u); res [R, C] act or null.
  void dynamic_conv(const DynConvArgs& a, const Tensor& y, const Tensor* res);
  // Its backward for dy [R, C]: du [R, C] act written; d_delta [R, 2 T G] act: side a.side's T G columns written,
  // the other side's untouched; d_base [2, T, C] param dtype: side a.side accumulated.
  void dynamic_conv_backward(const DynConvArgs& a, const Tensor& dy, const Tensor& du, const Tensor& d_delta,
                             const Tensor& d_base);
  // The candidate selector (SelectorArgs): scores [M, K] param dtype = e; statistics when a.labels is defined; gradients
  // when a.dg is defined. Synchronises when it returns statistics.
  SelectorStats candidate_selector(const SelectorArgs& a, const Tensor& scores);
  // AdamW (Loshchilov & Hutter; torch.optim.AdamW semantics): g = grad * grad_scale;
  // p -= lr*wd*p; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; p -= lr * (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps).
  // param, grad, m, v F32 [n]; param_compute (act dtype) receives the updated weights when defined.
  void adamw(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
             const AdamWArgs& a, const Tensor& param_compute);
  // sum of squares of an F32 tensor, accumulated in double. Synchronises.
  double sum_squares(const Tensor& x);

  // ---- initialisation ------------------------------------------------------------------------------------
  // out[i] = std * N(0,1) (param dtype, on this context's device): the values of core/rng.h fill_normal(seed,
  // purpose, stream), i.e. value i is Box-Muller of Philox block i mod 2^16 of Rng(seed, purpose, stream, i / 2^16),
  // rounded to F32 (also in an F64 tensor). Independent of threads and devices up to the last ulp of log / cos in
  // double precision on the device. (Drafter init: 1e9 values in milliseconds on a GPU, seconds on the host.)
  void fill_normal(const Tensor& out, double std, uint64_t seed, RngPurpose purpose, uint64_t stream);

  // ---- profiling (backend/op_profile.h) ------------------------------------------------------------------
  // Time and FLOPs per op since the last reset, longest first; empty unless the context was made with
  // ContextOptions::profile_ops. Synchronises.
  std::vector<OpProfileRow> op_profile() {
    synchronize();
    flush_op_profile();
    return profile_.rows();
  }
  void reset_op_profile() {
    synchronize();
    flush_op_profile();
    profile_.clear();
  }

 protected:
  explicit Context(bool profile_ops) : profile_ops_(profile_ops) {}

  // ---- what a backend implements: the computation of each op above, its arguments checked by the public op
  // (backend/context_ops.cpp; the dims its checks computed passed on). Only the backend's own conditions are left to
  // it: its tensors on its device in the dtypes it computes in, its kernels' limits, and the data-dependent index
  // checks (the CPU on the host, CUDA on the device).
  virtual void linear_impl(const Tensor& x, const LinearWeight& w, const Tensor* bias, const Tensor& y, float beta,
                           const Tensor* c) = 0;
  virtual LinearWeight quantize_fp8_impl(const Tensor& w, int64_t block_n, int64_t block_k) = 0;
  virtual Tensor dequantize_fp8_impl(const LinearWeight& w) = 0;
  virtual void linear_dx_impl(const Tensor& dy, const Tensor& w, const Tensor& dx, float beta) = 0;
  virtual void linear_dw_impl(const Tensor& dy, const Tensor& x, const Tensor& dw, const Tensor* db) = 0;
  virtual void rmsnorm_impl(const Tensor& x, const Tensor& w, float eps, const Tensor& y, const Tensor& rstd,
                            const RopeArgs* rope) = 0;
  virtual void rmsnorm_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                                     const Tensor& dx, const Tensor& dw, float beta, const RopeArgs* rope) = 0;
  virtual void rope_impl(const Tensor& x, const Tensor& pos, const Tensor& inv_freq, bool inverse) = 0;
  virtual void silu_mul_impl(const Tensor& gate, const Tensor& up, const Tensor& out) = 0;
  virtual void silu_mul_backward_impl(const Tensor& dout, const Tensor& gate, const Tensor& up, const Tensor& dgate,
                                      const Tensor& dup) = 0;
  virtual void gelu_tanh_mul_impl(const Tensor& gate, const Tensor& up, const Tensor& out) = 0;
  virtual void softcap_impl(const Tensor& x, float cap) = 0;
  virtual void embedding_impl(const Tensor& table, const Tensor& ids, const Tensor& out) = 0;
  virtual void add_impl(const Tensor& y, const Tensor& x, float alpha) = 0;
  virtual void copy_columns_impl(const Tensor& dst, const Tensor& src, int64_t col0) = 0;
  virtual void gather_columns_impl(const Tensor& dst, const Tensor& src, int64_t col0) = 0;
  virtual void gather_rows_impl(const Tensor& dst, const Tensor& src, const Tensor& rows) = 0;
  virtual void argmax_impl(const Tensor& x, const Tensor& out) = 0;
  virtual void scale_rows_impl(const Tensor& x, const Tensor& rows, const Tensor& scale) = 0;
  virtual void attention_causal_impl(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                     int64_t q_offset, float scale, const CausalAttnOpts& opts) = 0;
  // The default: attention_causal_impl per sequence (seqs checked, empty ones included).
  virtual void attention_causal_batch_impl(const Tensor& q, const Tensor& out, std::span<const CausalSeq> seqs,
                                           float scale, const CausalAttnOpts& opts);
  virtual void dflash_attention_impl(const DFlashAttnArgs& a, const Tensor& out, const Tensor& lse) = 0;
  virtual void dflash_attention_backward_impl(const DFlashAttnArgs& a, const Tensor& out, const Tensor& lse,
                                              const Tensor& dout, const Tensor& dq, const Tensor& dk_ctx,
                                              const Tensor& dv_ctx, const Tensor& dk_blk, const Tensor& dv_blk) = 0;
  virtual void moe_route_impl(const Tensor& logits, int64_t k, bool normalize, const Tensor& idx,
                              const Tensor& weights, const MoeRouteOpts& opts) = 0;
  virtual void moe_group_impl(const Tensor& idx, const Tensor& offsets, const Tensor& rows, const Tensor& slot) = 0;
  virtual void moe_linear_impl(const Tensor& x, const Tensor* rows, const MoeWeights& w, const Tensor& offsets,
                               const Tensor& y, MoeAct act, const MoeLinearDims& d) = 0;
  virtual void moe_combine_impl(const Tensor& y, const Tensor& slot, const Tensor& weights, const Tensor& out,
                                float beta) = 0;
  virtual void rmsnorm_gated_impl(const Tensor& x, const Tensor& w, const Tensor* z, float eps, bool zero_centred,
                                  const Tensor& y, const RowsDims& d) = 0;
  virtual void sigmoid_gate_impl(const Tensor& y, const Tensor& gate, const RowsDims& d) = 0;
  virtual void conv1d_causal_impl(const Tensor& x, const Tensor& w, const Tensor& state, const Tensor& y,
                                  const Conv1dDims& d) = 0;
  virtual void gdn_gate_impl(const Tensor& ba, const Tensor& A_log, const Tensor& dt_bias, const Tensor& g,
                             const Tensor& beta, int64_t T) = 0;
  virtual void gated_delta_rule_impl(const GatedDeltaArgs& a, const Tensor& out, int64_t T) = 0;
  virtual LossStats lm_head_loss_impl(const LossArgs& a) = 0;
  virtual void dynamic_conv_impl(const DynConvArgs& a, const Tensor& y, const Tensor* res, const DynConvDims& d) = 0;
  virtual void dynamic_conv_backward_impl(const DynConvArgs& a, const Tensor& dy, const Tensor& du,
                                          const Tensor& d_delta, const Tensor& d_base, const DynConvDims& d) = 0;
  virtual SelectorStats candidate_selector_impl(const SelectorArgs& a, const Tensor& scores,
                                                const SelectorDims& d) = 0;
  virtual void adamw_impl(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                          const AdamWArgs& a, const Tensor& param_compute) = 0;
  virtual double sum_squares_impl(const Tensor& x) = 0;
  virtual void fill_normal_impl(const Tensor& out, double std, uint64_t seed, RngPurpose purpose,
                                uint64_t stream) = 0;

  // ---- the profiling scope (backend/op_profile.h) -----------------------------------------------------------
  // Every op opens one around its _impl (and CUDA's copies and zero their own): op_begin(timed) on entry (CUDA makes
  // its device current), and when profiling op_end(key, flop) on exit, which adds the op's time under key. Scopes
  // nest (an op may copy host indices to the device first); op_end closes the innermost open one.
  class OpScope {
   public:
    OpScope(Context* c, bool timed, std::string key, double flop)
        : c_(c), timed_(timed), key_(std::move(key)), flop_(flop) {
      c_->op_begin(timed_);
    }
    OpScope(const OpScope&) = delete;
    OpScope& operator=(const OpScope&) = delete;
    ~OpScope() {
      if (timed_) c_->op_end(std::move(key_), flop_);
    }

   private:
    Context* c_;
    bool timed_;
    std::string key_;
    double flop_;
  };
  bool profiling() const { return profile_ops_; }
  // Keyed by the name; op_gemm by "name MxNxK" with 2 M N K flop (y[M, N] = x[M, K] w[N, K]^T); op_rows by "name RxD".
  OpScope op(const char* name, double flop = 0) {
    return profile_ops_ ? OpScope(this, true, name, flop) : OpScope(this, false, {}, 0);
  }
  OpScope op_gemm(const char* name, int64_t M, int64_t N, int64_t K) {
    return profile_ops_ ? OpScope(this, true, gemm_key(name, M, N, K), 2.0 * double(M) * double(N) * double(K))
                        : OpScope(this, false, {}, 0);
  }
  OpScope op_rows(const char* name, int64_t R, int64_t D) {
    return profile_ops_ ? OpScope(this, true, rows_key(name, R, D), 0) : OpScope(this, false, {}, 0);
  }
  // The backend's clock: the CPU reads the wall time (its ops are synchronous); CUDA records events on its stream.
  virtual void op_begin(bool timed) = 0;
  virtual void op_end(std::string key, double flop) = 0;
  virtual void flush_op_profile() {}  // moves timings still pending on the device into profile_
  OpProfile profile_;

 private:
  bool profile_ops_;
};

struct ContextOptions {
  int threads = 0;        // CPU: worker threads for elementwise ops (0 = hardware concurrency)
  int device_index = 0;   // CUDA device ordinal
  int64_t memory_limit_bytes = 0;  // 0 = no limit beyond the device
  bool profile_ops = false;        // time every op (Context::op_profile); off: nothing is recorded
};

// Lazy initialisations in this process: every Context creation, every first-use set-up of a backend (OpenBLAS
// threading, kernel attributes) and every event or handle made on demand adds one. The trainer creates everything
// in a single-threaded warm-up and asserts that the count does not move while its worker threads run (case C01).
// `what` is kept for the error message (the last one noted).
int64_t lazy_init_count();
std::string last_lazy_init();
void note_lazy_init(const char* what);

// Creates a Context for "cpu", "cpu64" (everything in fp64: the gradient-check oracle) or "cuda[:N]". Throws Error if the device is unknown or CUDA was not built in.
std::unique_ptr<Context> make_context(const std::string& device, const ContextOptions& opts = {});

// RoPE inverse frequencies (F32 host tensor [d/2]) for rope_theta and rope scaling (spec 1: "Standard
// Qwen/Llama rotate-half RoPE with the config's rope_theta (and rope_scaling for Llama-3.x)"), following
// transformers' _compute_default_rope_parameters / _compute_llama3_parameters / _compute_yarn_parameters (YaRN's
// attention factor is not in the frequencies: RopeScaling::attention_scaling, folded into the softmax scale).
struct RopeScaling;
Tensor rope_inv_freq(int64_t head_dim, double theta, const RopeScaling& scaling);
// transformers' "proportional" RoPE (_compute_proportional_rope_parameters; Gemma 4's full-attention layers): F32 host
// [head_dim / 2], entry i = 1 / theta^(2i / head_dim) in float32 for i < rotated / 2, 0 after (those pairs do not turn).
Tensor rope_inv_freq_proportional(int64_t head_dim, int64_t rotated, double theta);

}  // namespace dflash
