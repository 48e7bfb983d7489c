// tests/eval/tau.cpp
// Tests of the acceptance length tau (eval/tau.h, spec 4) with the demo target on the CPU. The data are the
// target's own greedy continuations (generated here), so teacher forcing and real speculative decoding must give
// the same cycles and tau: for random drafters, a perturbed one, a perfect oracle and an oracle with planted errors.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <numeric>

#include <nlohmann/json.hpp>

#include "backend/context.h"
#include "eval/generate.h"
#include "eval/tau.h"
#include "io/jsonl.h"
#include "io/tokenizer.h"
#include "model/draft_batch.h"
#include "model/target.h"
#include "common/test_util.h"
#include "model/draft_batch.h"
#include "train/optimizer.h"

using namespace dflash;

namespace {

struct Sample {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> mask;
  SampleView view() const { return {tokens, mask}; }
};

struct Demo {
  std::unique_ptr<Context> ctx;
  std::shared_ptr<const Target> target;
  std::vector<int32_t> eos;
  std::vector<Sample> samples;  // prompt (<= 64 tokens) + greedy completion (40 tokens or up to EOS, EOS kept)
};

Demo& demo() {
  static Demo d = [] {
    Demo d;
    const std::string dir = test::source_dir() + "/assets/demo/target";
    d.ctx = make_context("cpu", {.threads = 2});
    d.target = Target::load(dir, *d.ctx);
    auto tok = Tokenizer::load(dir);
    d.eos = stop_token_ids(dir, d.target->config(), tok.get());
    std::vector<std::vector<int32_t>> prompts;
    LineReader r(test::source_dir() + "/assets/demo/prompts_eval.jsonl.gz");
    LineReader::Line l;
    while (prompts.size() < 6 && r.next(&l)) {
      std::vector<int32_t> t = tok->encode(nlohmann::json::parse(l.text)["prompt"].get<std::string>());
      if (t.size() > 64) t.erase(t.begin(), t.end() - 64);
      prompts.push_back(t);
    }
    DecodeOptions o;
    o.max_new_tokens = 40;
    o.batch_size = 3;
    o.eos_ids = d.eos;
    size_t next = 0;
    generate_batched(
        *d.ctx, *d.target, o,
        [&](GenerationRequest* q) {
          if (next >= prompts.size()) return false;
          q->row = next;
          q->prompt = prompts[next++];
          return true;
        },
        [&](GenerationResult&& g) {
          Sample s;
          const auto& p = prompts[g.row];
          s.tokens = p;
          s.tokens.insert(s.tokens.end(), g.ids.begin(), g.ids.end());
          if (g.eos) s.tokens.push_back(d.eos[0]);
          s.mask.assign(p.size(), 0);
          s.mask.resize(s.tokens.size(), 1);
          d.samples.push_back(std::move(s));
        });
    return d;
  }();
  return d;
}

std::unique_ptr<Drafter> random_drafter(int64_t B, uint64_t seed, double std = 0.02, int64_t layers = 1) {
  Demo& d = demo();
  DrafterConfig c = DrafterConfig::for_target(d.target->config(), layers, B,
                                              default_target_layer_ids(d.target->config().num_hidden_layers, 3), 8191);
  return std::make_unique<Drafter>(*d.ctx, c, seed, std);
}

// A drafter overfitted for a few seconds to the test responses themselves: its drafts depend on the context and a
// good share of them is accepted, so the exactness check covers cycles with k > 0 on the real DFlash path.
std::unique_ptr<Drafter> trained_drafter(int64_t B, int steps) {
  Demo& d = demo();
  auto dr = random_drafter(B, 11);
  std::vector<Tensor> feats;
  std::vector<DraftInputs> ins;
  std::vector<double> sum_w;
  for (const Sample& s : d.samples) {
    const int64_t S = static_cast<int64_t>(s.tokens.size());
    feats.push_back(d.target->forward(*d.ctx, cpu_tensor_i32(s.tokens, {S}), dr->config().target_layer_ids,
                                      false).features);
    std::vector<int32_t> anchors = candidate_anchors(s.mask);
    DraftBatch b = make_draft_batch(s.tokens, s.mask, anchors, static_cast<int64_t>(anchors.size()), B,
                                    dr->config().mask_token_id, 0.0);
    ins.push_back(upload_draft_batch(*d.ctx, b, feats.back()));
    sum_w.push_back(b.sum_w);
  }
  OptimConfig oc;
  oc.lr = 3e-3;
  oc.warmup_ratio = 0.05;
  oc.schedule = "constant";
  const double total_w = std::accumulate(sum_w.begin(), sum_w.end(), 0.0);
  for (int step = 0; step < steps; ++step) {
    for (size_t i = 0; i < ins.size(); ++i)
      dr->forward_backward(*d.ctx, ins[i], d.target->weights().embed, d.target->weights().lm_head, 0.0f,
                           static_cast<float>(1.0 / total_w), true);
    optimizer_step(*d.ctx, dr->params(), oc, lr_at(oc, step, steps), step + 1, global_grad_sq(*d.ctx, dr->params()));
  }
  return dr;
}

// Drafts the reference continuation, except at positions where `wrong(pos)` holds (a different token there).
class OracleDraftModel : public DraftModel {
 public:
  OracleDraftModel(std::vector<int32_t> ref, int64_t B, std::function<bool(int64_t)> wrong)
      : ref_(std::move(ref)), B_(B), wrong_(std::move(wrong)) {}
  int64_t block_size() const override { return B_; }
  std::vector<int64_t> layer_ids() const override { return {0}; }
  void begin(Context&, int64_t) override { len_ = 0; }
  void append_context(Context&, const Tensor& f) override { len_ += f.rows(); }
  std::vector<int32_t> propose(Context&, int32_t, int64_t n) override { return drafts(len_, n); }
  void begin_teacher(Context&, std::span<const int32_t>, const Tensor&, ResponseSpan) override {}
  std::vector<int32_t> propose_teacher(Context&, int64_t p, int64_t n) override { return drafts(p, n); }

 private:
  std::vector<int32_t> drafts(int64_t p, int64_t n) const {
    std::vector<int32_t> d;
    for (int64_t i = 1; i <= n; ++i) {
      const int32_t t = p + i < static_cast<int64_t>(ref_.size()) ? ref_[p + i] : 0;
      d.push_back(wrong_ && wrong_(p + i) ? (t + 1) % 8000 : t);
    }
    return d;
  }
  std::vector<int32_t> ref_;
  int64_t B_, len_ = 0;
  std::function<bool(int64_t)> wrong_;
};

// Teacher forcing and the generated loop agree cycle by cycle (positions, k, and the draft tokens themselves, which
// also checks that the draft cache holds exactly the context of the batched forward), and the generated tokens
// reproduce the data and the target-only decode. Returns the mean tau over the samples.
double check_exact(DraftModel& dm, const char* name) {
  Demo& d = demo();
  double sum = 0;
  int64_t cycles = 0, accepted = 0;
  for (size_t i = 0; i < d.samples.size(); ++i) {
    const Sample& s = d.samples[i];
    const ResponseSpan r = response_span(s.mask);
    ResponseTau tf = teacher_forced_tau(*d.ctx, *d.target, dm, s.tokens, r);
    ResponseTau gen = generated_tau(*d.ctx, *d.target, dm, s.tokens, r, d.eos);
    ResponseTau base = target_greedy_decode(*d.ctx, *d.target, s.tokens, r, d.eos);
    EXPECT_EQ(tf.cycles.size(), gen.cycles.size()) << name << " sample " << i;
    for (size_t c = 0; c < std::min(tf.cycles.size(), gen.cycles.size()); ++c) {
      EXPECT_EQ(tf.cycles[c].pos, gen.cycles[c].pos) << name << " sample " << i << " cycle " << c;
      EXPECT_EQ(tf.cycles[c].accepted, gen.cycles[c].accepted) << name << " sample " << i << " cycle " << c;
      EXPECT_EQ(tf.cycles[c].drafts, gen.cycles[c].drafts) << name << " sample " << i << " cycle " << c;
      accepted += tf.cycles[c].accepted;
    }
    EXPECT_EQ(tf.tau(), gen.tau()) << name << " sample " << i;
    EXPECT_EQ(tf.committed, r.length() - 1) << name;
    EXPECT_EQ(gen.tokens, base.tokens) << name << " sample " << i << ": speculative decoding is not lossless";
    EXPECT_GE(static_cast<int64_t>(gen.tokens.size()), r.length() - 1);
    EXPECT_TRUE(static_cast<int64_t>(gen.tokens.size()) >= r.length() - 1 && std::equal(gen.tokens.begin(), gen.tokens.begin() + (r.length() - 1), s.tokens.begin() + r.P))
        << name << " sample " << i << ": the generated loop does not reproduce the target's greedy data";
    sum += tf.tau();
    cycles += static_cast<int64_t>(tf.cycles.size());
  }
  const double tau = sum / d.samples.size();
  std::printf("[ %s ] tau %.4f over %zu responses, %lld cycles, %lld accepted draft tokens\n", name, tau,
              d.samples.size(), static_cast<long long>(cycles), static_cast<long long>(accepted));
  return tau;
}

}  // namespace

TEST(EvalTau, ResponseSpanIsTheLastRunOfOnes) {
  std::vector<uint8_t> m = {0, 0, 1, 1, 0, 0, 1, 1, 1, 0};
  EXPECT_EQ(response_span(m).P, 6);
  EXPECT_EQ(response_span(m).E, 9);
  std::vector<uint8_t> z = {0, 0};
  EXPECT_EQ(response_span(z).length(), 0);
  std::vector<uint8_t> o = {1, 1, 1};
  EXPECT_EQ(response_span(o).P, 0);
  EXPECT_EQ(response_span(o).E, 3);
}

TEST(EvalTau, GreedySamplesAreBuilt) {
  Demo& d = demo();
  ASSERT_EQ(d.samples.size(), 6u);
  for (const Sample& s : d.samples) {
    const ResponseSpan r = response_span(s.mask);
    EXPECT_GE(r.length(), 2);
    EXPECT_LE(r.length(), 41);
  }
}

TEST(EvalTau, PerfectOracleCommitsWholeBlocks) {
  Demo& d = demo();
  for (int64_t B : {4, 16}) {
    double want = 0;
    for (const Sample& s : d.samples) {
      const int64_t n = response_span(s.mask).length() - 1;  // tokens committed by the cycles
      want += static_cast<double>(n) / ((n + B - 1) / B);
    }
    want /= d.samples.size();
    double got = 0;
    for (size_t i = 0; i < d.samples.size(); ++i) {
      OracleDraftModel dm(d.samples[i].tokens, B, nullptr);
      const Sample& s = d.samples[i];
      ResponseTau tf = teacher_forced_tau(*d.ctx, *d.target, dm, s.tokens, response_span(s.mask));
      ResponseTau gen = generated_tau(*d.ctx, *d.target, dm, s.tokens, response_span(s.mask), d.eos);
      EXPECT_EQ(tf.tau(), gen.tau());
      EXPECT_EQ(gen.tokens.size(), static_cast<size_t>(response_span(s.mask).length()));
      got += gen.tau();
    }
    got /= d.samples.size();
    EXPECT_NEAR(got, want, 1e-12) << "B " << B;
    std::printf("[ oracle B=%lld ] tau %.4f\n", static_cast<long long>(B), got);
  }
}

TEST(EvalTau, OracleWithPlantedErrorsTeacherEqualsGenerated) {
  Demo& d = demo();
  double sum = 0;
  for (size_t i = 0; i < d.samples.size(); ++i) {
    // wrong at positions 7, 12, 17, ...: k varies between 0 and B-1
    OracleDraftModel dm(d.samples[i].tokens, 8, [](int64_t p) { return p % 5 == 2 || p % 11 == 0; });
    const Sample& s = d.samples[i];
    ResponseTau tf = teacher_forced_tau(*d.ctx, *d.target, dm, s.tokens, response_span(s.mask));
    ResponseTau gen = generated_tau(*d.ctx, *d.target, dm, s.tokens, response_span(s.mask), d.eos);
    ASSERT_EQ(tf.cycles.size(), gen.cycles.size());
    for (size_t c = 0; c < tf.cycles.size(); ++c) {
      EXPECT_EQ(tf.cycles[c].pos, gen.cycles[c].pos);
      EXPECT_EQ(tf.cycles[c].accepted, gen.cycles[c].accepted);
    }
    EXPECT_GT(tf.tau(), 1.0);
    EXPECT_LT(tf.tau(), 8.0);
    sum += tf.tau();
  }
  std::printf("[ oracle with errors B=8 ] tau %.4f\n", sum / d.samples.size());
}

TEST(EvalTau, RandomDrafterTeacherEqualsGeneratedExactly) {
  auto dr = random_drafter(8, 1);
  DFlashDraftModel dm(*dr, *demo().target, 16);  // small chunks: several batched forwards per sample
  const double tau = check_exact(dm, "random drafter B=8");
  EXPECT_GE(tau, 1.0);
  EXPECT_LE(tau, 8.0);
}

TEST(EvalTau, PerturbedDrafterTeacherEqualsGeneratedExactly) {
  Demo& d = demo();
  auto dr = random_drafter(6, 2, 0.05, 2);
  // perturb every weight (norm weights included) away from the init
  uint64_t k = 0;
  for (Param& p : dr->params().all()) {
    Tensor noise = test::randn(p.shape, 1000 + k++, 0.3);
    float* w = p.master.ptr<float>();
    for (int64_t i = 0; i < p.master.numel(); ++i) w[i] += noise.ptr<float>()[i] * (p.shape.size() == 1 ? 1.0f : 0.1f);
  }
  dr->params().sync_compute(*d.ctx);
  DFlashDraftModel dm(*dr, *d.target);
  const double tau = check_exact(dm, "perturbed drafter B=6");
  EXPECT_GE(tau, 1.0);
  EXPECT_LE(tau, 6.0);
}

// Acceptance along the block from the histogram (B 4): 10 cycles accepting 0, 1, 2, 3 draft tokens 4, 3, 2, 1 times.
TEST(EvalTau, AcceptanceBySlotFromTheHistogram) {
  TauStats s;
  s.histogram = {4, 3, 2, 1};
  s.cycles = 10;
  const std::vector<double> reached = s.reached(), given = s.given_previous();
  ASSERT_EQ(reached.size(), 4u);
  EXPECT_DOUBLE_EQ(reached[0], 1.0);
  EXPECT_DOUBLE_EQ(reached[1], 0.6);  // 6 of 10 cycles accepted slot 1
  EXPECT_DOUBLE_EQ(reached[2], 0.3);
  EXPECT_DOUBLE_EQ(reached[3], 0.1);
  EXPECT_DOUBLE_EQ(given[1], 0.6);
  EXPECT_DOUBLE_EQ(given[2], 0.5);   // 3 of the 6 that reached slot 1 accepted slot 2
  EXPECT_NEAR(given[3], 1.0 / 3.0, 1e-15);
  TauStats none;  // no cycle: nothing reached, nothing accepted
  none.histogram = {0, 0, 0};
  EXPECT_EQ(none.reached(), (std::vector<double>{1, 0, 0}));
  EXPECT_EQ(none.given_previous(), (std::vector<double>{1, 0, 0}));
}

TEST(EvalTau, EvaluateReportBlock4) {
  Demo& d = demo();
  auto dr = random_drafter(4, 3);
  DFlashDraftModel dm(*dr, *d.target);
  std::vector<SampleView> views;
  for (const Sample& s : d.samples) views.push_back(s.view());
  // one sample without prompt and one with a 1-token response: skipped and counted
  std::vector<int32_t> t0 = {5, 6, 7};
  std::vector<uint8_t> m0 = {1, 1, 1};
  std::vector<int32_t> t1 = {5, 6, 7};
  std::vector<uint8_t> m1 = {0, 0, 1};
  views.push_back({t0, m0});
  views.push_back({t1, m1});
  TauOptions o;
  o.eos_ids = d.eos;
  o.progress = false;
  TauReport rep = evaluate_tau(*d.ctx, *d.target, dm, views, o);
  EXPECT_EQ(rep.samples, 8);
  EXPECT_EQ(rep.evaluated, 6);
  EXPECT_EQ(rep.skipped_no_prompt, 1);
  EXPECT_EQ(rep.skipped_short, 1);
  for (const TauStats* s : {&rep.teacher, &rep.generated}) {
    EXPECT_EQ(s->responses, 6);
    EXPECT_GE(s->tau, 1.0);
    EXPECT_LE(s->tau, 4.0);
    ASSERT_EQ(s->histogram.size(), 4u);
    EXPECT_EQ(std::accumulate(s->histogram.begin(), s->histogram.end(), int64_t{0}), s->cycles);
    int64_t committed = 0;
    for (int64_t k = 0; k < 4; ++k) committed += s->histogram[k] * (k + 1);
    EXPECT_EQ(committed, s->committed);
    EXPECT_NEAR(s->pooled, static_cast<double>(s->committed) / s->cycles, 1e-12);
  }
  EXPECT_EQ(rep.teacher.tau, rep.generated.tau);
  EXPECT_EQ(rep.teacher.histogram, rep.generated.histogram);
  EXPECT_EQ(rep.cycle_mismatches, 0);
  EXPECT_EQ(rep.lossless_mismatches, 0);
  EXPECT_EQ(rep.reference_matches, 6);
  EXPECT_GT(rep.baseline_tokens, 0);
  EXPECT_EQ(rep.baseline_tokens, rep.generated.decode_tokens);
  auto j = rep.to_json();
  EXPECT_EQ(j["teacher_forced"]["histogram"].size(), 4u);
  EXPECT_EQ(j["generated"]["reached_by_slot"].get<std::vector<double>>(), rep.generated.reached());
  EXPECT_EQ(j["teacher_forced"]["accepted_given_previous_by_slot"].size(), 4u);
  std::printf("%s", rep.table().c_str());
  // --max-new-tokens cuts the responses: 10 tokens -> 9 committed per response
  o.max_new_tokens = 10;
  o.baseline = false;
  TauReport cut = evaluate_tau(*d.ctx, *d.target, dm, views, o);
  int64_t want = 0;
  for (const Sample& s : d.samples) want += std::min<int64_t>(response_span(s.mask).length(), 10) - 1;
  EXPECT_EQ(cut.teacher.committed, want);
  EXPECT_EQ(cut.generated.committed, want);
  EXPECT_FALSE(cut.has_baseline);
}

TEST(EvalTau, TrainedDrafterTeacherEqualsGeneratedExactly) {
  auto dr = trained_drafter(4, 25);
  DFlashDraftModel dm(*dr, *demo().target);
  const double tau = check_exact(dm, "overfitted drafter B=4");
  EXPECT_GT(tau, 1.2);
  EXPECT_LE(tau, 4.0);
}

// DFlash2 drafts through its candidate selector: speculative decoding stays lossless, and teacher forcing gives the
// generated loop's cycles and drafts exactly (the selector's path from the cached context and from the batched
// forward agree). Every weight is perturbed, so that the pair scores change the choices.
TEST(EvalTau, DFlash2DrafterTeacherEqualsGeneratedExactly) {
  Demo& d = demo();
  DrafterConfig c = DrafterConfig::for_target(d.target->config(), 1, 6,
                                              default_target_layer_ids(d.target->config().num_hidden_layers, 3), 8191);
  c.arch = DraftArch::DFlash2;
  c.selector_rank = 32;
  c.selector_top_k = 8;
  auto dr = std::make_unique<Drafter>(*d.ctx, c, 5, 0.05);
  uint64_t k = 0;
  for (Param& p : dr->params().all()) {
    Tensor noise = test::randn(p.shape, 2000 + k++, 0.3);
    float* w = p.master.ptr<float>();
    for (int64_t i = 0; i < p.master.numel(); ++i) w[i] += noise.ptr<float>()[i] * (p.shape.size() == 1 ? 1.0f : 0.1f);
  }
  dr->params().sync_compute(*d.ctx);
  DFlashDraftModel dm(*dr, *d.target, 16);
  const double tau = check_exact(dm, "dflash2 drafter B=6");
  EXPECT_GE(tau, 1.0);
  EXPECT_LE(tau, 6.0);
}
