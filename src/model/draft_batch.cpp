// model/draft_batch.cpp — see draft_batch.h.
#include "model/draft_batch.h"

#include <algorithm>
#include <cmath>

namespace dflash {

std::vector<int32_t> candidate_anchors(std::span<const uint8_t> m) {
  std::vector<int32_t> c;
  const int64_t S = static_cast<int64_t>(m.size());
  for (int64_t a = 0; a + 1 < S; ++a)  // a <= S-2
    if (m[a] && m[a + 1]) c.push_back(static_cast<int32_t>(a));
  return c;
}

std::vector<int32_t> sample_anchors(std::span<const uint8_t> loss_mask, int64_t max_anchors, Rng& rng) {
  std::vector<int32_t> c = candidate_anchors(loss_mask);
  const int64_t n = std::min<int64_t>(max_anchors, static_cast<int64_t>(c.size()));
  for (int64_t i = 0; i < n; ++i) {  // partial Fisher-Yates: the first n are a uniform sample without replacement
    const int64_t j = i + static_cast<int64_t>(rng.below(static_cast<uint64_t>(c.size() - i)));
    std::swap(c[i], c[j]);
  }
  c.resize(static_cast<size_t>(std::max<int64_t>(n, 0)));
  std::sort(c.begin(), c.end());
  return c;
}

double default_gamma(int64_t B) { return B >= 13 ? 7.0 : (B >= 9 ? 5.0 : 4.0); }

DraftBatch make_draft_batch(std::span<const int32_t> tokens, std::span<const uint8_t> loss_mask,
                            std::span<const int32_t> anchors, int64_t n_blocks, int64_t B, int32_t mask_token_id,
                            double gamma, double dpace_alpha) {
  const int64_t S = static_cast<int64_t>(tokens.size());
  DFLASH_CHECK(static_cast<int64_t>(loss_mask.size()) == S, "draft batch: ", S, " tokens but ", loss_mask.size(),
               " loss-mask entries");
  DFLASH_CHECK(n_blocks >= static_cast<int64_t>(anchors.size()), "draft batch: ", anchors.size(),
               " anchors exceed n_blocks ", n_blocks);
  DFLASH_CHECK(dpace_alpha >= 0 && dpace_alpha <= 1, "draft batch: dpace_alpha ", dpace_alpha,
               " outside (0, 1] (0 = the fixed weights)");
  DraftBatch b;
  b.dpace_alpha = dpace_alpha;
  b.S = S;
  b.N = n_blocks;
  b.B = B;
  b.anchors.assign(static_cast<size_t>(n_blocks), 0);
  b.valid.assign(static_cast<size_t>(n_blocks), 0);
  b.block_ids.assign(static_cast<size_t>(n_blocks * B), mask_token_id);
  b.block_pos.assign(static_cast<size_t>(n_blocks * B), 0);
  for (size_t j = 0; j < anchors.size(); ++j) {
    const int32_t a = anchors[j];
    DFLASH_CHECK(a >= 0 && a <= S - 2, "draft batch: anchor ", a, " outside [0, S-2 = ", S - 2, "]");
    DFLASH_CHECK(j == 0 || anchors[j - 1] < a, "draft batch: anchors must be sorted and distinct");
    b.anchors[j] = a;
    b.valid[j] = 1;
  }
  for (int64_t j = 0; j < n_blocks; ++j) {
    const int32_t a = b.anchors[j];
    if (b.valid[j]) b.block_ids[j * B] = tokens[a];
    for (int64_t i = 0; i < B; ++i) {
      b.block_pos[j * B + i] = static_cast<int32_t>(a + i);
      const int64_t p = a + i;
      const bool m = b.valid[j] && i > 0 && p < S && loss_mask[p];
      if (!m) continue;
      const double w = dpace_alpha == 0 && gamma > 0 ? std::exp(-static_cast<double>(i - 1) / gamma) : 1.0;
      b.rows.push_back(static_cast<int32_t>(j * B + i));
      b.labels.push_back(tokens[p]);
      b.slots.push_back(static_cast<int32_t>(i));
      b.teacher_pos.push_back(static_cast<int32_t>(p - 1));
      b.prev.push_back(tokens[p - 1]);
      b.weights.push_back(static_cast<float>(w));
      b.sum_w += static_cast<float>(w);
    }
  }
  return b;
}

DraftInputs upload_draft_batch(Context& ctx, const DraftBatch& b, const Tensor& features,
                               const Tensor& teacher_final_hidden) {
  DraftInputs in;
  in.S = b.S;
  in.N = b.N;
  in.features = features;
  std::vector<int32_t> cp(static_cast<size_t>(b.S));
  for (int64_t p = 0; p < b.S; ++p) cp[p] = static_cast<int32_t>(p);
  const int64_t NB = b.N * b.B, R = static_cast<int64_t>(b.rows.size());
  in.ctx_pos = ctx.to_device(cpu_tensor_i32(cp, {b.S}));
  in.block_ids = ctx.to_device(cpu_tensor_i32(b.block_ids, {NB}));
  in.block_pos = ctx.to_device(cpu_tensor_i32(b.block_pos, {NB}));
  in.anchors = ctx.to_device(cpu_tensor_i32(b.anchors, {b.N}));
  Tensor valid = cpu_empty(DType::U8, {b.N});
  std::copy(b.valid.begin(), b.valid.end(), valid.ptr<uint8_t>());
  in.valid = ctx.to_device(valid);
  in.rows = ctx.to_device(cpu_tensor_i32(b.rows, {R}));
  in.labels = ctx.to_device(cpu_tensor_i32(b.labels, {R}));
  in.weights = ctx.to_device(cpu_tensor(b.weights, {R}));
  in.prev = ctx.to_device(cpu_tensor_i32(b.prev, {R}));
  in.dpace_alpha = b.dpace_alpha;
  if (teacher_final_hidden.defined()) {
    in.teacher_h = ctx.empty(teacher_final_hidden.dtype, {R, teacher_final_hidden.dim(-1)});
    ctx.gather_rows(in.teacher_h, teacher_final_hidden, ctx.to_device(cpu_tensor_i32(b.teacher_pos, {R})));
  }
  return in;
}

}  // namespace dflash
