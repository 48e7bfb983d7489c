// model/draft_batch.h — anchors, block inputs, labels and loss weights of one training sequence (spec 2.1-2.4).
// defines: candidate_anchors, sample_anchors, default_gamma, DraftBatch, make_draft_batch, upload_draft_batch
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "core/rng.h"
#include "model/drafter.h"

namespace dflash {

// Spec 2.1.2: positions a with loss_mask[a] = 1, loss_mask[a+1] = 1 and a <= S-2, ascending.
std::vector<int32_t> candidate_anchors(std::span<const uint8_t> loss_mask);

// N = min(max_anchors, #candidates) candidates drawn without replacement (partial Fisher-Yates on `rng`),
// returned SORTED ascending. Empty when there is no candidate.
std::vector<int32_t> sample_anchors(std::span<const uint8_t> loss_mask, int64_t max_anchors, Rng& rng);

// Loss decay gamma of spec 2.4: 7 for B = 16, 5 for B = 10, 4 for B = 8; other block sizes take the nearest
// of those (B >= 13 -> 7, B >= 9 -> 5, else 4).
double default_gamma(int64_t block_size);

// Everything the drafter needs about one sequence besides the target features, on the host.
struct DraftBatch {
  int64_t S = 0, N = 0, B = 0;            // N includes padding blocks
  std::vector<int32_t> anchors;          // [N] sorted; padding blocks get anchor 0
  std::vector<uint8_t> valid;            // [N]
  std::vector<int32_t> block_ids;        // [N*B] x[a_j] at slot 0, mask_token_id elsewhere
  std::vector<int32_t> block_pos;        // [N*B] a_j + i
  // rows with m[j,i] = 1 (so weight > 0), ascending; their label, weight, slot and the teacher position
  std::vector<int32_t> rows, labels, slots, teacher_pos;
  std::vector<int32_t> prev;             // per row the token before its label, x[a_j + i - 1] (slot 1: the anchor's
                                         // token): DFlash2's teacher-forced predecessor
  std::vector<float> weights;
  double sum_w = 0;                       // sum of weights (this sequence's share of the global denominator)
  double dpace_alpha = 0;                 // > 0: D-PACE; weights hold m (1) and sum_w counts the rows
};

// Builds the batch of spec 2.2-2.4 for `anchors` (sorted, each a candidate), padded with invalid blocks up to
// n_blocks (>= anchors.size()). gamma <= 0 selects uniform weights. Slot i of block j predicts x[a_j + i];
// m = valid * [i > 0] * [a_j + i < S] * loss_mask[a_j + i]; w = m * exp(-(i-1)/gamma).
// dpace_alpha > 0 selects D-PACE (model/draft_loss.h; gamma is then unused): the weights are only known after the
// forward, so `weights` holds m (1 per row) and sum_w the number of rows, the normaliser D-PACE divides by.
DraftBatch make_draft_batch(std::span<const int32_t> tokens, std::span<const uint8_t> loss_mask,
                            std::span<const int32_t> anchors, int64_t n_blocks, int64_t block_size,
                            int32_t mask_token_id, double gamma, double dpace_alpha = 0);

// Uploads a DraftBatch and the sequence's target features to ctx's device. teacher_final_hidden [S, H] (the
// target's final-norm hidden states) is gathered at teacher_pos when defined (soft labels).
DraftInputs upload_draft_batch(Context& ctx, const DraftBatch& b, const Tensor& features,
                               const Tensor& teacher_final_hidden = Tensor{});

}  // namespace dflash
