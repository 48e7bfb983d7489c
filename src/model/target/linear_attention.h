// model/target/linear_attention.h — the hybrid targets' linear-attention token mixer, Gated DeltaNet (transformers'
// Qwen3NextGatedDeltaNet / Qwen3_5GatedDeltaNet, forward only: the target is frozen), and its recurrent state in
// the target's cache, with the rollback that speculative decoding needs.
// defines: LinearAttnWeights, LinearAttnState, load_linear_attention, linear_attention_forward,
//          linear_attention_params, make_linear_state, rollback_linear_state
//
// Per layer, x = RMSNorm_in(h) [R, H] (R rows: one or several sequences, AttnSegment of model/target/attention.h):
//   qkv = x Wqkv^T  [R, 2 nk dk + nv dv]     z = x Wz^T  [R, nv dv]     ba = x Wba^T  [R, 2 nv]  (b, then a)
//   qkv = silu(conv_K(qkv))                  depthwise causal, per sequence, continuing the cache's window
//   beta = sigmoid(b),  g = -exp(A_log) softplus(a + dt_bias)
//   o = gated_delta_rule(q, k, v, g, beta)   per sequence, from the cache's state (backend/context.h GatedDeltaArgs:
//                                            l2-normed q and k, value heads grouped over key heads)
//   o = RMSNorm(o) w_norm silu(z)            per value head (dv wide), the gated norm (its weight is NOT zero-centred)
//   h += o Wout^T
// Checkpoint layouts (names under layer + "{l}." + names.linear_attn): Qwen3.5 stores in_proj_qkv [2 nk dk + nv dv, H],
// in_proj_z [nv dv, H], in_proj_b, in_proj_a [nv, H]; Qwen3-Next stores in_proj_qkvz [nk (2 dk + 2 r dv), H] grouped
// by key head g as [q_g (dk), k_g (dk), v_g (r dv), z_g (r dv)] and in_proj_ba [nk 2 r, H] as [b_g (r), a_g (r)]
// (r = nv / nk; transformers' fix_query_key_value_ordering): these are permuted into the Qwen3.5 layout when loaded
// (io/model_family_hybrid.h split_grouped_qkvz), so one forward serves both. Both: conv1d.weight [C, 1, K], A_log,
// dt_bias [nv], norm.weight [dv], out_proj.weight [H, nv dv].
//
// Cache and rollback. A sequence's cache (KVCache::lin[l]) holds, per linear layer, the convolution's window (the K - 1
// inputs before the next position) and the recurrent state [nv, dk, dv] after the last position: constant in the
// sequence length. Speculative decoding verifies B tokens in one forward and then keeps only the first k + 1; serving
// engines either keep the state after every verified position (SGLang's mamba "extra_buffer": B states per layer,
// written by the verify kernel) or re-derive it. Here (as z-lab's MLX implementation does) the verify forward records
// what the recurrence started from (window and state, one copy each) and its inputs (the conv inputs and the delta
// rule's q/k/v, g, beta of the B rows: views of buffers the forward made anyway); rolling back to k + 1 tokens
// replays only the convolution and the recurrence over those k + 1 rows from the recorded start — no projection, no
// other layer. Cost per verify and linear layer: one state copy (nv dk dv param-dtype values: 2 MiB at Qwen3.5-9B
// shapes) and, on a rejection, a (k + 1)-token recurrence; B states per layer (32 MiB at B = 16) are never stored.
#pragma once
#include <span>
#include <string>

#include "backend/context.h"
#include "io/hf_config.h"
#include "model/target/weights.h"

namespace dflash {

struct AttnSegment;

struct LinearAttnWeights {
  LinearWeight w_qkv;       // [2 nk dk + nv dv, H]; plain or FP8 (w_z, w_out likewise)
  LinearWeight w_z;         // [nv dv, H]
  Tensor w_ba;              // [2 nv, H]: b rows, then a rows
  Tensor conv;              // [C, K], C = 2 nk dk + nv dv
  Tensor A_log, dt_bias;    // [nv]
  Tensor norm;              // [dv]
  LinearWeight w_out;       // [H, nv dv]
};

// One linear layer's part of a sequence's cache. Tensors on the context's device.
struct LinearAttnState {
  Tensor conv;   // [K - 1, C] act: the convolution inputs of the K - 1 positions before the cache's len (zeros at 0)
  Tensor state;  // [nv, dk, dv] param dtype: the recurrent state after position len - 1 (zeros at 0)
  // The last forward's record (kept when KVCache::keep_rollback): the cache's len before it (-1: none), the window and
  // state it started from, its convolution inputs [T, C] and the delta rule's inputs qkv [T, C], g, beta [T, nv].
  int64_t start = -1;
  Tensor conv0, state0, x_in, qkv, g, beta;
};

// The layer's weights under `prefix` ("model.layers.{l}."), names of `names` (either layout above). Order of the
// source's calls: [in_proj_qkvz | in_proj_qkv, in_proj_z], [in_proj_ba | in_proj_b, in_proj_a], conv1d, A_log,
// dt_bias, norm, out_proj. Errors name the tensor and the file.
LinearAttnWeights load_linear_attention(WeightSource& src, const std::string& prefix, const WeightNames& names,
                                        const ModelConfig& cfg);

// A fresh sequence's state of one linear layer: zero window and state.
LinearAttnState make_linear_state(Context& ctx, const ModelConfig& cfg);

// h [R, H] += GatedDeltaNet(x) for layer l; x [R, H] act (normed); segs partition the rows: a segment with a cache
// continues from (and advances) caches's lin[l], recording the rollback when the cache keeps it; one without starts
// from zeros.
void linear_attention_forward(Context& ctx, const LinearAttnWeights& w, const ModelConfig& cfg, int64_t l,
                              const Tensor& x, std::span<const AttnSegment> segs, const Tensor& h);

// Rolls s back to `keep` of the T tokens of its recorded forward (0 <= keep <= T): the window and state after its
// first `keep` rows, by replaying the convolution and the recurrence from the recorded start. Throws Error when
// nothing is recorded or keep > T.
void rollback_linear_state(Context& ctx, const LinearAttnConfig& cfg, LinearAttnState& s, int64_t keep);

// Parameters of one linear-attention layer.
int64_t linear_attention_params(const ModelConfig& cfg);

}  // namespace dflash
