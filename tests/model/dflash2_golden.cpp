// tests/model/dflash2_golden.cpp — the DFlash2 drafter's inference path against the served model as vLLM computes it
// (qwen3_dflash2.py, read in float64 PyTorch by tools/ref_dflash2.py): an export loaded by load_exported_drafter, its
// draft cache filled from target features (make_cache, extend_cache), one block drafted (draft_block), and the
// selector's candidates, path scores and greedy path (select_path), against tests/golden/dflash2_served (written by
// `python3 tools/ref_dflash2.py --make-golden tests/golden/dflash2_served`). Skipped while that golden is absent.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/context.h"
#include "common/test_util.h"
#include "core/fs.h"
#include "io/safetensors.h"
#include "model/drafter.h"
#include "model/export.h"

using namespace dflash;
using dflash::test::rel_err;
using dflash::test::to_f64;

namespace {

std::string golden_dir() { return test::source_dir() + "/tests/golden/dflash2_served"; }

// The rows of a JSON matrix (or the entries of a vector), flattened.
std::vector<double> flat(const nlohmann::json& j) {
  std::vector<double> v;
  if (!j.is_array()) return {j.get<double>()};
  for (const auto& x : j) {
    const std::vector<double> r = flat(x);
    v.insert(v.end(), r.begin(), r.end());
  }
  return v;
}

std::vector<int32_t> iota_i32(int64_t n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<int32_t>(i);
  return v;
}

// One device's draft of the golden block: h within `tol` (relative), the candidates and the path exactly, the
// candidates' logits and the path rows' pair scores within `tol`.
void check_served_golden(const std::string& device, double tol) {
  const std::string dir = golden_dir();
  auto ctx = make_context(device, {.threads = 2});
  auto drafter = load_exported_drafter(*ctx, dir + "/export");
  const DrafterConfig& cfg = drafter->config();
  ASSERT_TRUE(cfg.dflash2());
  const auto want = nlohmann::json::parse(read_file(dir + "/expected.json"));
  auto in = SafetensorsFile::open(dir + "/inputs.safetensors");
  const DType dt = ctx->compute_dtype(), pt = ctx->param_dtype();
  const Tensor features = ctx->to_device(in->view("features"), dt);
  const Tensor embed = ctx->to_device(in->view("embed"), dt), lm_head = ctx->to_device(in->view("lm_head"), dt);
  const int32_t anchor = in->view("anchor_token").ptr<int32_t>()[0];
  const int64_t S = features.rows(), B = cfg.block_size, K = cfg.selector_top_k, n = B - 1;
  ASSERT_EQ(anchor, want["anchor_token"].get<int32_t>());
  ASSERT_EQ(S, want["S"].get<int64_t>());

  // the context in two appends (as committed positions arrive when serving), then the block at position S
  Drafter::Cache cache = drafter->make_cache(*ctx, S + B);
  drafter->extend_cache(*ctx, cache, features.slice(0, 5));
  drafter->extend_cache(*ctx, cache, features.slice(5, S));
  ASSERT_EQ(cache.len, S);
  const Tensor h = drafter->draft_block(*ctx, cache, anchor, embed);
  EXPECT_LT(rel_err(to_f64(ctx->to_host(h, false)), flat(want["h"])), tol) << device << ": final hidden";
  const Tensor hs = h.slice(1, B);  // slots 1..B-1, the rows the selector drafts

  // the candidates: the top-k logits of each slot, descending, ties to the lower id (the loss head's pass, as
  // select_path takes them)
  LossArgs la;
  la.h = hs;
  la.lm_head = lm_head;
  la.rows = ctx->to_device(cpu_tensor_i32(iota_i32(n), {n}));
  la.labels = ctx->to_device(cpu_tensor_i32(std::vector<int32_t>(static_cast<size_t>(n), 0), {n}));
  la.weights = ctx->to_device(cpu_tensor(std::vector<float>(static_cast<size_t>(n), 0.0f), {n}));
  la.topk = K;
  la.topk_ids = ctx->empty(DType::I32, {n, K});
  la.topk_logits = ctx->empty(pt, {n, K});
  ctx->lm_head_loss(la);
  const Tensor ids = ctx->to_host(la.topk_ids, false);
  std::vector<int32_t> cand(ids.ptr<int32_t>(), ids.ptr<int32_t>() + n * K), cand_want;
  for (double x : flat(want["candidates"])) cand_want.push_back(static_cast<int32_t>(x));
  ASSERT_EQ(cand, cand_want) << device << ": candidates of slots 1.." << n;
  EXPECT_LT(rel_err(to_f64(ctx->to_host(la.topk_logits, false)), flat(want["candidate_logits"])), tol)
      << device << ": candidates' logits";

  // the pair scores of the rows the greedy walk reads: slot t after its predecessor on the path
  std::vector<int32_t> prev;
  std::vector<double> scores_want;
  for (const auto& r : want["path_rows"]) {
    prev.push_back(r["prev"].get<int32_t>());
    const std::vector<double> s = flat(r["scores"]);
    scores_want.insert(scores_want.end(), s.begin(), s.end());
  }
  ASSERT_EQ(static_cast<int64_t>(prev.size()), n);
  Tensor g = ctx->empty(dt, {n, cfg.selector_rank});
  ctx->linear(hs, drafter->params().get("candidate_selector.hidden_projection.weight").compute, nullptr, g);
  SelectorArgs sa;
  sa.g = g;
  sa.rows = la.rows;
  sa.prev = ctx->to_device(cpu_tensor_i32(prev, {n}));
  sa.cand = la.topk_ids;
  sa.cand_logit = la.topk_logits;
  sa.pred_cb = drafter->params().get("candidate_selector.predecessor_codebook").compute;
  sa.succ_cb = drafter->params().get("candidate_selector.successor_codebook").compute;
  Tensor scores = ctx->empty(pt, {n, K});
  ctx->candidate_selector(sa, scores);
  EXPECT_LT(rel_err(to_f64(ctx->to_host(scores, false)), scores_want), tol) << device << ": path rows' pair scores";

  // the greedy path from the anchor
  std::vector<int32_t> path_want, argmax_want;
  for (double x : flat(want["path"])) path_want.push_back(static_cast<int32_t>(x));
  for (double x : flat(want["argmax_path"])) argmax_want.push_back(static_cast<int32_t>(x));
  EXPECT_NE(path_want, argmax_want) << "the golden's pair terms change no choice: it tests the walk weakly";
  EXPECT_EQ(drafter->select_path(*ctx, hs, anchor, lm_head), path_want) << device << ": greedy path";
}

}  // namespace

// fp64: the reference is float64 over the same F32 tensors (RoPE's F32 inverse frequencies bound the agreement).
TEST(DFlash2Served, DraftBlockAndPathMatchTheServedModelInFp64) {
  if (!std::filesystem::exists(golden_dir() + "/expected.json"))
    GTEST_SKIP() << "tests/golden/dflash2_served is absent: write it with `python3 tools/ref_dflash2.py "
                    "--make-golden tests/golden/dflash2_served` (needs torch; the GPU machine has it)";
  check_served_golden("cpu64", 1e-6);
}

// fp32: the golden separates every order (top-k ranks, the walk's choices) by 0.05, far above fp32's error.
TEST(DFlash2Served, DraftBlockAndPathMatchTheServedModelInFp32) {
  if (!std::filesystem::exists(golden_dir() + "/expected.json"))
    GTEST_SKIP() << "tests/golden/dflash2_served is absent: write it with `python3 tools/ref_dflash2.py "
                    "--make-golden tests/golden/dflash2_served` (needs torch; the GPU machine has it)";
  check_served_golden("cpu", 1e-4);
}
