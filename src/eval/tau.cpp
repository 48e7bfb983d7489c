#include "eval/tau.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>

#include <nlohmann/json.hpp>

#include "core/log.h"
#include "model/draft_batch.h"

namespace dflash {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Greedy token ids of the rows of logits [R, V] (argmax on the device; first on ties).
std::vector<int32_t> argmax_rows(Context& ctx, const Tensor& logits) {
  const int64_t R = logits.rows();
  if (R == 0) return {};
  Tensor ids = ctx.empty(DType::I32, {R});
  ctx.argmax(logits, ids);
  Tensor h = ctx.to_host(ids, false);
  return std::vector<int32_t>(h.ptr<int32_t>(), h.ptr<int32_t>() + R);
}

// Greedy token ids of the rows of the target's final-normed hidden [R, H] on ctx.
std::vector<int32_t> argmax_tokens(Context& ctx, const SplitTarget& target, const Tensor& hidden) {
  if (hidden.rows() == 0) return {};
  Tensor logits = ctx.empty(ctx.compute_dtype(), {hidden.rows(), target.config().vocab_size});
  target.logits(ctx, hidden, logits);
  return argmax_rows(ctx, logits);
}

bool is_eos(int32_t t, std::span<const int32_t> eos) { return std::find(eos.begin(), eos.end(), t) != eos.end(); }

void check_span(std::span<const int32_t> tokens, ResponseSpan r, const char* what) {
  DFLASH_CHECK(r.P >= 1 && r.E - r.P >= 2 && r.E <= static_cast<int64_t>(tokens.size()), what, ": response [", r.P,
               ", ", r.E, ") of a ", tokens.size(), "-token sample needs P >= 1, E - P >= 2, E <= S");
}

// Prefill x[0, P) into a fresh cache; returns the bonus (argmax after the prompt) and the prefill features.
int32_t prefill(Context& ctx, const SplitTarget& target, std::span<const int32_t> tokens, int64_t P, KVCache& cache,
                std::span<const int64_t> layer_ids, Tensor* features) {
  std::vector<int32_t> prompt(tokens.begin(), tokens.begin() + P);
  Target::Output out = target.forward(ctx, cpu_tensor_i32(prompt, {P}), layer_ids, true, &cache);
  if (features) *features = out.features;
  return argmax_tokens(ctx, target, out.final_hidden.slice(P - 1, P))[0];
}

}  // namespace

ResponseSpan response_span(std::span<const uint8_t> m) {
  int64_t E = static_cast<int64_t>(m.size());
  while (E > 0 && !m[E - 1]) --E;
  if (E == 0) return {};
  int64_t P = E;
  while (P > 0 && m[P - 1]) --P;
  return {P, E};
}

// ---- DFlashDraftModel ------------------------------------------------------------------------------------------

DFlashDraftModel::DFlashDraftModel(Drafter& drafter, const ModelConfig& target_cfg, TargetHead head,
                                   int64_t anchors_per_forward)
    : drafter_(drafter), target_cfg_(target_cfg), head_(std::move(head)),
      anchors_per_forward_(std::max<int64_t>(1, anchors_per_forward)) {
  DFLASH_CHECK(drafter.config().hidden_size == target_cfg.hidden_size, "drafter hidden_size ",
               drafter.config().hidden_size, " differs from the target's ", target_cfg.hidden_size);
  DFLASH_CHECK(drafter.config().vocab_size <= target_cfg.vocab_size, "drafter vocab_size ",
               drafter.config().vocab_size, " exceeds the target's ", target_cfg.vocab_size);
  for (int64_t l : drafter.config().target_layer_ids)
    DFLASH_CHECK(l >= 0 && l < target_cfg.num_hidden_layers, "drafter target layer id ", l,
                 " is not a layer of the ", target_cfg.num_hidden_layers, "-layer target");
}

DFlashDraftModel::DFlashDraftModel(Drafter& drafter, const Target& target, int64_t anchors_per_forward)
    : DFlashDraftModel(drafter, target.config(), TargetHead{target.weights().embed, target.weights().lm_head},
                       anchors_per_forward) {
  DFLASH_CHECK(target.whole(), "DFlashDraftModel: the target is a stage; pass SplitTarget::head");
}

int64_t DFlashDraftModel::block_size() const { return drafter_.config().block_size; }
std::vector<int64_t> DFlashDraftModel::layer_ids() const { return drafter_.config().target_layer_ids; }

std::vector<int32_t> DFlashDraftModel::draft_tokens(Context& ctx, const Tensor& hidden, int32_t anchor) const {
  if (drafter_.config().dflash2()) return drafter_.select_path(ctx, hidden, anchor, head_.lm_head);
  if (hidden.rows() == 0) return {};
  Tensor logits = ctx.empty(ctx.compute_dtype(), {hidden.rows(), target_cfg_.vocab_size});
  target_logits(ctx, target_cfg_, head_.lm_head, hidden, logits);
  return argmax_rows(ctx, logits);
}

void DFlashDraftModel::begin(Context& ctx, int64_t capacity) { cache_ = drafter_.make_cache(ctx, capacity); }

void DFlashDraftModel::append_context(Context& ctx, const Tensor& features) {
  drafter_.extend_cache(ctx, cache_, features);
}

std::vector<int32_t> DFlashDraftModel::propose(Context& ctx, int32_t bonus, int64_t n) {
  if (n <= 0) return {};
  DFLASH_CHECK(n < block_size(), "propose: ", n, " draft tokens from a block of ", block_size());
  Tensor h = drafter_.draft_block(ctx, cache_, bonus, head_.embed);
  return draft_tokens(ctx, h.slice(1, 1 + n), bonus);
}

void DFlashDraftModel::begin_teacher(Context& ctx, std::span<const int32_t> tokens, const Tensor& features,
                                     ResponseSpan r) {
  tokens_.assign(tokens.begin(), tokens.begin() + r.E);
  mask_.assign(static_cast<size_t>(r.E), 1);  // labels are not used; any mask works
  features_ = features;
  span_ = r;
  chunk_begin_ = chunk_end_ = -1;
  hidden_ = Tensor{};
}

std::vector<int32_t> DFlashDraftModel::propose_teacher(Context& ctx, int64_t p, int64_t n) {
  if (n <= 0) return {};
  const int64_t B = block_size();
  DFLASH_CHECK(n < B && p >= span_.P && p + 1 < span_.E, "propose_teacher: anchor ", p, " with ", n,
               " drafts outside the response [", span_.P, ", ", span_.E, ")");
  if (p < chunk_begin_ || p >= chunk_end_) {
    // The next anchors_per_forward anchors from p on (the walk is monotone), all ending before E - 1.
    chunk_begin_ = p;
    chunk_end_ = std::min(span_.E - 1, p + anchors_per_forward_);
    std::vector<int32_t> anchors;
    for (int64_t a = chunk_begin_; a < chunk_end_; ++a) anchors.push_back(static_cast<int32_t>(a));
    const DrafterConfig& c = drafter_.config();
    DraftBatch b = make_draft_batch(tokens_, mask_, anchors, static_cast<int64_t>(anchors.size()), B,
                                    c.mask_token_id, 1.0);
    hidden_ = drafter_.forward_hidden(ctx, upload_draft_batch(ctx, b, features_), head_.embed);
  }
  const int64_t row = (p - chunk_begin_) * B + 1;
  return draft_tokens(ctx, hidden_.slice(row, row + n), tokens_[p]);
}

// ---- the two loops and the baseline ---------------------------------------------------------------------------

ResponseTau teacher_forced_tau(Context& ctx, const SplitTarget& target, DraftModel& dm, std::span<const int32_t> tokens,
                               ResponseSpan r) {
  check_span(tokens, r, "teacher-forced tau");
  const int64_t B = dm.block_size();
  const std::vector<int64_t> layers = dm.layer_ids();
  std::vector<int32_t> x(tokens.begin(), tokens.begin() + r.E);
  Target::Output out = target.forward(ctx, cpu_tensor_i32(x, {r.E}), layers, false);
  dm.begin_teacher(ctx, x, out.features, r);
  ResponseTau res;
  res.span = r;
  for (int64_t p = r.P; p < r.E - 1;) {
    const int64_t c = std::min(B - 1, r.E - 2 - p);
    Cycle cy;
    cy.pos = p;
    cy.drafts = dm.propose_teacher(ctx, p, c);
    DFLASH_CHECK(static_cast<int64_t>(cy.drafts.size()) == c, "draft model returned ", cy.drafts.size(),
                 " tokens, ", c, " asked");
    int64_t k = 0;
    while (k < c && cy.drafts[k] == x[p + 1 + k]) ++k;
    cy.accepted = static_cast<int32_t>(k);
    res.committed += k + 1;
    res.cycles.push_back(std::move(cy));
    p += k + 1;
  }
  return res;
}

ResponseTau generated_tau(Context& ctx, const SplitTarget& target, DraftModel& dm, std::span<const int32_t> tokens,
                          ResponseSpan r, std::span<const int32_t> eos_ids) {
  check_span(tokens, r, "generated tau");
  const int64_t B = dm.block_size(), P = r.P, E = r.E;
  const std::vector<int64_t> layers = dm.layer_ids();
  // The target cache never holds more than positions 0..E-2 plus a verify block ending at E-1; the draft context
  // never passes E - 1. It records each verification so that a hybrid target's linear-attention state can roll back
  // to the accepted tokens (model/target/cache.h).
  KVCache cache = target.make_cache(ctx, E, true);
  dm.begin(ctx, E);
  Tensor feats;
  int32_t bonus = prefill(ctx, target, tokens, P, cache, layers, &feats);
  dm.append_context(ctx, feats);
  ResponseTau res;
  res.span = r;
  res.tokens.push_back(bonus);
  const auto t0 = Clock::now();
  bool stop = is_eos(bonus, eos_ids);
  for (int64_t p = P; !stop && p < E - 1;) {
    const int64_t c = std::min(B - 1, E - 2 - p);
    Cycle cy;
    cy.pos = p;
    cy.drafts = dm.propose(ctx, bonus, c);
    DFLASH_CHECK(static_cast<int64_t>(cy.drafts.size()) == c, "draft model returned ", cy.drafts.size(),
                 " tokens, ", c, " asked");
    std::vector<int32_t> verify = {bonus};
    verify.insert(verify.end(), cy.drafts.begin(), cy.drafts.end());
    DFLASH_CHECK(cache.len == p, "generated loop: target cache at ", cache.len, ", bonus at ", p);
    Target::Output out = target.forward(ctx, cpu_tensor_i32(verify, {c + 1}), layers, true, &cache);
    const std::vector<int32_t> t = argmax_tokens(ctx, target, out.final_hidden);  // t[i] predicts p + i + 1
    int64_t k = 0;
    while (k < c && cy.drafts[k] == t[k]) ++k;
    // Committed: d_1..d_k, then t_k (= the new bonus); an EOS ends the response after itself.
    std::vector<int32_t> committed(cy.drafts.begin(), cy.drafts.begin() + k);
    committed.push_back(t[k]);
    for (size_t i = 0; i < committed.size(); ++i)
      if (is_eos(committed[i], eos_ids)) {
        committed.resize(i + 1);
        stop = true;
        break;
      }
    const int64_t n = static_cast<int64_t>(committed.size());
    cy.accepted = static_cast<int32_t>(n - 1);
    res.committed += n;
    res.cycles.push_back(std::move(cy));
    res.tokens.insert(res.tokens.end(), committed.begin(), committed.end());
    if (stop) break;
    target.truncate(ctx, cache, p + k + 1);                // keep the bonus and the accepted drafts
    dm.append_context(ctx, out.features.slice(0, k + 1));  // their target features: positions p..p+k
    p += k + 1;
    bonus = t[k];
  }
  res.stopped_at_eos = stop;
  res.decode_seconds = seconds_since(t0);
  return res;
}

ResponseTau target_greedy_decode(Context& ctx, const SplitTarget& target, std::span<const int32_t> tokens,
                                 ResponseSpan r, std::span<const int32_t> eos_ids) {
  check_span(tokens, r, "target-only decode");
  const int64_t P = r.P, M = r.E - r.P;
  KVCache cache = target.make_cache(ctx, r.E);
  const std::vector<int64_t> none;
  int32_t tok = prefill(ctx, target, tokens, P, cache, none, nullptr);
  ResponseTau res;
  res.span = r;
  res.tokens.push_back(tok);
  const auto t0 = Clock::now();
  bool stop = is_eos(tok, eos_ids);
  while (!stop && static_cast<int64_t>(res.tokens.size()) < M) {
    Target::Output out = target.forward(ctx, cpu_tensor_i32({tok}, {1}), none, true, &cache);
    tok = argmax_tokens(ctx, target, out.final_hidden)[0];
    res.tokens.push_back(tok);
    stop = is_eos(tok, eos_ids);
  }
  res.stopped_at_eos = stop;
  res.decode_seconds = seconds_since(t0);
  return res;
}

// ---- data-set evaluation --------------------------------------------------------------------------------------

namespace {

void accumulate(TauStats& s, const ResponseTau& r, int64_t B) {
  if (s.histogram.empty()) s.histogram.assign(static_cast<size_t>(B), 0);
  if (!r.tokens.empty()) {
    s.seconds += r.decode_seconds;
    s.decode_tokens += static_cast<int64_t>(r.tokens.size()) - 1;
  }
  if (r.cycles.empty()) return;
  ++s.responses;
  s.cycles += static_cast<int64_t>(r.cycles.size());
  s.committed += r.committed;
  s.tau += r.tau();  // a sum until finish()
  for (const Cycle& c : r.cycles) ++s.histogram[static_cast<size_t>(c.accepted)];
}

}  // namespace

std::vector<double> TauStats::reached() const {
  std::vector<double> r(histogram.size(), 0.0);
  int64_t at_least = cycles;  // cycles with accepted >= k, from k = 0 up
  for (size_t k = 0; k < histogram.size(); ++k) {
    r[k] = cycles > 0 ? static_cast<double>(at_least) / static_cast<double>(cycles) : (k == 0 ? 1.0 : 0.0);
    at_least -= histogram[k];
  }
  if (!r.empty()) r[0] = 1.0;
  return r;
}

std::vector<double> TauStats::given_previous() const {
  const std::vector<double> r = reached();
  std::vector<double> g(r.size(), 0.0);
  if (!g.empty()) g[0] = 1.0;
  for (size_t k = 1; k < r.size(); ++k) g[k] = r[k - 1] > 0 ? r[k] / r[k - 1] : 0.0;
  return g;
}

namespace {

void finish(TauStats& s, int64_t B) {
  if (s.histogram.empty()) s.histogram.assign(static_cast<size_t>(B), 0);
  s.tau = s.responses ? s.tau / s.responses : 0.0;
  s.pooled = s.cycles ? static_cast<double>(s.committed) / s.cycles : 0.0;
}

nlohmann::json stats_json(const TauStats& s) {
  return {{"responses", s.responses}, {"cycles", s.cycles},          {"committed_tokens", s.committed},
          {"tau", s.tau},             {"tokens_per_target_forward", s.pooled}, {"histogram", s.histogram},
          {"reached_by_slot", s.reached()}, {"accepted_given_previous_by_slot", s.given_previous()},
          {"decode_tokens", s.decode_tokens}, {"decode_seconds", s.seconds}, {"tokens_per_s", s.tokens_per_s()}};
}

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

}  // namespace

TauReport evaluate_tau(Context& ctx, const SplitTarget& target, DraftModel& dm, std::span<const SampleView> samples,
                       const TauOptions& o) {
  DFLASH_CHECK(o.teacher || o.generated, "eval: neither teacher forcing nor the generated loop selected");
  const int64_t B = dm.block_size();
  TauReport rep;
  rep.block_size = B;
  rep.has_teacher = o.teacher;
  rep.has_generated = o.generated;
  rep.has_baseline = o.generated && o.baseline;
  int64_t n = static_cast<int64_t>(samples.size());
  if (o.max_samples > 0) n = std::min(n, o.max_samples);
  std::optional<Progress> bar;
  if (o.progress) bar.emplace("eval", n, "samples");
  for (int64_t i = 0; i < n; ++i) {
    const SampleView& s = samples[static_cast<size_t>(i)];
    ++rep.samples;
    ResponseSpan r = response_span(s.loss_mask);
    if (o.max_new_tokens > 0) r.E = std::min(r.E, r.P + o.max_new_tokens);
    if (r.length() < 2) {
      ++rep.skipped_short;
    } else if (r.P == 0) {
      ++rep.skipped_no_prompt;
    } else {
      ++rep.evaluated;
      ResponseTau tf, gen;
      if (o.teacher) {
        tf = teacher_forced_tau(ctx, target, dm, s.tokens, r);
        accumulate(rep.teacher, tf, B);
      }
      if (o.generated) {
        gen = generated_tau(ctx, target, dm, s.tokens, r, o.eos_ids);
        accumulate(rep.generated, gen, B);
        const size_t m = static_cast<size_t>(r.length() - 1);
        if (gen.tokens.size() >= m && std::equal(gen.tokens.begin(), gen.tokens.begin() + m, s.tokens.begin() + r.P))
          ++rep.reference_matches;
        if (o.baseline) {
          ResponseTau base = target_greedy_decode(ctx, target, s.tokens, r, o.eos_ids);
          rep.baseline_tokens += static_cast<int64_t>(base.tokens.size()) - 1;
          rep.baseline_seconds += base.decode_seconds;
          if (base.tokens != gen.tokens) ++rep.lossless_mismatches;
        }
      }
      if (o.teacher && o.generated) {
        bool same = tf.cycles.size() == gen.cycles.size();
        for (size_t c = 0; same && c < tf.cycles.size(); ++c)
          same = tf.cycles[c].pos == gen.cycles[c].pos && tf.cycles[c].accepted == gen.cycles[c].accepted;
        if (!same) ++rep.cycle_mismatches;
      }
    }
    if (o.progress) {
      std::string suf;
      if (o.teacher) suf += "tau_tf " + fmt("%.3f", rep.teacher.responses ? rep.teacher.tau / rep.teacher.responses : 0);
      if (o.generated)
        suf += std::string(o.teacher ? " | " : "") + "tau_gen " +
               fmt("%.3f", rep.generated.responses ? rep.generated.tau / rep.generated.responses : 0);
      bar->update(i + 1, suf);
    }
  }
  finish(rep.teacher, B);
  finish(rep.generated, B);
  if (bar) bar->finish();
  return rep;
}

nlohmann::json TauReport::to_json() const {
  nlohmann::json j = {{"block_size", block_size},
                      {"samples", samples},
                      {"evaluated", evaluated},
                      {"skipped", {{"no_prompt", skipped_no_prompt}, {"response_shorter_than_2", skipped_short}}}};
  if (has_teacher) j["teacher_forced"] = stats_json(teacher);
  if (has_generated) {
    j["generated"] = stats_json(generated);
    j["generated"]["reference_matches"] = reference_matches;
  }
  if (has_baseline) {
    j["target_only"] = {{"decode_tokens", baseline_tokens},
                        {"decode_seconds", baseline_seconds},
                        {"tokens_per_s", baseline_tokens_per_s()}};
    j["speedup"] = baseline_tokens_per_s() > 0 ? generated.tokens_per_s() / baseline_tokens_per_s() : 0.0;
    j["lossless_mismatches"] = lossless_mismatches;
  }
  if (has_teacher && has_generated) j["cycle_mismatches"] = cycle_mismatches;
  return j;
}

std::string TauReport::table() const {
  std::string t;
  auto row = [&](const std::string& name, const std::string& a, const std::string& b) {
    char buf[256];
    std::snprintf(buf, sizeof buf, "%-34s %16s %16s\n", name.c_str(), a.c_str(), b.c_str());
    t += buf;
  };
  auto col = [](bool on, const std::string& v) { return on ? v : std::string("-"); };
  t += cat("samples ", samples, " (skipped: ", skipped_no_prompt, " without prompt, ", skipped_short,
           " with a response shorter than 2 tokens); block size ", block_size, "\n");
  row("", "teacher-forced", "generated");
  row("responses", col(has_teacher, std::to_string(teacher.responses)),
      col(has_generated, std::to_string(generated.responses)));
  row("cycles (target verify forwards)", col(has_teacher, std::to_string(teacher.cycles)),
      col(has_generated, std::to_string(generated.cycles)));
  row("tau (mean over responses)", col(has_teacher, fmt("%.4f", teacher.tau)),
      col(has_generated, fmt("%.4f", generated.tau)));
  row("committed tokens per forward", col(has_teacher, fmt("%.4f", teacher.pooled)),
      col(has_generated, fmt("%.4f", generated.pooled)));
  t += "acceptance histogram (cycles with k accepted draft tokens):\n";
  for (int64_t k = 0; k < block_size; ++k) {
    auto cell = [&](bool on, const TauStats& s) {
      if (!on) return std::string("-");
      const int64_t c = s.histogram.empty() ? 0 : s.histogram[static_cast<size_t>(k)];
      return cat(c, " (", fmt("%5.1f", s.cycles ? 100.0 * c / s.cycles : 0.0), "%)");
    };
    row(cat("  k = ", k), cell(has_teacher, teacher), cell(has_generated, generated));
  }
  if (has_generated) {
    t += cat("generated responses equal to the data (target-greedy data): ", reference_matches, " / ", evaluated,
             "\n");
    t += cat("speculative decode: ", generated.decode_tokens, " tokens in ", fmt("%.3f", generated.seconds), " s = ",
             fmt("%.1f", generated.tokens_per_s()), " tokens/s\n");
  }
  if (has_baseline) {
    t += cat("target-only decode: ", baseline_tokens, " tokens in ", fmt("%.3f", baseline_seconds), " s = ",
             fmt("%.1f", baseline_tokens_per_s()), " tokens/s (1 token per target forward)\n");
    t += cat("speedup ", fmt("%.2f", baseline_tokens_per_s() > 0 ? generated.tokens_per_s() / baseline_tokens_per_s() : 0),
             "x; lossless (speculative == target-only output): ", evaluated - lossless_mismatches, " / ",
             evaluated, (lossless_mismatches ? "  (differences: argmax flips at near-ties)" : ""), "\n");
  }
  if (has_teacher && has_generated)
    t += cat("responses whose cycles differ between teacher forcing and generation: ", cycle_mismatches, "\n");
  return t;
}

}  // namespace dflash
