// model/target_stages.cpp — balancing a target's layers over consecutive stages (model/target_stages.h).
#include "model/target_stages.h"

#include <algorithm>
#include <limits>

#include "core/error.h"
#include "model/target.h"  // target_layer_params

namespace dflash {

int64_t target_layer_cost(const ModelConfig& cfg, int64_t l) {
  const TargetParams p = target_layer_params(cfg, l);
  return p.total + p.active;
}

std::vector<TargetStage> split_target_layers(const ModelConfig& cfg, int S) {
  const int64_t L = cfg.num_hidden_layers;
  DFLASH_CHECK(S >= 1, "--target-split ", S, ": give a number of stages >= 1");
  DFLASH_CHECK(S <= L, "--target-split ", S, ": the target has only ", L, " layers (one stage holds at least one)");
  // prefix[l] = cost of layers 0 .. l-1, the embedding before layer 0 and lm_head + final norm after the last layer
  const int64_t V = cfg.vocab_size, H = cfg.hidden_size;
  std::vector<int64_t> prefix(static_cast<size_t>(L) + 1, 0);
  for (int64_t l = 0; l < L; ++l) prefix[l + 1] = prefix[l] + target_layer_cost(cfg, l);
  auto cost = [&](int64_t a, int64_t b) {  // stage of layers [a, b)
    return prefix[b] - prefix[a] + (a == 0 ? V * H : 0) + (b == L ? 2 * V * H + H : 0);
  };
  // best[s][b]: the smallest max cost of s stages over layers [0, b); cut[s][b]: where the last of them starts
  constexpr int64_t kInf = std::numeric_limits<int64_t>::max();
  std::vector<std::vector<int64_t>> best(static_cast<size_t>(S) + 1, std::vector<int64_t>(L + 1, kInf));
  std::vector<std::vector<int64_t>> cut(static_cast<size_t>(S) + 1, std::vector<int64_t>(L + 1, 0));
  best[0][0] = 0;
  for (int s = 1; s <= S; ++s)
    for (int64_t b = s; b <= L; ++b)
      for (int64_t a = s - 1; a < b; ++a) {  // the earliest start wins ties (strict <)
        if (best[s - 1][a] == kInf) continue;
        const int64_t m = std::max(best[s - 1][a], cost(a, b));
        if (m < best[s][b]) {
          best[s][b] = m;
          cut[s][b] = a;
        }
      }
  std::vector<TargetStage> stages(static_cast<size_t>(S));
  int64_t b = L;
  for (int s = S; s >= 1; --s) {
    stages[static_cast<size_t>(s) - 1] = {cut[s][b], b};
    b = cut[s][b];
  }
  return stages;
}

}  // namespace dflash
