// bench/bench_select.cpp — DFlash2's drafting cost at serving time (issue "DFlash2 drafters": the selector's top-k and
// pair scoring per block at most 10% of a drafter forward), at Qwen3-8B drafter shapes on "cuda": H 4096, 5 layers,
// 32/8 heads, d 128, intermediate 12288, V 151936, nf 5, B 16 (--B), a draft cache of --ctx context positions.
// Per block, timed with a synchronisation after each part (the eval loop's order, eval/tau.cpp):
//   forward:  Drafter::draft_block (the block through the layers, the final norm)            -> [B, H]
//   argmax:   DFlash's draft: the target's lm_head on slots 1..B-1 and the argmax             (eval/tau.cpp)
//   select:   DFlash2's draft: Drafter::select_path (top-k of the lm_head's logits, the lattice of pair scores in
//             one selector call, the greedy walk on the host)
// Reported: the medians in ms, select / forward and select / (forward + argmax).
//
//   bench_select [--ctx 2048] [--B 16] [--reps 50] [--layers 5] [--seed 1] [--device cuda]
#include <cstdio>
#include <string>
#include <vector>

#include "bench_util.h"
#include "model/drafter.h"

using namespace dflash;
using namespace bench;

int main(int argc, char** argv) {
  try {
    const Args args(argc, argv);
    const int64_t ctxn = args.i("ctx", 2048), B = args.i("B", 16), reps = args.i("reps", 50);
    const int64_t H = 4096, L = args.i("layers", 5), V = 151936, nf = 5;
    const uint64_t seed = static_cast<uint64_t>(args.i("seed", 1));
    const std::string device = args.s("device", "cuda");
    if (!device_available(device, "bench_select")) return 0;
    auto ctx = make_context(device);
    const DType act = ctx->compute_dtype();
    RandPool wpool(*ctx, 0.02, seed), xpool(*ctx, 1.0, seed + 1);
    const Tensor embed = wpool.make(act, {V, H}), lm_head = wpool.make(act, {V, H});
    const Tensor features = xpool.make(act, {ctxn, nf * H});
    DrafterConfig c;
    c.arch = DraftArch::DFlash2;
    c.hidden_size = H;
    c.intermediate_size = 12288;
    c.num_layers = L;
    c.num_heads = 32;
    c.num_kv_heads = 8;
    c.head_dim = 128;
    c.vocab_size = V;
    c.block_size = B;
    c.target_layer_ids = default_target_layer_ids(36, nf);
    c.num_target_layers = 36;
    c.mask_token_id = 151669;
    c.rope_theta = 1e6;
    c.max_position_embeddings = 40960;
    c.validate();
    Drafter d(*ctx, c, seed);
    Drafter::Cache cache = d.make_cache(*ctx, ctxn + B);
    d.extend_cache(*ctx, cache, features);
    ctx->synchronize();
    std::vector<double> tf, ta, ts;
    int32_t bonus = 1234;
    for (int64_t r = 0; r < reps + 3; ++r) {
      double t0 = now_s();
      const Tensor h = d.draft_block(*ctx, cache, bonus, embed);
      ctx->synchronize();
      const double t1 = now_s();
      Tensor logits = ctx->empty(act, {B - 1, V}), ids = ctx->empty(DType::I32, {B - 1});
      ctx->linear(h.slice(1, B), lm_head, nullptr, logits);
      ctx->argmax(logits, ids);
      const Tensor am = ctx->to_host(ids, false);
      const double t2 = now_s();
      const std::vector<int32_t> path = d.select_path(*ctx, h.slice(1, B), bonus, lm_head);
      const double t3 = now_s();
      bonus = path.back();
      if (r < 3) continue;  // warm-up
      tf.push_back(t1 - t0);
      ta.push_back(t2 - t1);
      ts.push_back(t3 - t2);
    }
    const double f = median(tf), a = median(ta), s = median(ts);
    note("device %s; ctx %lld, B %lld, %lld layers, %lld reps", ctx->describe().c_str(), (long long)ctxn,
         (long long)B, (long long)L, (long long)reps);
    result("name=select impl=dflash2 ctx=%lld B=%lld forward_ms=%.3f argmax_ms=%.3f select_ms=%.3f "
           "select_over_forward=%.3f select_over_forward_argmax=%.3f",
           (long long)ctxn, (long long)B, f * 1e3, a * 1e3, s * 1e3, s / f, s / (f + a));
  } catch (const std::exception& e) {
    std::printf("RESULT name=select_error impl=dflash2 msg=\"%s\"\n", e.what());
    return 1;
  }
  return 0;
}
