// tests/train/step_golden.cpp
// One whole drafter training step (forward, backward, clip, AdamW) against an independent PyTorch implementation
// of the spec (tools/ref_dflash.py, fp64; golden files in tests/golden/step_qwen3).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "backend/context.h"
#include "core/fs.h"
#include "io/safetensors.h"
#include "model/draft_batch.h"
#include "model/drafter.h"
#include "model/export.h"
#include "model/target.h"
#include "common/test_util.h"
#include "model/draft_batch.h"
#include "train/optimizer.h"

using namespace dflash;
using dflash::test::rel_err;
using dflash::test::to_f64;

namespace {

struct StepGolden {
  std::string dir = test::source_dir() + "/tests/golden/step_qwen3";
  nlohmann::json cfg;
  std::shared_ptr<SafetensorsFile> cs, init;
  StepGolden() {
    cfg = nlohmann::json::parse(std::ifstream(dir + "/config.json"));
    cs = SafetensorsFile::open(dir + "/case.safetensors");
  }
  DrafterConfig drafter_config(const ModelConfig& t) const {
    DrafterConfig c = DrafterConfig::for_target(t, cfg["drafter"]["num_hidden_layers"], cfg["block_size"],
                                                cfg["target_layer_ids"].get<std::vector<int64_t>>(),
                                                cfg["mask_token_id"]);
    c.intermediate_size = cfg["drafter"]["intermediate_size"];
    c.num_heads = cfg["drafter"]["num_attention_heads"];
    c.num_kv_heads = cfg["drafter"]["num_key_value_heads"];
    c.head_dim = cfg["drafter"]["head_dim"];
    return c;
  }
  template <class T>
  std::vector<T> vec(const std::string& name) const {
    Tensor t = cs->view(name);
    return std::vector<T>(static_cast<const T*>(t.data), static_cast<const T*>(t.data) + t.numel());
  }
};

void run_step(const std::string& expected_file, float kl_weight) {
  StepGolden g;
  auto ctx = make_context("cpu");
  auto target = Target::load(g.dir + "/" + g.cfg["target_dir"].get<std::string>(), *ctx);
  DrafterConfig dc = g.drafter_config(target->config());
  Drafter drafter(*ctx, dc, 1);
  load_params(*ctx, drafter.params(), WeightStore::open(g.dir + "/init.safetensors"));
  auto ex = SafetensorsFile::open(g.dir + "/" + expected_file);
  const int64_t B = dc.block_size;
  const double gamma = g.cfg["gamma"];

  // draft batches from the raw sequences; compare with the spec-derived expectations in the case file
  std::vector<DraftBatch> batches;
  std::vector<Tensor> feats, finals;
  double sum_w = 0;
  for (int s = 0; s < 2; ++s) {
    const std::string p = cat("seq", s, ".");
    auto ids = g.vec<int32_t>(p + "input_ids");
    auto mask = g.vec<uint8_t>(p + "loss_mask");
    auto anchors = g.vec<int32_t>(p + "anchors");
    auto valid = g.vec<uint8_t>(p + "valid");
    std::vector<int32_t> real;
    for (size_t j = 0; j < anchors.size(); ++j)
      if (valid[j]) real.push_back(anchors[j]);
    DraftBatch b = make_draft_batch(ids, mask, real, static_cast<int64_t>(anchors.size()), B, dc.mask_token_id, gamma);
    auto want_ids = g.vec<int32_t>(p + "block_input_ids"), want_pos = g.vec<int32_t>(p + "positions");
    for (size_t j = 0; j < anchors.size(); ++j)  // padding blocks' inputs are don't-cares
      for (int64_t i = 0; valid[j] && i < B; ++i) {
        EXPECT_EQ(b.block_ids[j * B + i], want_ids[j * B + i]) << p << " block " << j << " slot " << i;
        EXPECT_EQ(b.block_pos[j * B + i], want_pos[j * B + i]) << p << " block " << j << " slot " << i;
      }
    auto W = g.vec<float>(p + "weights");
    auto Y = g.vec<int32_t>(p + "labels");
    std::vector<float> w_dense(W.size(), 0.0f);
    for (size_t r = 0; r < b.rows.size(); ++r) {
      w_dense[b.rows[r]] = b.weights[r];
      EXPECT_EQ(b.labels[r], Y[b.rows[r]]) << p << " row " << b.rows[r];
    }
    for (size_t i = 0; i < W.size(); ++i) EXPECT_NEAR(w_dense[i], W[i], 1e-6) << p << " weight " << i;
    sum_w += b.sum_w;
    // our target's features equal the reference's
    std::vector<int64_t> lids = dc.target_layer_ids;
    auto out = target->forward(*ctx, cpu_tensor_i32(ids, {static_cast<int64_t>(ids.size())}), lids, true);
    EXPECT_LT(rel_err(to_f64(out.features), to_f64(g.cs->view(p + "features"))), 2e-5) << p;
    EXPECT_LT(rel_err(to_f64(out.final_hidden), to_f64(g.cs->view(p + "target_final_hidden"))), 2e-5) << p;
    feats.push_back(ctx->to_device(g.cs->view(p + "features")));
    finals.push_back(ctx->to_device(g.cs->view(p + "target_final_hidden")));
    batches.push_back(std::move(b));
  }
  EXPECT_NEAR(sum_w, ex->view("sum_w").ptr<float>()[0], 1e-5);

  // forward + backward, globally normalised over both sequences
  double loss = 0;
  std::vector<double> correct(B, 0), count(B, 0);
  for (int s = 0; s < 2; ++s) {
    DraftInputs in = upload_draft_batch(*ctx, batches[s], feats[s], finals[s]);
    auto st = drafter.forward_backward(*ctx, in, target->weights().embed, target->weights().lm_head, kl_weight,
                                       static_cast<float>(1.0 / sum_w), true);
    loss += st.loss_sum / sum_w;
    for (size_t r = 0; r < st.correct.size(); ++r) {
      correct[batches[s].slots[r]] += st.correct[r];
      count[batches[s].slots[r]] += 1;
    }
    // drafter logits
    Tensor h = drafter.forward_hidden(*ctx, in, target->weights().embed);
    Tensor lg = ctx->empty(DType::F32, {h.rows(), dc.vocab_size});
    ctx->linear(h, target->weights().lm_head, nullptr, lg);
    auto want = to_f64(ex->view(cat("logits.seq", s)));
    auto got = to_f64(lg);
    std::vector<double> got_valid, want_valid;  // padding blocks: the reference's rows are 0 there; ours are not
    for (int64_t j = 0; j < batches[s].N; ++j)
      if (batches[s].valid[j])
        for (int64_t r = j * B * dc.vocab_size; r < (j + 1) * B * dc.vocab_size; ++r) {
          got_valid.push_back(got[r]);
          want_valid.push_back(want[r]);
        }
    EXPECT_LT(rel_err(got_valid, want_valid), 1e-5) << "logits seq" << s;
  }
  EXPECT_NEAR(loss, ex->view("loss").ptr<float>()[0], 1e-5 * std::fabs(loss));
  auto acc = to_f64(ex->view("acc")), cnt = to_f64(ex->view("count"));
  for (int64_t i = 0; i < B; ++i) {
    EXPECT_EQ(count[i], cnt[i]) << "slot " << i;
    EXPECT_NEAR(count[i] ? correct[i] / count[i] : 0.0, acc[i], 1e-6) << "slot " << i;
  }
  for (auto& p : drafter.params().all())
    EXPECT_LT(rel_err(to_f64(p.grad), to_f64(ex->view("grad." + p.name))), 1e-4) << p.name;
  const double gsq = global_grad_sq(*ctx, drafter.params());
  EXPECT_NEAR(std::sqrt(gsq), ex->view("grad_norm").ptr<float>()[0], 1e-4 * std::sqrt(gsq));

  // clip + AdamW (weight decay 0). The first Adam step moves each weight by about lr * sign(g): allow the sign of
  // gradients within fp32 noise of zero to differ.
  OptimConfig oc;
  oc.lr = g.cfg["optimizer"]["lr"];
  oc.max_grad_norm = g.cfg["optimizer"]["max_grad_norm"];
  auto grads_before = std::vector<std::vector<double>>();
  for (auto& p : drafter.params().all()) grads_before.push_back(to_f64(p.grad));
  optimizer_step(*ctx, drafter.params(), oc, oc.lr, 1, gsq);
  size_t k = 0;
  for (auto& p : drafter.params().all()) {
    auto got = to_f64(p.master), want = to_f64(ex->view("after." + p.name)), gr = grads_before[k++];
    for (size_t i = 0; i < got.size(); ++i) {
      const double tol = std::fabs(gr[i]) < 1e-6 ? 2.1 * oc.lr : 1e-3 * oc.lr + 1e-6 * std::fabs(want[i]);
      ASSERT_NEAR(got[i], want[i], tol) << p.name << "[" << i << "] grad " << gr[i];
    }
  }
}

}  // namespace

TEST(StepGolden, CrossEntropyStepMatchesReference) { run_step("expected_ce.safetensors", 0.0f); }
TEST(StepGolden, SoftLabelStepMatchesReference) { run_step("expected_kl.safetensors", 0.15f); }

// Case C11: the export of the step golden's initial drafter (tests/golden/export_qwen3, committed) is what
// export_drafter writes today, byte for byte; tools/check_export.py (run where PyTorch exists) loads that directory
// with the independent reference implementation and checks it gives the reference logits.
// DFLASH_UPDATE_GOLDEN=1 rewrites the committed directory.
TEST(StepGolden, ExportOfTheInitialDrafterIsReproduced) {
  StepGolden g;
  auto ctx = make_context("cpu");
  ModelConfig tc = load_model_config(g.dir + "/" + g.cfg["target_dir"].get<std::string>());
  DrafterConfig dc = g.drafter_config(tc);
  Drafter drafter(*ctx, dc, 1);
  load_params(*ctx, drafter.params(), WeightStore::open(g.dir + "/init.safetensors"));
  const std::string golden = test::source_dir() + "/tests/golden/export_qwen3";
  const nlohmann::json training = {{"source", "tests/golden/step_qwen3/init.safetensors"}};
  if (std::getenv("DFLASH_UPDATE_GOLDEN")) export_drafter(*ctx, golden, dc, drafter.params(), training);
  const std::string tmp = cat("/tmp/dflash_export_", getpid());
  export_drafter(*ctx, tmp, dc, drafter.params(), training);
  EXPECT_EQ(read_file(tmp + "/config.json"), read_file(golden + "/config.json"));
  auto a = WeightStore::open(tmp), b = WeightStore::open(golden);
  EXPECT_EQ(a.names(), b.names());
  for (const auto& n : a.names()) {
    Tensor x = a.view(n), y = b.view(n);
    ASSERT_EQ(x.nbytes(), y.nbytes()) << n;
    EXPECT_EQ(std::memcmp(x.data, y.data, x.nbytes()), 0) << n;
  }
  std::filesystem::remove_all(tmp);
}
