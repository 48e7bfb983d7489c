// model/target/linear_attention.h — Gated DeltaNet linear attention (transformers' Qwen3NextGatedDeltaNet /
// Qwen3_5GatedDeltaNet, forward only: the target is frozen), one token-mixer kind of the hybrid targets (its
// descriptor: model/target/linear_attention.cpp, in the table of model/target/mixer.h), and its weights; its recurrent
// state lives in the target's cache (model/target/cache.h), with the rollback that speculative decoding needs.
// defines: LinearAttnWeights
//
// Per layer, x = RMSNorm_in(h) [R, H] (R rows: one or several sequences, SeqSegment of model/target/mixer.h):
//   qkv = x Wqkv^T  [R, 2 nk dk + nv dv]     z = x Wz^T  [R, nv dv]     ba = x Wba^T  [R, 2 nv]  (b, then a)
//   qkv = silu(conv_K(qkv))                  depthwise causal, per sequence, continuing the cache's window
//   beta = sigmoid(b),  g = -exp(A_log) softplus(a + dt_bias)
//   o = gated_delta_rule(q, k, v, g, beta)   per sequence, from the cache's state (backend/context.h GatedDeltaArgs:
//                                            l2-normed q and k, value heads grouped over key heads)
//   o = RMSNorm(o) w_norm silu(z)            per value head (dv wide), the gated norm (its weight is NOT zero-centred)
//   h += o Wout^T
// Shapes from cfg.linear_attn (io/hf_config.h LinearAttnConfig): nk, nv heads of dk, dv; kernel K; C = 2 nk dk + nv dv.
// Checkpoint layouts (names under layer + "{l}." + names.linear_attn): Qwen3.5 stores in_proj_qkv [2 nk dk + nv dv, H],
// in_proj_z [nv dv, H], in_proj_b, in_proj_a [nv, H]; Qwen3-Next stores in_proj_qkvz [nk (2 dk + 2 r dv), H] grouped
// by key head g as [q_g (dk), k_g (dk), v_g (r dv), z_g (r dv)] and in_proj_ba [nk 2 r, H] as [b_g (r), a_g (r)]
// (r = nv / nk; transformers' fix_query_key_value_ordering): these are permuted into the Qwen3.5 layout when loaded
// (io/model_family_hybrid.h split_grouped_qkvz), so one forward serves both. Both: conv1d.weight [C, 1, K], A_log,
// dt_bias [nv], norm.weight [dv], out_proj.weight [H, nv dv]. Loaded in the order [in_proj_qkvz | in_proj_qkv,
// in_proj_z], [in_proj_ba | in_proj_b, in_proj_a], conv1d, A_log, dt_bias, norm, out_proj (a random target draws
// in it).
//
// Cache and rollback. A sequence's cache (LayerCache of model/target/cache.h) holds, per linear layer, the
// convolution's window (conv: the K - 1 inputs before the next position) and the recurrent state [nv, dk, dv] after
// the last position: constant in the sequence length. Speculative decoding verifies B tokens in one forward and then
// keeps only the first k + 1; serving engines either keep the state after every verified position (SGLang's mamba
// "extra_buffer": B states per layer, written by the verify kernel) or re-derive it. Here (as z-lab's MLX
// implementation does) the verify forward records what the recurrence started from (window and state, one copy each)
// and its inputs (the conv inputs and the delta rule's q/k/v, g, beta of the B rows: views of buffers the forward made
// anyway); rolling back to k + 1 tokens replays only the convolution and the recurrence over those k + 1 rows from the
// recorded start — no projection, no other layer. Cost per verify and linear layer: one state copy (nv dk dv
// param-dtype values: 2 MiB at Qwen3.5-9B shapes) and, on a rejection, a (k + 1)-token recurrence; B states per layer
// (32 MiB at B = 16) are never stored.
#pragma once
#include "backend/context.h"  // Tensor

namespace dflash {

// In the compute dtype.
struct LinearAttnWeights {
  LinearWeight w_qkv;       // [2 nk dk + nv dv, H]; plain or FP8 (w_z, w_out likewise)
  LinearWeight w_z;         // [nv dv, H]
  Tensor w_ba;              // [2 nv, H]: b rows, then a rows
  Tensor conv;              // [C, K], C = 2 nk dk + nv dv
  Tensor A_log, dt_bias;    // [nv]
  Tensor norm;              // [dv]
  LinearWeight w_out;       // [H, nv dv]
};

}  // namespace dflash
