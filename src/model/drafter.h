// model/drafter.h — the DFlash drafter (spec 1): fc + hidden_norm over the fused target features, Ld Qwen3-style
// layers whose queries come from the block tokens and whose keys/values come from [context ; block], a final
// norm and the target's frozen lm_head. DFlash2 (spec 1.1-1.2, `arch` dflash2) wraps every attention and MLP
// sublayer in grouped dynamic convolutions and drafts through a candidate selector: the top-k of the lm_head's logits
// per slot, pair scores with the previous slot's token, the greedy path. Forward and backward are written by hand
// over the Context ops.
// defines: DraftArch, draft_arch_name, parse_draft_arch, DrafterConfig, DraftInputs, DraftStepStats, Drafter
#pragma once
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "backend/context.h"
#include "io/hf_config.h"
#include "model/params.h"

namespace dflash {

// The drafter's default MLP width for a target: a dense target's intermediate_size (Qwen3-8B: 12288), and for a
// target with Mixture-of-Experts layers 3 H, as the published MoE drafters have it (Qwen3-Coder-30B-A3B-DFlash and
// SpecForge's qwen3.5-35b-a3b-dflash.json: 6144 at H 2048) — never an expert's width (768 / 512), which would make
// the dense drafter layer a quarter of a layer. A family may set its own (io/model_family.h DrafterDefaults): gpt-oss
// 8 H / 3, the 7680 of z-lab/gpt-oss-20b-DFlash and gpt-oss-120b-DFlash at H 2880.
int64_t default_intermediate_size(const ModelConfig& target);

// The drafter architecture (train --arch): DFlash (spec 1) or DFlash2 (spec 1.1-1.2: dynamic convolutions and the
// candidate selector).
enum class DraftArch { DFlash, DFlash2 };
const char* draft_arch_name(DraftArch a);  // "dflash", "dflash2"
// "dflash" or "dflash2"; anything else: Error naming `field` and the accepted values.
DraftArch parse_draft_arch(const std::string& s, const char* field);

struct DrafterConfig {
  DraftArch arch = DraftArch::DFlash;
  int64_t hidden_size = 0;        // H (== the target's)
  int64_t intermediate_size = 0;  // I
  int64_t num_layers = 1;         // Ld
  int64_t num_heads = 0;          // nh
  int64_t num_kv_heads = 0;       // nkv
  int64_t head_dim = 0;           // d
  int64_t vocab_size = 0;         // V (the target's lm_head rows)
  int64_t block_size = 16;        // B
  std::vector<int64_t> target_layer_ids;  // nf entries
  int64_t num_target_layers = 0;  // Lt
  int32_t mask_token_id = -1;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  int64_t max_position_embeddings = 0;
  // Sliding-window draft layers (spec 2.3; Hugging Face's layer_types / sliding_window): layer l is
  // "sliding_attention" or "full_attention"; empty = every layer full. sliding_window W (tokens, > 0 when a layer
  // slides): slot i of a block sees the context keys [a_j + i - (W-1), a_j) and the block keys 0..i.
  std::vector<std::string> layer_types;
  int64_t sliding_window = 0;
  // DFlash2 (arch DFlash2; dflash_config keys of the published z-lab/Qwen3.8-27B-DFlash2, whose values are the
  // defaults): the convolutions' taps and channels per dynamic coefficient, the selector's codebook rank and
  // candidates per slot. conv_group_size must divide H; 1 <= selector_top_k <= V; 1 <= conv_kernel_size <= B.
  int64_t conv_kernel_size = 2;
  int64_t conv_group_size = 16;
  int64_t selector_rank = 256;
  int64_t selector_top_k = 16;
  // The target's embedding scale (ModelConfig::embed_scale; Gemma: sqrt(H)): the block tokens' embedding is multiplied
  // by it, as the target's own embedding module does (transformers' Gemma4TextScaledWordEmbedding). 0 = none.
  double embed_scale = 0;

  int64_t nf() const { return static_cast<int64_t>(target_layer_ids.size()); }
  bool dflash2() const { return arch == DraftArch::DFlash2; }
  // DFlash2: the dynamic coefficients per token and convolution, 2 sides x taps x groups (kernel_projection's rows).
  int64_t conv_coefficients() const { return 2 * conv_kernel_size * (hidden_size / conv_group_size); }
  // The attention window of layer l: sliding_window for a "sliding_attention" layer, 0 (full attention) otherwise.
  int window_of(int64_t l) const;
  // Whether any layer_types entry is "sliding_attention".
  bool any_sliding() const;
  // The attention's softmax scale: 1 / sqrt(d), times the square of YaRN's attention factor when rope_scaling is
  // yarn (transformers' Qwen3RotaryEmbedding scales cos and sin, i.e. q and k, by it: RopeScaling::attention_scaling).
  float softmax_scale() const;
  // Checks internal consistency (and against the target if given); Error names the field. target_layer_ids must
  // follow validate_target_layer_ids (io/hf_config.h: distinct, ascending, in [0, num_target_layers)).
  void validate() const;
  // A drafter shaped like the target's layers (H, heads, d, rope, eps from the target), spec 1 defaults. Its MLP
  // width (default_intermediate_size) is the family's choice when it has one (gpt-oss: 8 H / 3, the published 7680),
  // else the target's dense width, or 3 H for a target with MoE layers. A family may also set the heads
  // (io/model_family.h DrafterDefaults): for a hybrid linear-attention target (Qwen3-Next, Qwen3.5) they are the
  // published drafters', 32 of 128, kv 8 (dense) or 4 (MoE); the rope stays full-width with the target's theta (no
  // partial rotary in the drafter).
  static DrafterConfig for_target(const ModelConfig& target, int64_t num_layers, int64_t block_size,
                                  std::vector<int64_t> layer_ids, int32_t mask_token_id);
};
// The layer_types of a drafter from the user's choice (train --layer-types / --sliding-window): `given` names one
// type per layer ("full_attention" / "sliding_attention", or "full" / "sliding"); empty = every layer
// sliding_attention when sliding_window > 0, else every layer full (returned empty). Error when the count differs
// from num_layers, a name is unknown, or a sliding layer has no window.
std::vector<std::string> resolve_layer_types(const std::vector<std::string>& given, int64_t num_layers,
                                             int64_t sliding_window);
void to_json(nlohmann::json& j, const DrafterConfig& c);
void from_json(const nlohmann::json& j, DrafterConfig& c);

// One sequence's drafter inputs, on the drafter's device (built from a DraftBatch by model/draft_batch.h).
struct DraftInputs {
  int64_t S = 0, N = 0;
  Tensor features;    // [S, nf*H] act: the fused target features F of spec 1
  Tensor ctx_pos;     // [S] I32: 0..S-1 (positions of the context keys)
  Tensor block_ids;   // [N*B] I32: x[a_j] then MASK x (B-1)
  Tensor block_pos;   // [N*B] I32: a_j + i
  Tensor anchors;     // [N] I32 sorted
  Tensor valid;       // [N] U8
  Tensor rows;        // [Rs] I32 rows of the N*B block tokens that carry loss (w > 0)
  Tensor labels;      // [Rs] I32 y = x[a_j + i]
  Tensor weights;     // [Rs] F32 w = m * exp(-(i-1)/gamma); with D-PACE the mask m (1)
  Tensor teacher_h;   // [Rs, H] act: target final hidden at a_j+i-1 (soft labels), or undefined
  Tensor prev;        // [Rs] I32 x[a_j + i - 1]: DFlash2's teacher-forced predecessor of each label
  double dpace_alpha = 0;  // > 0: the loss weights are D-PACE's with this alpha, computed after the forward from the
                           // rows' cross-entropies (model/draft_loss.h); 0: `weights` as given
};

struct DraftStepStats {
  double loss_sum = 0;  // sum_rows w * (ce + kl_weight * kl + selector_alpha * sel) (not normalised)
  double ce_sum = 0, kl_sum = 0;   // sum_rows w * ce, sum_rows w * kl
  double sel_sum = 0;              // DFlash2: sum_rows w * sel (the selector's cross-entropy among the candidates)
  std::vector<double> ce, kl;      // per selected row
  std::vector<double> w;           // per selected row: the loss weight used (D-PACE's, or the batch's)
  // per selected row: the drafted token equals the label (DFlash: argmax of the logits; DFlash2: the selector's
  // choice after the label's predecessor, teacher-forced)
  std::vector<uint8_t> correct;
  std::vector<uint8_t> covered;    // DFlash2, per selected row: the label is among the top-k candidates
};

// One drafter parameter as the constructor makes it: its export name, shape and how it starts (Normal: N(0,
// init_std); Ones: RMSNorm weights; Zeros; ConvIdentity: DFlash2's base kernel, tap 0 = 1 on both sides).
enum class ParamInit { Normal, Ones, Zeros, ConvIdentity };
struct DrafterParamSpec {
  std::string name;
  Shape shape;
  ParamInit init;
};
// Every parameter of a drafter of config c, in the order the Drafter adds them (parameter k draws its values from
// fill_normal(seed, Init, k)): the one list behind the constructor and the memory plan (train/memory_plan.h).
std::vector<DrafterParamSpec> drafter_param_specs(const DrafterConfig& c);

class Drafter {
 public:
  // Random init (spec 1): Linear ~ N(0, init_std = 0.02), RMSNorm weights 1; values from fill_normal(seed, Init,
  // parameter index), generated on all host cores (a 1B-parameter drafter in seconds, not minutes).
  Drafter(Context& ctx, DrafterConfig cfg, uint64_t seed, double init_std = 0.02);
  const DrafterConfig& config() const { return cfg_; }
  ParamSet& params() { return params_; }
  const ParamSet& params() const { return params_; }

  // Forward + (optionally) backward of one sequence. Gradients are ACCUMULATED into params().grad; the loss is
  // scaled by grad_scale (1 / the global normaliser: sum of w, or with D-PACE the count of supervised slots). The
  // loss head and its weights: model/draft_loss.h. `embed` [V, H] and `lm_head` [V, H] are the target's frozen
  // weights in the compute dtype. With recompute, only each layer's input is kept and the layer's forward is
  // re-run during backward (case C06).
  // DFlash2: the selector's loss joins with weight selector_alpha (SpecForge's dflash2_selector_loss_alpha, 1):
  // L = [sum w ce + selector_alpha sum w [label among the candidates] sel] / normaliser.
  DraftStepStats forward_backward(Context& ctx, const DraftInputs& in, const Tensor& embed, const Tensor& lm_head,
                                  float kl_weight, float grad_scale, bool backward, bool recompute = false,
                                  float selector_alpha = 1.0f);

  // Forward only: the final-normed hidden states of all N*B block tokens [N*B, H] (for logits / evaluation).
  Tensor forward_hidden(Context& ctx, const DraftInputs& in, const Tensor& embed);

  // The inference path with a draft KV cache (spec 4): the context K/V of every committed position, per layer.
  struct Cache {
    std::vector<Tensor> k, v;  // per layer [capacity, nkv, d]
    int64_t len = 0, capacity = 0;
  };
  Cache make_cache(Context& ctx, int64_t capacity) const;
  // Appends target features [T, nf*H] of positions cache.len .. cache.len+T-1 to the cache.
  void extend_cache(Context& ctx, Cache& cache, const Tensor& features) const;
  // Drafts one block anchored at position p = cache.len (context = all cached positions < p): block ids
  // [bonus, MASK...]; returns the final-normed hidden [B, H] of the block tokens.
  Tensor draft_block(Context& ctx, const Cache& cache, int32_t bonus_token, const Tensor& embed) const;
  // DFlash2's draft tokens of block slots 1..n from their final-normed hidden [n, H] and the anchor's token (slot
  // 0): the selector's greedy path (spec 1.2): per slot the top-k candidates of the logits (ties to the lower id),
  // then from the anchor's token on the candidate of the highest pair score after the previous choice (first on
  // ties), as vLLM's dflash2 speculator walks it. `lm_head` [V, H] act. Error for a DFlash drafter.
  std::vector<int32_t> select_path(Context& ctx, const Tensor& hidden, int32_t anchor_token,
                                   const Tensor& lm_head) const;

 private:
  struct LayerParams;
  struct LayerActs;
  LayerParams layer(int64_t l) const;
  DynConvArgs conv_args(const Param& base, const Tensor& u, const Tensor& delta, int side) const;
  void layer_forward(Context& ctx, int64_t l, const DraftInputs& in, const Tensor& Ht, const Tensor& h_in,
                     LayerActs& a, const Tensor& h_out) const;
  void layer_backward(Context& ctx, int64_t l, const DraftInputs& in, const Tensor& Ht, const LayerActs& a,
                      const Tensor& dh, const Tensor& dHt);

  DrafterConfig cfg_;
  ParamSet params_;
  Tensor inv_freq_;  // [d/2] F32 on the device
};

}  // namespace dflash
