// model/draft_loss.h — the drafter's loss head (spec 2.4): the per-row loss weights, the fused lm_head + loss, and
// the gradient of the final-normed hidden states, for the two objectives of `train --loss`:
//   decay: the paper's w = m exp(-(i-1)/gamma), fixed, known before the step (model/draft_batch.h);
//   dpace (the default, bench/RESULTS.md "The training objectives"): D-PACE (arXiv 2605.18810): w from the drafter's
//          own per-slot confidences, known only after the forward.
// Both are divided by a normaliser planned on the host before the step (train/step_plan.h): sum of w for decay,
// the count of supervised slots (sum of m) for dpace, which does not depend on the weights.
// defines: LossKind, loss_kind_name, parse_loss_kind, kDefaultDPaceAlpha, check_dpace_alpha, dpace_weights,
//          LossHeadOut, loss_head
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "backend/context.h"

namespace dflash {

enum class LossKind {
  Decay,  // spec 2.4's decayed cross-entropy (+ the KL term): fixed weights exp(-(i-1)/gamma)
  DPace,  // D-PACE weights (+ the KL term, weighted alike)
};
const char* loss_kind_name(LossKind k);  // "decay", "dpace"
// "decay" or "dpace"; anything else: Error naming `field` and the accepted values.
LossKind parse_loss_kind(const std::string& s, const char* field);

// D-PACE's smoothing constant alpha: the default of the paper and of the trainers that ship it (speculators
// --dpace-alpha, NVIDIA Model-Optimizer dflash_dpace_alpha, SpecForge dpace_alpha: all 0.5).
inline constexpr double kDefaultDPaceAlpha = 0.5;
// alpha must lie in (0, 1] (speculators and Model-Optimizer reject 0: every prefix product collapses to 0 after
// the first slot); else Error naming `field` and the value.
void check_dpace_alpha(double alpha, const char* field);

// D-PACE per-row weights (docs/spec.md 2.4; arXiv 2605.18810 Eq. 7-9; the formula as speculators
// src/speculators/losses/utils.py dpace_loss_decay, commit c05b95b, implements it):
//   q_r = exp(-ce_r)                      the drafter's probability of the label (its confidence), detached
//   s_r = (1 - alpha) q_r + alpha         smoothed (Eq. 7), in [alpha, 1]
//   P_r = prod s over the selected rows of r's block at slots <= slot(r)      (prefix acceptance, Eq. 8)
//   w_r = sum P over the selected rows of r's block at slots >= slot(r)       (suffix sum, Eq. 8)
// Slots that are not selected (m = 0: slot 0, past the sequence end, unsupervised, padding blocks) multiply the
// prefix product by 1 and add nothing to the sum, as speculators does with its loss mask.
// rows [Rs] I32 strictly ascending (row = j B + i: block j, slot i), ce [Rs] the rows' cross-entropies (nats,
// finite), block_size B > 0, alpha in (0, 1]. Returns w [Rs] in float64. Errors name the argument.
std::vector<double> dpace_weights(std::span<const int32_t> rows, std::span<const double> ce, int64_t block_size,
                                  double alpha);

// What the loss head of one sequence gives back.
struct LossHeadOut {
  std::vector<double> w;           // [Rs] the weight each selected row's loss used (fixed or D-PACE)
  LossStats stats;                 // [Rs] per-row ce, kl (0 without soft labels), correct
  double ce_sum = 0, kl_sum = 0;   // sum w ce, sum w kl (not normalised)
};

// The loss head: contribution of row r = w_r (ce_r + kl_weight kl_r) grad_scale, and its gradient into a.dh (when
// defined; rows not selected stay untouched, so zero dh beforehand), for LossArgs `a` as Context::lm_head_loss
// takes it, with a.grad_scale = 1 / the global normaliser.
//   dpace_alpha == 0 (decay): a.weights are w; one lm_head_loss call.
//   dpace_alpha > 0 (D-PACE): a.weights must be the mask m (1.0 per selected row; else Error). lm_head_loss runs with
//     those unit weights and grad scale 1, the weights come from its ce (dpace_weights with block_size), and
//     ctx.scale_rows(a.dh, a.rows, w grad_scale) scales each row's gradient: the same dh as one call with the
//     weights w (the weights are detached, Eq. 9), with one more rounding of dh in a bf16 compute dtype.
// Synchronises (the per-row statistics come to the host).
LossHeadOut loss_head(Context& ctx, const LossArgs& a, double dpace_alpha, int64_t block_size);

}  // namespace dflash
