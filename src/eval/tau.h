// eval/tau.h — the acceptance length tau of a DFlash drafter against its target (spec 4, greedy), measured two
// ways: by real speculative decoding (the generated loop) and offline by teacher forcing; plus a target-only
// greedy decode baseline with wall-clock throughput.
// defines: ResponseSpan, response_span, DraftModel, DFlashDraftModel, Cycle, ResponseTau, teacher_forced_tau,
//          generated_tau, target_greedy_decode, TauOptions, TauStats, TauReport, evaluate_tau
//
// Response layout. A sample is tokens x[0, S) with its loss mask. Its response is the LAST contiguous run of
// mask-1 positions, [P, E); everything before P (earlier assistant turns included) is the prompt. x[P] is the
// "bonus": the token the target produces from the prompt prefill. A sample with P == 0 (nothing to prefill) or
// E - P < 2 (nothing to draft) has no cycle and is skipped (counted).
//
// One cycle (spec 4) starts with the bonus at position p; the draft context is every position < p. The drafter
// drafts the block [bonus, MASK x (B-1)]; the draft tokens are the argmax of slots 1..c, where
//     c = min(B - 1, E - 2 - p)                                             (the stopping rule)
// (slots whose positions would pass E - 2 are not used). The target verifies [bonus, d_1..d_c] in one forward;
// k = the number of leading d_i equal to the target's argmax at position p + i - 1; the cycle commits d_1..d_k
// and the target's next token t_k (the new bonus, at p + k + 1 <= E - 1) and counts k + 1 tokens. Cycles run
// while p < E - 1, so the committed tokens never pass E - 1, and a response of length E - P takes cycles that
// commit E - P - 1 tokens in all (the first response token comes from the prefill and is not counted).
// tau of a response = mean over its cycles of (k + 1) = committed tokens / cycles = committed tokens per target
// (verify) forward; tau of a data set = mean over responses (spec 4); `pooled` = all committed / all cycles.
// Position E - 1 is never compared with a draft token: a data-preparation EOS appended after a length-capped
// generation therefore does not change tau.
//
// Teacher forcing (offline, no generation): one target forward over x[0, E) gives the features; the drafter's
// prediction at slot i of the block anchored at p is compared with x[p + i]. Generated loop (real speculative
// decoding): the target prefills x[0, P) into a KV cache, the bonus is its argmax, and the loop above runs with
// the target's own tokens; it stops after E - P response tokens (the rule above) or when it commits an EOS id
// (the EOS is the last committed token; that cycle counts the tokens up to and including it). On a response that
// IS the target's greedy continuation both give the same cycles and the same tau (spec 4, "offline exactness");
// with fp32 on the CPU they agree exactly (tested); in bf16 the different GEMM shapes of the two paths can flip an
// argmax at a near-tie.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "io/dataset.h"
#include "model/drafter.h"
#include "model/split_target.h"
#include "model/target.h"

namespace dflash {

struct ResponseSpan {
  int64_t P = 0, E = 0;  // response positions [P, E); P == E == 0 when the mask has no 1
  int64_t length() const { return E - P; }
};
// The last contiguous run of mask-1 positions.
ResponseSpan response_span(std::span<const uint8_t> loss_mask);

// The source of draft tokens for both loops: the DFlash drafter, or a test oracle.
class DraftModel {
 public:
  virtual ~DraftModel() = default;
  virtual int64_t block_size() const = 0;
  // Target layers whose features the draft model consumes (spec 1, target_layer_ids).
  virtual std::vector<int64_t> layer_ids() const = 0;

  // Generated loop. begin(): a new sequence with an empty context of at most `capacity` positions.
  virtual void begin(Context& ctx, int64_t capacity) = 0;
  // Appends the target features [T, nf*H] (act) of the next T committed positions to the context.
  virtual void append_context(Context& ctx, const Tensor& features) = 0;
  // Draft tokens for positions p+1 .. p+n (n <= B-1), p = the context length, given the bonus at p.
  virtual std::vector<int32_t> propose(Context& ctx, int32_t bonus, int64_t n) = 0;

  // Teacher forcing. begin_teacher(): the sample x[0, E) and the target features F [E, nf*H] of all its
  // positions; predictions will be asked for block anchors p in [P, E-2].
  virtual void begin_teacher(Context& ctx, std::span<const int32_t> tokens, const Tensor& features,
                             ResponseSpan r) = 0;
  // Draft tokens for positions p+1 .. p+n of the block anchored at p (bonus x[p], context positions < p).
  virtual std::vector<int32_t> propose_teacher(Context& ctx, int64_t p, int64_t n) = 0;
};

// The DFlash drafter (spec 4): a draft KV cache (Drafter::make_cache / extend_cache / draft_block) in the generated
// loop; in teacher forcing, one batched Drafter::forward_hidden per chunk of `anchors_per_forward` consecutive
// anchors (all positions of the response, chunk computed when first needed), logits only for the visited blocks.
// Logits are the target's lm_head on the drafter's final-normed hidden (target_logits). The drafter must outlive this
// object; the target's embedding and lm_head (TargetHead) live on the drafter's Context.
class DFlashDraftModel : public DraftModel {
 public:
  // head: the target's embedding and lm_head on the drafter's device (SplitTarget::head); target_cfg its config.
  // Throws Error when the drafter does not fit the target (hidden size, vocabulary, target layer ids).
  DFlashDraftModel(Drafter& drafter, const ModelConfig& target_cfg, TargetHead head,
                   int64_t anchors_per_forward = 256);
  // A whole target on the drafter's device: its own embedding and lm_head.
  DFlashDraftModel(Drafter& drafter, const Target& target, int64_t anchors_per_forward = 256);
  int64_t block_size() const override;
  std::vector<int64_t> layer_ids() const override;
  void begin(Context& ctx, int64_t capacity) override;
  void append_context(Context& ctx, const Tensor& features) override;
  std::vector<int32_t> propose(Context& ctx, int32_t bonus, int64_t n) override;
  void begin_teacher(Context& ctx, std::span<const int32_t> tokens, const Tensor& features, ResponseSpan r) override;
  std::vector<int32_t> propose_teacher(Context& ctx, int64_t p, int64_t n) override;

 private:
  // The draft tokens of block rows `hidden` [n, H] (slots 1..n) after the anchor's token: the argmax of the logits
  // (DFlash) or the candidate selector's path (DFlash2: Drafter::select_path).
  std::vector<int32_t> draft_tokens(Context& ctx, const Tensor& hidden, int32_t anchor) const;
  Drafter& drafter_;
  ModelConfig target_cfg_;
  TargetHead head_;
  int64_t anchors_per_forward_;
  Drafter::Cache cache_;
  // teacher state
  std::vector<int32_t> tokens_;
  std::vector<uint8_t> mask_;
  Tensor features_;
  ResponseSpan span_;
  int64_t chunk_begin_ = -1, chunk_end_ = -1;  // anchors [chunk_begin_, chunk_end_) computed in hidden_
  Tensor hidden_;                              // [(chunk_end_ - chunk_begin_) * B, H]
};

struct Cycle {
  int64_t pos = 0;              // bonus position p
  int32_t accepted = 0;         // k (the cycle commits k + 1 tokens)
  std::vector<int32_t> drafts;  // d_1..d_c compared in this cycle
};

struct ResponseTau {
  ResponseSpan span;
  std::vector<Cycle> cycles;
  int64_t committed = 0;        // sum over cycles of (k + 1)
  // Generated loop and baseline: the response tokens produced (bonus first), the time after the prefill until the
  // end of the response, and whether an EOS stopped it.
  std::vector<int32_t> tokens;
  double decode_seconds = 0;
  bool stopped_at_eos = false;
  double tau() const { return cycles.empty() ? 0.0 : static_cast<double>(committed) / cycles.size(); }
};

// In the loops below ctx is the draft model's context; the target is whole on ctx's device, or split over several
// (model/split_target.h: its outputs come to ctx).
// Teacher-forced tau of one sample (tokens x[0, S), response r with P >= 1, E - P >= 2, E <= S).
ResponseTau teacher_forced_tau(Context& ctx, const SplitTarget& target, DraftModel& dm, std::span<const int32_t> tokens,
                               ResponseSpan r);
// Generated-loop tau: prefill x[0, P), then speculative decoding of at most E - P response tokens or until an id
// of eos_ids is committed. Only x[0, P) and the length E - P are used from the sample.
ResponseTau generated_tau(Context& ctx, const SplitTarget& target, DraftModel& dm, std::span<const int32_t> tokens,
                          ResponseSpan r, std::span<const int32_t> eos_ids);
// Target-only greedy decode (one token per target forward) of at most E - P response tokens or until an EOS id:
// the baseline of the speedup, and the reference output speculative decoding must reproduce (it is lossless).
// No cycles; tokens / decode_seconds filled.
ResponseTau target_greedy_decode(Context& ctx, const SplitTarget& target, std::span<const int32_t> tokens,
                                 ResponseSpan r, std::span<const int32_t> eos_ids);

struct TauOptions {
  bool teacher = true;            // run teacher forcing
  bool generated = true;          // run the generated loop
  bool baseline = true;           // run the target-only greedy decode (with `generated`)
  int64_t max_samples = 0;        // 0 = all
  int64_t max_new_tokens = 0;     // > 0: responses cut to their first max_new_tokens tokens (E = P + max)
  std::vector<int32_t> eos_ids;   // stop ids of the generated loop and the baseline
  bool progress = true;
};

struct TauStats {
  int64_t responses = 0, cycles = 0, committed = 0;
  double tau = 0;                  // mean over responses of the response tau (spec 4)
  double pooled = 0;               // committed / cycles = mean committed tokens per target verify forward
  std::vector<int64_t> histogram;  // [B]: number of cycles with k = 0..B-1
  double seconds = 0;              // decode wall time (generated loop: after each prefill)
  int64_t decode_tokens = 0;       // tokens produced after the bonus (generated loop)
  double tokens_per_s() const { return seconds > 0 ? decode_tokens / seconds : 0.0; }
  // Per-slot acceptance along the block, from the histogram ([B], index 0 = 1): reached(k) = the fraction of cycles
  // that accepted at least k draft tokens (the measured prod_{i<=k} acc_i); given_previous(k) = reached(k) /
  // reached(k-1), slot k's acceptance when slots 1..k-1 were accepted (0 where no cycle got that far). A cycle
  // cut short near a response's end (fewer than B-1 drafts) counts as not reaching the slots it did not draft.
  std::vector<double> reached() const;
  std::vector<double> given_previous() const;
};

struct TauReport {
  int64_t block_size = 0;
  int64_t samples = 0;                    // samples looked at
  int64_t evaluated = 0;                  // samples not skipped
  int64_t skipped_no_prompt = 0, skipped_short = 0;  // P == 0;  E - P < 2
  bool has_teacher = false, has_generated = false, has_baseline = false;
  TauStats teacher, generated;
  // target-only decode: tokens after the bonus, seconds, one target forward per token
  int64_t baseline_tokens = 0;
  double baseline_seconds = 0;
  // generated loop vs baseline: responses whose tokens differ (speculative decoding must be lossless; a difference
  // means an argmax flipped at a near-tie between the 1-token and the B-token target forwards)
  int64_t lossless_mismatches = 0;
  // generated loop vs the data: responses whose first E-P-1 generated tokens equal x[P, E-1) (the data is the
  // target's greedy continuation), and cycles whose (p, k) differ from teacher forcing (both modes run)
  int64_t reference_matches = 0, cycle_mismatches = 0;
  double baseline_tokens_per_s() const { return baseline_seconds > 0 ? baseline_tokens / baseline_seconds : 0.0; }
  nlohmann::json to_json() const;
  std::string table() const;  // the multi-line table printed by `dflash eval`
};

// Runs the selected modes over samples (in order, at most max_samples).
TauReport evaluate_tau(Context& ctx, const SplitTarget& target, DraftModel& dm, std::span<const SampleView> samples,
                       const TauOptions& opts);

}  // namespace dflash
