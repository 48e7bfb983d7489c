// tests/common/drafter_fixture.h — a tiny drafter on fixed random inputs for the drafter tests (tests/model/drafter.cpp,
// tests/model/dflash2_drafter.cpp): its config, one sequence's draft batch (anchors 5, 8, 12, 18 of 21 tokens: a block
// running past the end and a padding block), the loss, and every parameter's gradient against central differences.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "backend/context.h"
#include "common/test_util.h"
#include "model/draft_batch.h"
#include "model/drafter.h"

namespace dflash::test {

inline DrafterConfig tiny_drafter_config() {
  DrafterConfig c;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.vocab_size = 40;
  c.block_size = 4;
  c.target_layer_ids = {0, 2};
  c.num_target_layers = 4;
  c.mask_token_id = 39;
  c.rope_theta = 100.0;
  return c;
}

struct DrafterFixture {
  // How the parameters leave their init: Norms (the RMSNorm weights ~ 1 + N(0, 0.2), so that their gradients
  // matter), All (every parameter + N(0, 0.15), norms N(0, 0.2): DFlash2's identity convolutions and zero successor
  // codebook too), None (as initialised).
  enum class Perturb { Norms, All, None };
  std::unique_ptr<Context> ctx;
  DrafterConfig cfg;
  std::unique_ptr<Drafter> drafter;
  Tensor embed, lm_head, features, teacher;
  DraftBatch batch;
  DraftInputs in;
  float selector_alpha = 1.0f;  // DFlash2: the selector loss's weight in loss() and fd_gradients()
  explicit DrafterFixture(const std::string& device, DrafterConfig c = tiny_drafter_config(), double dpace_alpha = 0,
                          Perturb perturb = Perturb::Norms)
      : cfg(std::move(c)) {
    ctx = make_context(device, {.threads = 2});
    const DType dt = ctx->compute_dtype();
    drafter = std::make_unique<Drafter>(*ctx, cfg, 1234, 0.3);
    int idx = 0;
    for (auto& p : drafter->params().all()) {
      const bool norm = p.shape.size() == 1;
      if (perturb == Perturb::None || (perturb == Perturb::Norms && !norm)) continue;
      if (perturb == Perturb::Norms) {
        Tensor t = randn(p.shape, 500 + idx++, 0.2, DType::F64);
        for (double& x : t.span<double>()) x += 1.0;
        ctx->copy(p.master, ctx->to_device(t, p.master.dtype));
        continue;
      }
      Tensor t = randn(p.shape, 700 + idx++, norm ? 0.2 : 0.15, DType::F64);
      const std::vector<double> m = to_f64(p.master);
      for (int64_t i = 0; i < t.numel(); ++i) t.ptr<double>()[i] += m[i];
      ctx->copy(p.master, ctx->to_device(t, p.master.dtype));
    }
    drafter->params().sync_compute(*ctx);
    const int64_t S = 21, H = cfg.hidden_size, V = cfg.vocab_size;
    embed = ctx->to_device(randn({V, H}, 1, 1.0, DType::F64), dt);
    lm_head = ctx->to_device(randn({V, H}, 2, 0.5, DType::F64), dt);
    features = ctx->to_device(randn({S, cfg.nf() * H}, 3, 1.0, DType::F64), dt);
    teacher = ctx->to_device(randn({S, H}, 4, 1.0, DType::F64), dt);
    std::vector<int32_t> tokens(S);
    std::vector<uint8_t> mask(S, 0);
    for (int64_t p = 0; p < S; ++p) tokens[p] = static_cast<int32_t>((p * 7 + 3) % 38);
    for (int64_t p = 5; p < S; ++p) mask[p] = p == 11 ? 0 : 1;
    std::vector<int32_t> anchors = {5, 8, 12, 18};  // 18: block runs past S-1; one padding block added
    batch = make_draft_batch(tokens, mask, anchors, 5, cfg.block_size, cfg.mask_token_id, 7.0, dpace_alpha);
    in = upload_draft_batch(*ctx, batch, features, teacher);
  }
  double loss(float kl) {
    drafter->params().sync_compute(*ctx);
    auto st = drafter->forward_backward(*ctx, in, embed, lm_head, kl, 1.0f, false, false, selector_alpha);
    return st.loss_sum / batch.sum_w;
  }
};

// Every parameter's gradient against central differences of the loss (fp64 backend): 12 elements per parameter,
// drawn among those with a nonzero gradient (a codebook's gradient lives in the rows of the predecessors and
// candidates only). With selector_alpha 0 the selector's parameters get no gradient and are skipped.
inline void expect_fd_gradients(DrafterFixture& f, float kl) {
  SCOPED_TRACE(testing::Message() << "selector_alpha " << f.selector_alpha << " kl " << kl);
  f.drafter->params().zero_grad(*f.ctx);
  f.drafter->forward_backward(*f.ctx, f.in, f.embed, f.lm_head, kl, static_cast<float>(1.0 / f.batch.sum_w), true,
                              false, f.selector_alpha);
  Rng pick(9, RngPurpose::Test);
  for (auto& p : f.drafter->params().all()) {
    if (f.selector_alpha == 0 && p.name.rfind("candidate_selector.", 0) == 0) continue;
    std::vector<double> g = to_f64(p.grad);
    ASSERT_GT(max_abs(g), 1e-8) << p.name << " has an all-zero gradient";
    double* w = p.master.ptr<double>();
    std::vector<int64_t> nz;
    for (int64_t i = 0; i < p.master.numel(); ++i)
      if (g[i] != 0) nz.push_back(i);
    const int checks = static_cast<int>(std::min<int64_t>(static_cast<int64_t>(nz.size()), 12));
    for (int c = 0; c < checks; ++c) {
      const int64_t i = nz[pick.below(static_cast<uint64_t>(nz.size()))];
      const double w0 = w[i], h = 1e-5;
      w[i] = w0 + h;
      const double lp = f.loss(kl);
      w[i] = w0 - h;
      const double lm = f.loss(kl);
      w[i] = w0;
      const double fd = (lp - lm) / (2 * h);
      EXPECT_NEAR(g[i], fd, 1e-7 + 1e-5 * std::fabs(fd)) << p.name << "[" << i << "]";
    }
  }
}

}  // namespace dflash::test
