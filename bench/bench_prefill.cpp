// bench/bench_prefill.cpp — target prefill with capture of 5 layers at the Qwen3-8B target shapes (36 layers, H 4096,
// 32/8 heads, d 128, I 12288, V 151936, q/k norms) on "cuda", random bf16 weights built in memory (no files):
// TargetWeights filled on the device, then Target(cfg, weights).
// Measured (wall time between synchronisations, warm-up first, median of repeats):
//   prefill_3072      Target::forward of one 3072-token sequence, want_final = true: all 36 layers + final norm
//                     (what HF Qwen3Model(output_hidden_states=True) computes; the comparison row);
//   prefill_3072_cap  the trainer's call (want_final = false): layers after the last captured one (33) are skipped;
//   prefill_4x1024    Target::forward_batch of --batch sequences of --T-batch tokens with KV caches (all 36 layers;
//                     named prefill_<batch>x<T-batch>, 4 x 1024 by default).
// FLOPs (no lm_head, embedding lookup not counted): per layer run 2 * P_layer per token, P_layer =
// H*nh*d + 2*H*nkv*d + nh*d*H + 3*H*I, plus causal attention 4*d*nh*T(T+1)/2 per sequence of T tokens.
// MFU against 989 TFLOP/s (H200 bf16 dense peak). --fp8 block: every projection quantized to FP8 in 128 x 128 blocks
// (Qwen's -FP8 checkpoints), --fp8 channel: per output channel (compressed-tensors FP8-dynamic); the RESULT lines
// then say impl=dflash_fp8_block / dflash_fp8_channel, and the note gives the weights' bytes on the device.
//
//   bench_prefill [--T 3072] [--batch 4] [--T-batch 1024] [--budget-s 5] [--max-reps 5] [--seed 1]
//                 [--fp8 none|block|channel]
#include <cmath>
#include <cstdio>
#include <vector>

#include "bench_util.h"
#include "core/rng.h"
#include "io/hf_config.h"
#include "model/target.h"
#include "model/target/attention.h"

using namespace dflash;
using namespace bench;

int main(int argc, char** argv) {
  try {
    const Args args(argc, argv);
    const int64_t T = args.i("T", 3072), nb = args.i("batch", 4), Tb = args.i("T-batch", 1024);
    const double budget = args.f("budget-s", 5.0);
    const int max_reps = static_cast<int>(args.i("max-reps", 5));
    const uint64_t seed = static_cast<uint64_t>(args.i("seed", 1));

    ModelConfig cfg;
    cfg.arch = Arch::Qwen3;
    cfg.model_type = "qwen3";
    cfg.hidden_size = args.i("H", 4096);
    cfg.intermediate_size = args.i("I", 12288);
    cfg.num_hidden_layers = args.i("layers", 36);
    cfg.num_attention_heads = 32;
    cfg.num_key_value_heads = 8;
    cfg.head_dim = 128;
    cfg.vocab_size = args.i("V", 151936);
    cfg.max_position_embeddings = 40960;
    cfg.rms_norm_eps = 1e-6;
    cfg.rope_theta = 1e6;
    cfg.tie_word_embeddings = false;
    cfg.attention_bias = false;
    cfg.qk_norm = true;
    const int64_t H = cfg.hidden_size, I = cfg.intermediate_size, Lt = cfg.num_hidden_layers;
    const int64_t nh = cfg.num_attention_heads, nkv = cfg.num_key_value_heads, d = cfg.head_dim, V = cfg.vocab_size;
    const std::vector<int64_t> layer_ids = default_target_layer_ids(Lt, 5);

    const std::string device = args.s("device", "cuda");
    if (!device_available(device, "bench_prefill")) return 0;
    auto ctx = make_context(device);
    const DType act = ctx->compute_dtype();
    const std::string fp8 = args.s("fp8", "none");
    if (fp8 != "none" && fp8 != "block" && fp8 != "channel") throw Error("--fp8: none, block or channel, got " + fp8);
    const std::string impl = fp8 == "none" ? "dflash" : "dflash_fp8_" + fp8;
    const double t_w0 = now_s();
    RandPool pool(*ctx, 0.02, seed);
    auto proj = [&](int64_t N, int64_t K) -> LinearWeight {
      const Tensor t = pool.make(act, {N, K});
      if (fp8 == "none") return t;
      return ctx->quantize_fp8(t, fp8 == "block" ? 128 : 1, fp8 == "block" ? 128 : K);
    };
    TargetWeights w;
    w.embed = pool.make(act, {V, H});
    w.lm_head = pool.make(act, {V, H});
    w.final_norm = const_tensor(*ctx, act, {H}, 1.0f);
    w.inv_freq = ctx->to_device(rope_inv_freq(d, cfg.rope_theta, cfg.rope_scaling));
    for (int64_t l = 0; l < Lt; ++l) {
      TargetLayer L;
      L.in_norm = const_tensor(*ctx, act, {H}, 1.0f);
      L.post_norm = const_tensor(*ctx, act, {H}, 1.0f);
      AttentionWeights& attn = L.mixer.emplace<AttentionWeights>();
      attn.wq = proj(nh * d, H);
      attn.wk = proj(nkv * d, H);
      attn.wv = proj(nkv * d, H);
      attn.wo = proj(H, nh * d);
      attn.q_norm = const_tensor(*ctx, act, {d}, 1.0f);
      attn.k_norm = const_tensor(*ctx, act, {d}, 1.0f);
      L.mlp.w_gate = proj(I, H);
      L.mlp.w_up = proj(I, H);
      L.mlp.w_down = proj(H, I);
      w.layers.push_back(std::move(L));
    }
    Target target(cfg, std::move(w));
    ctx->synchronize();
    note("bench_prefill on %s: Qwen3-8B shapes (%lld layers, %s), random weights built on the device in %.2f s, %.2f GiB",
         ctx->describe().c_str(), (long long)Lt, impl.c_str(), now_s() - t_w0, gib(double(ctx->memory().in_use_bytes)));
    result("name=prefill_weights impl=%s weights_gib=%.3f", impl.c_str(), gib(double(ctx->memory().in_use_bytes)));

    const double P_layer = double(H * nh * d + 2 * H * nkv * d + nh * d * H + 3 * H * I);
    auto flops_for = [&](int64_t layers_run, const std::vector<int64_t>& lens) {
      double f = 0;
      for (int64_t t : lens)
        f += double(layers_run) * (2.0 * P_layer * double(t) + 4.0 * d * nh * double(t) * double(t + 1) / 2.0);
      return f;
    };
    Rng rng(seed, RngPurpose::Test, 7);
    auto rand_ids = [&](int64_t n) {
      std::vector<int32_t> v(static_cast<size_t>(n));
      for (auto& x : v) x = static_cast<int32_t>(rng.below(static_cast<uint64_t>(V)));
      return v;
    };
    auto run = [&](const char* name, auto&& fn, double flops, double tokens, int64_t layers_run) {
      const Timing t = measure(*ctx, fn, budget, max_reps);
      const double s = t.median_s;
      result("name=%s impl=%s ms=%.2f tokens_per_s=%.0f tflops=%.1f mfu_989=%.4f layers=%lld reps=%d "
             "first_ms=%.1f peak_gib=%.2f",
             name, impl.c_str(), s * 1e3, tokens / s, flops / s / 1e12, flops / s / 1e12 / kPeakTflops, (long long)layers_run, t.reps,
             t.first_s * 1e3, gib(double(ctx->memory().peak_bytes)));
    };

    const Tensor ids = cpu_tensor_i32(rand_ids(T), {T});
    run("prefill_3072", [&] { (void)target.forward(*ctx, ids, layer_ids, /*want_final=*/true); },
        flops_for(Lt, {T}), double(T), Lt);
    const int64_t last = layer_ids.back() + 1;
    run("prefill_3072_cap", [&] { (void)target.forward(*ctx, ids, layer_ids, /*want_final=*/false); },
        flops_for(last, {T}), double(T), last);

    std::vector<std::vector<int32_t>> seqs;
    std::vector<KVCache> caches;
    std::vector<int64_t> lens;
    for (int64_t i = 0; i < nb; ++i) {
      seqs.push_back(rand_ids(Tb));
      caches.push_back(KVCache::create(*ctx, cfg, Tb));
      lens.push_back(Tb);
    }
    std::vector<KVCache*> cptr;
    for (auto& c : caches) cptr.push_back(&c);
    const std::string batch_name = cat("prefill_", nb, "x", Tb);
    run(batch_name.c_str(),
        [&] {
          for (auto& c : caches) c.truncate(0);
          (void)target.forward_batch(*ctx, seqs, cptr, layer_ids, /*want_final=*/true);
        },
        flops_for(Lt, lens), double(nb * Tb), Lt);
    return 0;
  } catch (const std::exception& e) {
    std::printf("RESULT name=prefill_error impl=dflash msg=\"%s\"\n", e.what());
    std::fflush(stdout);
    std::fprintf(stderr, "bench_prefill: %s\n", e.what());
    return 1;
  }
}
