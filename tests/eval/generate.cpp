// tests/eval/generate.cpp
// Tests of batched generation (eval/generate.h) with the demo target on the CPU: Target::forward_batch against
// Target::forward, greedy and sampled output independent of the batch size, EOS stops, sampling rules, and the
// resumable `generate` job (a torn output file resumes to the same bytes as an uninterrupted run).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "backend/context.h"
#include "core/error.h"
#include "core/fs.h"
#include "eval/generate.h"
#include "io/jsonl.h"
#include "io/tokenizer.h"
#include "model/target.h"
#include "common/test_util.h"

using namespace dflash;

namespace {

struct Demo {
  std::unique_ptr<Context> ctx;
  std::shared_ptr<const Target> target;
  std::shared_ptr<const Tokenizer> tok;
  std::vector<std::string> prompts;          // first prompts of prompts_eval
  std::vector<std::vector<int32_t>> ids;     // their tokens, cut to at most 48
};

Demo& demo() {
  static Demo d = [] {
    Demo d;
    const std::string dir = test::source_dir() + "/assets/demo/target";
    d.ctx = make_context("cpu", {.threads = 2});
    d.target = Target::load(dir, *d.ctx);
    d.tok = Tokenizer::load(dir);
    LineReader r(test::source_dir() + "/assets/demo/prompts_eval.jsonl.gz");
    LineReader::Line l;
    while (d.prompts.size() < 6 && r.next(&l)) {
      auto j = nlohmann::json::parse(l.text);
      std::string p = j["prompt"].get<std::string>();
      std::vector<int32_t> t = d.tok->encode(p);
      if (t.size() > 48) t.erase(t.begin(), t.end() - 48);  // keep the end: the continuation point
      d.prompts.push_back(d.tok->decode(t));
      d.ids.push_back(t);
    }
    return d;
  }();
  return d;
}

std::vector<GenerationResult> run_batched(const std::vector<std::vector<int32_t>>& prompts, DecodeOptions o) {
  Demo& d = demo();
  size_t next = 0;
  std::vector<GenerationResult> out;
  generate_batched(
      *d.ctx, *d.target, o,
      [&](GenerationRequest* r) {
        if (next >= prompts.size()) return false;
        r->row = next;
        r->prompt = prompts[next++];
        return true;
      },
      [&](GenerationResult&& g) { out.push_back(std::move(g)); });
  return out;
}

std::string tmp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / (name + "-" + std::to_string(::getpid()))).string();
}

}  // namespace

TEST(GenerateBatch, ForwardBatchMatchesForward) {
  Demo& d = demo();
  const ModelConfig& cfg = d.target->config();
  const std::vector<int64_t> layers = {1, 5};
  // Two sequences: a prefill and a decode step after it, batched, vs one at a time.
  std::vector<KVCache> cb, cs;
  for (int i = 0; i < 2; ++i) {
    cb.push_back(KVCache::create(*d.ctx, cfg, 64));
    cs.push_back(KVCache::create(*d.ctx, cfg, 64));
  }
  std::vector<std::vector<int32_t>> step1 = {std::vector<int32_t>(d.ids[0].begin(), d.ids[0].begin() + 20),
                                             std::vector<int32_t>(d.ids[1].begin(), d.ids[1].begin() + 13)};
  std::vector<std::vector<int32_t>> step2 = {{d.ids[0][20], d.ids[0][21]}, {d.ids[1][13]}};
  for (const auto& step : {step1, step2}) {
    std::vector<KVCache*> ptrs = {&cb[0], &cb[1]};
    auto ob = d.target->forward_batch(*d.ctx, step, ptrs, layers, true);
    int64_t off = 0;
    for (int i = 0; i < 2; ++i) {
      const int64_t T = static_cast<int64_t>(step[i].size());
      auto os = d.target->forward(*d.ctx, cpu_tensor_i32(step[i], {T}), layers, true, &cs[i]);
      auto fb = to_f32_vector(ob.features.slice(off, off + T)), fs = to_f32_vector(os.features);
      auto hb = to_f32_vector(ob.final_hidden.slice(off, off + T)), hs = to_f32_vector(os.final_hidden);
      ASSERT_EQ(fb.size(), fs.size());
      for (size_t k = 0; k < fb.size(); ++k) ASSERT_NEAR(fb[k], fs[k], 1e-4 * (1 + std::fabs(fs[k]))) << k;
      for (size_t k = 0; k < hb.size(); ++k) ASSERT_NEAR(hb[k], hs[k], 1e-4 * (1 + std::fabs(hs[k]))) << k;
      EXPECT_EQ(cb[i].len, cs[i].len);
      off += T;
    }
  }
}

TEST(GenerateBatch, GreedyIdenticalForBatchSizes1And3) {
  Demo& d = demo();
  DecodeOptions o;
  o.max_new_tokens = 32;
  o.batch_size = 1;
  auto a = run_batched(d.ids, o);
  o.batch_size = 3;
  auto b = run_batched(d.ids, o);
  ASSERT_EQ(a.size(), d.ids.size());
  ASSERT_EQ(b.size(), d.ids.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].row, i);
    EXPECT_EQ(b[i].row, i);
    EXPECT_EQ(a[i].ids, b[i].ids) << "row " << i;
    EXPECT_EQ(a[i].ids.size(), 32u);
  }
  // Greedy batched output is the target's own argmax continuation: check row 0 against one-token forwards.
  KVCache c = KVCache::create(*d.ctx, d.target->config(), 128);
  std::vector<int64_t> none;
  std::vector<int32_t> seq = d.ids[0];
  auto out = d.target->forward(*d.ctx, cpu_tensor_i32(seq, {static_cast<int64_t>(seq.size())}), none, true, &c);
  Tensor h = out.final_hidden.slice(seq.size() - 1, seq.size());
  for (int t = 0; t < 8; ++t) {
    Tensor lg = d.ctx->empty(DType::F32, {1, d.target->config().vocab_size}), am = d.ctx->empty(DType::I32, {1});
    d.target->logits(*d.ctx, h, lg);
    d.ctx->argmax(lg, am);
    const int32_t tok = am.ptr<int32_t>()[0];
    EXPECT_EQ(tok, a[0].ids[t]) << t;
    h = d.target->forward(*d.ctx, cpu_tensor_i32({tok}, {1}), none, true, &c).final_hidden;
  }
}

TEST(GenerateBatch, SamplingReproducibleAndIndependentOfBatchSize) {
  Demo& d = demo();
  DecodeOptions o;
  o.max_new_tokens = 24;
  o.sampling.temperature = 0.9;
  o.sampling.top_p = 0.95;
  o.sampling.seed = 7;
  o.batch_size = 1;
  auto a = run_batched(d.ids, o);
  o.batch_size = 3;
  auto b = run_batched(d.ids, o);
  auto b2 = run_batched(d.ids, o);
  o.sampling.seed = 8;
  auto c = run_batched(d.ids, o);
  o.sampling.seed = 7;
  o.sampling.temperature = 0;
  auto g = run_batched(d.ids, o);
  int differ_seed = 0, differ_greedy = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].ids, b[i].ids) << "row " << i;
    EXPECT_EQ(b[i].ids, b2[i].ids) << "row " << i;
    differ_seed += a[i].ids != c[i].ids;
    differ_greedy += a[i].ids != g[i].ids;
  }
  EXPECT_GT(differ_seed, 0);
  EXPECT_GT(differ_greedy, 0);
}

TEST(GenerateBatch, EosStopsGeneration) {
  Demo& d = demo();
  DecodeOptions o;
  o.max_new_tokens = 24;
  o.batch_size = 4;
  auto free_run = run_batched(d.ids, o);
  // Make the 6th token of row 0 a stop id: row 0 must end right before its first occurrence, eos = true, and every
  // row must equal the prefix of its free run up to its first stop token.
  const int32_t stop = free_run[0].ids[5];
  o.eos_ids = {stop};
  auto stopped = run_batched(d.ids, o);
  for (size_t i = 0; i < free_run.size(); ++i) {
    const auto& f = free_run[i].ids;
    auto it = std::find(f.begin(), f.end(), stop);
    std::vector<int32_t> expect(f.begin(), it);
    EXPECT_EQ(stopped[i].ids, expect) << "row " << i;
    EXPECT_EQ(stopped[i].eos, it != f.end()) << "row " << i;
  }
  EXPECT_TRUE(stopped[0].eos);
  EXPECT_LE(stopped[0].ids.size(), 5u);
  // max_new_tokens counts the stop token: with a limit of 1 and the first token a stop id, nothing is generated.
  o.eos_ids = {free_run[1].ids[0]};
  o.max_new_tokens = 1;
  auto one = run_batched({d.ids[1]}, o);
  EXPECT_TRUE(one[0].eos);
  EXPECT_TRUE(one[0].ids.empty());
}

TEST(GenerateSampling, Rules) {
  std::vector<float> z = {0.0f, std::log(3.0f), -1e9f, 0.0f};
  SamplingOptions g;
  EXPECT_EQ(sample_token(z, g, 0, 0), 1);  // greedy
  SamplingOptions s;
  s.temperature = 1.0;
  s.seed = 3;
  int count[4] = {0, 0, 0, 0};
  const int n = 20000;
  for (int t = 0; t < n; ++t) ++count[sample_token(z, s, 5, t)];
  EXPECT_NEAR(count[1] / double(n), 0.6, 0.02);  // 3 / (1 + 3 + 1)
  EXPECT_NEAR(count[0] / double(n), 0.2, 0.02);
  EXPECT_EQ(count[2], 0);
  // top_p 0.5: the nucleus is {1} alone (p = 0.6 >= 0.5)
  s.top_p = 0.5;
  for (int t = 0; t < 200; ++t) EXPECT_EQ(sample_token(z, s, 5, t), 1);
  // top_p 0.7: {1, 0} (ties between 0 and 3 broken by id)
  s.top_p = 0.7;
  int c3 = 0;
  for (int t = 0; t < 2000; ++t) c3 += sample_token(z, s, 5, t) == 3;
  EXPECT_EQ(c3, 0);
  // same (seed, row, token) -> same draw
  s.top_p = 1.0;
  EXPECT_EQ(sample_token(z, s, 9, 17), sample_token(z, s, 9, 17));
}

TEST(GenerateJob, ResumeAfterInterruptionGivesTheSameFile) {
  Demo& d = demo();
  const std::string prompts = tmp_path("dflash-gen-prompts.jsonl"), full = tmp_path("dflash-gen-full.jsonl"),
                    torn = tmp_path("dflash-gen-torn.jsonl");
  {
    std::ofstream f(prompts);
    for (int i = 0; i < 4; ++i) f << nlohmann::json{{"prompt", d.prompts[i]}}.dump() << "\n";
    f << "not json\n";  // a bad row: skipped, counted
    f << nlohmann::json{{"prompt", d.prompts[4]}}.dump() << "\n";
  }
  GenerateOptions o;
  o.prompts = prompts;
  o.out = full;
  o.format = "raw";
  o.decode.max_new_tokens = 16;
  o.decode.batch_size = 2;
  o.decode.eos_ids = stop_token_ids(test::source_dir() + "/assets/demo/target", d.target->config(), d.tok.get());
  o.write_ids = true;
  o.progress = false;
  o.overwrite = true;
  GenerateSummary s = run_generate(*d.ctx, *d.target, d.tok, o);
  EXPECT_EQ(s.rows_read, 6);
  EXPECT_EQ(s.rows_written, 5);
  EXPECT_EQ(s.skipped.at("invalid_json"), 1);
  const std::string want = read_file(full);
  // The rows: indices 0,1,2,3,5 in order; completion = decode(completion_ids); raw prompt ids = tokens(prompt).
  std::vector<std::string> lines = read_lines(full);
  ASSERT_EQ(lines.size(), 5u);
  const int idx[5] = {0, 1, 2, 3, 5};
  for (int i = 0; i < 5; ++i) {
    auto j = nlohmann::json::parse(lines[i]);
    EXPECT_EQ(j["index"].get<int>(), idx[i]);
    const int pi = idx[i] == 5 ? 4 : idx[i];
    EXPECT_EQ(j["prompt"].get<std::string>(), d.prompts[pi]);
    EXPECT_EQ(j["prompt_ids"].get<std::vector<int32_t>>(), d.tok->encode(d.prompts[pi]));
    EXPECT_EQ(j["completion"].get<std::string>(), d.tok->decode(j["completion_ids"].get<std::vector<int32_t>>()));
    EXPECT_TRUE(j["finish_reason"] == "eos" || j["finish_reason"] == "length");
  }
  // Interrupted run: two rows and half of the third.
  const size_t cut2 = want.find('\n', want.find('\n') + 1) + 1;
  const size_t cut = cut2 + (want.find('\n', cut2) - cut2) / 2;
  write_file_atomic(torn, want.substr(0, cut));
  o.out = torn;
  o.overwrite = false;
  // Neither --resume nor --overwrite: an existing output is refused and left as it is.
  try {
    run_generate(*d.ctx, *d.target, d.tok, o);
    ADD_FAILURE() << "an existing output without --resume / --overwrite must be refused";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("--resume"), std::string::npos) << msg;
    EXPECT_NE(msg.find("--overwrite"), std::string::npos) << msg;
  }
  EXPECT_EQ(read_file(torn), want.substr(0, cut));
  o.resume = true;
  o.decode.batch_size = 3;  // a different batch size changes nothing
  GenerateSummary r = run_generate(*d.ctx, *d.target, d.tok, o);
  EXPECT_EQ(r.rows_existing, 2);
  EXPECT_EQ(r.rows_written, 3);
  EXPECT_EQ(read_file(torn), want);
  // A complete run resumed again writes nothing.
  GenerateSummary r2 = run_generate(*d.ctx, *d.target, d.tok, o);
  EXPECT_EQ(r2.rows_written, 0);
  EXPECT_EQ(r2.rows_existing, 5);
  EXPECT_EQ(read_file(torn), want);
  // --overwrite starts again and gives the same bytes.
  o.resume = false;
  o.overwrite = true;
  run_generate(*d.ctx, *d.target, d.tok, o);
  EXPECT_EQ(read_file(torn), want);
  std::filesystem::remove(prompts);
  std::filesystem::remove(full);
  std::filesystem::remove(torn);
}
