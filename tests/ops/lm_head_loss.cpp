// tests/ops/lm_head_loss.cpp — the fused lm_head + loss (Context::lm_head_loss) on the CPU: DFlash2's candidates,
// the top-k of each row's logits. (Its loss and gradients: tests/model/drafter.cpp, tests/train/dpace.cpp.)
#include <gtest/gtest.h>

#include <vector>

#include "backend/context.h"

using namespace dflash;

// The candidates: the topk largest logits of each row in descending order, ties to the lower id.
TEST(LmHeadLossTopK, CandidatesAreTheLargestLogitsTiesToTheLowerId) {
  auto ctx = make_context("cpu");
  const int64_t V = 12, H = 2, K = 4;
  // lm_head rows [v, 0] with h = [1, 0]: logit v = w[v] (ties: ids 3, 7 and 9 share the largest value)
  std::vector<float> w = {0, 1, 2, 5, -1, 4, 3, 5, 0, 5, 2, 1}, lm(V * H, 0.0f);
  for (int64_t v = 0; v < V; ++v) lm[v * H] = w[v];
  LossArgs la;
  la.h = cpu_tensor(std::vector<float>{1, 0}, {1, H});
  la.lm_head = cpu_tensor(lm, {V, H});
  la.rows = cpu_tensor_i32({0}, {1});
  la.labels = cpu_tensor_i32({5}, {1});
  la.weights = cpu_tensor(std::vector<float>{1}, {1});
  la.topk = K;
  la.topk_ids = cpu_empty(DType::I32, {1, K});
  la.topk_logits = cpu_empty(DType::F32, {1, K});
  LossStats st = ctx->lm_head_loss(la);
  const int32_t* ids = la.topk_ids.ptr<int32_t>();
  EXPECT_EQ(std::vector<int32_t>(ids, ids + K), (std::vector<int32_t>{3, 7, 9, 5}));
  const float* z = la.topk_logits.ptr<float>();
  EXPECT_EQ(std::vector<float>(z, z + K), (std::vector<float>{5, 5, 5, 4}));
  EXPECT_EQ(st.correct[0], 0);  // argmax 3, label 5
}
