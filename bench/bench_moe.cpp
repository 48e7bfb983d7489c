// bench/bench_moe.cpp — a Mixture-of-Experts target at Qwen3-30B-A3B shapes (issue 40) on "cuda": the prefill with
// 5-layer capture beside bench/torch_moe.py (transformers' Qwen3MoeModel, same FLOP formula), and the grouped expert
// GEMM alone beside cuBLAS's grouped GEMM.
//
// Target: the published Qwen3-30B-A3B config.json (48 layers, H 2048, 32/4 heads of 128, 128 experts top-8 of width
// 768, vocab 151936; --config FILE takes another), random bf16 weights (Target::random: N(0, 0.02), norms 1).
// Rows (median of repeats, wall time between synchronisations):
//   moe_prefill_4x3072      Target::forward_packed of 4 sequences of 3072 tokens, want_final: every layer + the final
//                           norm, 5 layers captured (what HF Qwen3MoeModel(output_hidden_states=True) computes);
//   moe_prefill_4x3072_cap  the same without the layers after the last captured one (the trainer's call);
//   moe_prefill_1x3072      Target::forward of one sequence (what the trainer's target worker runs per packet);
//   moe_gemm_gate_up / moe_gemm_swiglu / moe_gemm_down
//                           Context::moe_linear alone on the routing of 4 x 3072 random tokens: the gate+up
//                           projection as a plain GEMM (N = 2 I), the same with the SwiGLU epilogue (what the layer
//                           runs), the down projection;
//   cublas_grouped_gate_up / cublas_grouped_down
//                           cublasGemmGroupedBatchedEx over the same experts and rows (one group per expert with
//                           rows; its sizes are host arrays, so the offsets are copied to the host first: timed with
//                           that copy and its synchronisation, "sync", and without, "gemm"; both include the upload of
//                           its pointer arrays, which cuBLAS reads from device memory).
// DFLASH_MOE_GEMM_VARIANT=0|1|2 picks the Hopper kernel's variant (backend/cuda/moe.cu kWgVariants).
// FLOPs of the prefill: per token and layer 2 x (q, k, v, o + router + top_k experts x 3 H I) plus causal attention
// 4 d nh T (T + 1) / 2 per sequence (a sliding-window layer: 4 d nh sum_i min(i + 1, W)), no lm_head (bench/torch_moe.py: moe_prefill_flops). MFU against 989 TFLOP/s.
//
// --experts H,I,E,k (issue 36: gpt-oss-20b is 2880,2880,32,4; 120b 2880,2880,128,4): instead of the above, the
// expert GEMMs of gpt-oss alone on synthetic weights, R = seqs x T tokens routed by random logits: rows
//   gptoss_gemm_glu_{bf16,mxfp4}   gate+up with biases and the clamped SwiGLU epilogue (MoeAct::ClampedSwiGLU), x
//                                  gathered;
//   gptoss_gemm_down_{bf16,mxfp4}  down with biases on the grouped rows;
//   gptoss_gemm_{glu,down}_int4    the same with INT4 weights (compressed-tensors pack-quantized, Kimi-K2's experts:
//                                  --experts 7168,2048,384,8), groups of 32;
// bf16 weights N(0, 0.02); MXFP4 weights random e2m1 codes with e8m0 scales 2^-8 .. 2^-5 (the same bytes per
// element as the published checkpoints: half a byte plus 1/32 of a scale byte); INT4 weights random codes with bf16
// scales 2^-9 .. 2^-8 (half a byte plus 2/32 of a scale byte).
//
//   bench_moe [--seqs 4] [--T 3072] [--layers 48] [--config FILE] [--budget-s 10] [--max-reps 5] [--device cuda]
//             [--gemm-only] [--experts H,I,E,k]
#include <cmath>
#include <cstdio>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#ifdef DFLASH_HAVE_CUDA
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#endif

#include "bench_util.h"
#include "core/fs.h"
#include "core/rng.h"
#include "io/hf_config.h"
#include "model/target.h"

using namespace dflash;
using namespace bench;

namespace {

// Qwen/Qwen3-30B-A3B config.json (the keys dflash reads)
const char* kQwen3_30B_A3B = R"({
  "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "attention_bias": false,
  "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_size": 2048, "intermediate_size": 6144,
  "max_position_embeddings": 40960, "mlp_only_layers": [], "moe_intermediate_size": 768, "norm_topk_prob": true,
  "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48,
  "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "use_sliding_window": false, "vocab_size": 151936, "decoder_sparse_step": 1})";

double moe_prefill_flops(const ModelConfig& c, int64_t layers, const std::vector<int64_t>& lens) {
  const double H = c.hidden_size, nh = c.num_attention_heads, nkv = c.num_key_value_heads, d = c.head_dim;
  const double p_layer = H * nh * d * 2 + 2 * H * nkv * d + H * c.moe.num_experts +
                         double(c.moe.top_k) * 3 * H * c.moe.expert_width;
  double f = 0;
  for (int64_t t : lens)
    for (int64_t l = 0; l < layers; ++l) {
      // the keys the queries see: t (t + 1) / 2, or with a sliding window W (gpt-oss) sum_i min(i + 1, W)
      const int64_t W = c.layer(l).attention.sliding_window;
      const double keys = W > 0 && W < t ? double(W) * double(W + 1) / 2.0 + double(t - W) * double(W)
                                         : double(t) * double(t + 1) / 2.0;
      f += 2.0 * p_layer * double(t) + 4.0 * d * nh * keys;
    }
  return f;
}

// The expert GEMMs of gpt-oss (bf16 and MXFP4 weights) on synthetic weights and a random routing (--experts).
void expert_gemms(Context& ctx, const std::string& spec, int64_t R, double budget, int max_reps, uint64_t seed) {
  int64_t H = 0, I = 0, E = 0, k = 0;
  DFLASH_CHECK(std::sscanf(spec.c_str(), "%lld,%lld,%lld,%lld", reinterpret_cast<long long*>(&H),
                           reinterpret_cast<long long*>(&I), reinterpret_cast<long long*>(&E),
                           reinterpret_cast<long long*>(&k)) == 4 && H % 32 == 0 && I % 32 == 0 && E > 0 && k > 0,
               "bench_moe: --experts wants H,I,E,k with H and I multiples of 32, got '", spec, "'");
  RandPool pool(ctx, 1.0, seed + 11), wpool(ctx, 0.02, seed + 12);
  const DType act = ctx.compute_dtype();
  Tensor x = ctx.empty(act, {R, H}), logits = ctx.empty(act, {R, E});
  pool.fill(x);
  pool.fill(logits);
  Tensor idx = ctx.empty(DType::I32, {R, k}), wts = ctx.empty(DType::F32, {R, k});
  ctx.moe_route(logits, k, true, idx, wts);
  Tensor off = ctx.empty(DType::I32, {E + 1}), rows = ctx.empty(DType::I32, {R * k}), slot = ctx.empty(DType::I32, {R * k});
  ctx.moe_group(idx, off, rows, slot);
  MoeWeights gu(ctx.empty(act, {E, 2 * I, H})), dn(ctx.empty(act, {E, H, I}));
  wpool.fill(gu.w);
  wpool.fill(dn.w);
  gu.bias = ctx.empty(act, {E, 2 * I});
  dn.bias = ctx.empty(act, {E, H});
  wpool.fill(gu.bias);
  wpool.fill(dn.bias);
  auto fp4 = [&](int64_t n_rows, int64_t K, uint64_t sd) {
    Rng r(sd, RngPurpose::Test);
    Tensor q = cpu_empty(DType::U8, {E, n_rows, K / 2}), sc = cpu_empty(DType::U8, {E, n_rows, K / 32});
    for (uint8_t& b : q.span<uint8_t>()) b = static_cast<uint8_t>(r.below(256));
    for (uint8_t& b : sc.span<uint8_t>()) b = static_cast<uint8_t>(119 + r.below(4));
    return std::pair{ctx.to_device(q), ctx.to_device(sc)};
  };
  MoeWeights guq, dnq;
  std::tie(guq.w, guq.scales) = fp4(2 * I, H, seed + 13);
  std::tie(dnq.w, dnq.scales) = fp4(H, I, seed + 14);
  guq.bias = gu.bias;
  dnq.bias = dn.bias;
  auto int4 = [&](int64_t n_rows, int64_t K, uint64_t sd) {
    Rng r(sd, RngPurpose::Test);
    MoeWeights m;
    Tensor q = cpu_empty(DType::U8, {E, n_rows, K / 2}), sc = cpu_empty(DType::F32, {E, n_rows, K / 32});
    for (uint8_t& b : q.span<uint8_t>()) b = static_cast<uint8_t>(r.below(256));
    for (float& v : sc.span<float>()) v = std::ldexp(static_cast<float>(128 + r.below(128)), -16);
    m.w = ctx.to_device(q);
    m.scales = ctx.to_device(cpu_to_bf16(sc));
    m.int4_group = 32;
    return m;
  };
  MoeWeights gu4 = int4(2 * I, H, seed + 15), dn4 = int4(H, I, seed + 16);
  gu4.bias = gu.bias;
  dn4.bias = dn.bias;
  Tensor a = ctx.empty(act, {R * k, I}), y = ctx.empty(act, {R * k, H});
  const double f_gu = 2.0 * double(R * k) * double(2 * I) * double(H), f_dn = 2.0 * double(R * k) * double(H) * I;
  note("gpt-oss experts H %lld, I %lld, %lld experts top-%lld, %lld tokens (%lld grouped rows); weights per expert "
       "bf16 %.1f MiB, MXFP4 %.1f MiB",
       (long long)H, (long long)I, (long long)E, (long long)k, (long long)R, (long long)(R * k),
       3.0 * H * I * 2 / 1048576.0, 3.0 * H * I * (0.5 + 1.0 / 32) / 1048576.0);
  auto row = [&](const char* name, auto&& fn, double flops) {
    const Timing t = measure(ctx, fn, budget, max_reps);
    result("name=%s impl=dflash ms=%.3f tflops=%.1f mfu_989=%.4f reps=%d rows=%lld", name, t.median_s * 1e3,
           flops / t.median_s / 1e12, flops / t.median_s / 1e12 / kPeakTflops, t.reps, (long long)(R * k));
    return t.median_s;
  };
  const MoeAct glu = MoeAct::ClampedSwiGLU;
  const double g16 = row("gptoss_gemm_glu_bf16", [&] { ctx.moe_linear(x, &rows, gu, off, a, glu); }, f_gu);
  const double g4 = row("gptoss_gemm_glu_mxfp4", [&] { ctx.moe_linear(x, &rows, guq, off, a, glu); }, f_gu);
  const double d16 = row("gptoss_gemm_down_bf16", [&] { ctx.moe_linear(a, nullptr, dn, off, y, MoeAct::None); }, f_dn);
  const double d4 = row("gptoss_gemm_down_mxfp4", [&] { ctx.moe_linear(a, nullptr, dnq, off, y, MoeAct::None); }, f_dn);
  result("name=gptoss_gemm_mxfp4_vs_bf16 impl=dflash glu=%.3f down=%.3f both=%.3f", g16 / g4, d16 / d4,
         (g16 + d16) / (g4 + d4));
  const double gi = row("gptoss_gemm_glu_int4", [&] { ctx.moe_linear(x, &rows, gu4, off, a, glu); }, f_gu);
  const double di = row("gptoss_gemm_down_int4", [&] { ctx.moe_linear(a, nullptr, dn4, off, y, MoeAct::None); }, f_dn);
  result("name=gptoss_gemm_int4_vs_bf16 impl=dflash glu=%.3f down=%.3f both=%.3f", g16 / gi, d16 / di,
         (g16 + d16) / (gi + di));
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args args(argc, argv);
    const std::string device = args.s("device", "cuda");
    if (!device_available(device, "bench_moe")) return 0;
    const int64_t nseq = args.i("seqs", 4), T = args.i("T", 3072);
    const double budget = args.f("budget-s", 10.0);
    const int max_reps = static_cast<int>(args.i("max-reps", 5));
    const uint64_t seed = static_cast<uint64_t>(args.i("seed", 1));
    const std::string cfg_file = args.s("config", "");
    if (!args.s("experts", "").empty()) {
      auto ctx = make_context(device);
      note("bench_moe on %s", ctx->describe().c_str());
      expert_gemms(*ctx, args.s("experts", ""), nseq * T, budget, max_reps, seed);
      return 0;
    }
    nlohmann::json cj = nlohmann::json::parse(cfg_file.empty() ? std::string(kQwen3_30B_A3B) : read_file(cfg_file));
    if (args.i("layers", 0) > 0) cj["num_hidden_layers"] = args.i("layers", 0);
    const ModelConfig cfg = parse_model_config(cj, cfg_file.empty() ? "Qwen3-30B-A3B config.json" : cfg_file);
    DFLASH_CHECK(cfg.has_moe(), "bench_moe: the config has no MoE layer");
    const int64_t Lt = cfg.num_hidden_layers, H = cfg.hidden_size, E = cfg.moe.num_experts, k = cfg.moe.top_k;
    const int64_t I = cfg.moe.expert_width, V = cfg.vocab_size;

    auto ctx = make_context(device);
    const double t_w0 = now_s();
    auto target = Target::random(cfg, *ctx, seed);
    ctx->synchronize();
    const TargetParams tp = target_params(cfg);
    note("bench_moe on %s: %s, %lld layers, %lld experts top-%lld of width %lld; %.2fB params (%.2fB active per "
         "token), random weights built in %.1f s, %.1f GiB in use",
         ctx->describe().c_str(), cfg.architecture.c_str(), (long long)Lt, (long long)E, (long long)k, (long long)I,
         tp.total / 1e9, tp.active / 1e9, now_s() - t_w0, gib(double(ctx->memory().in_use_bytes)));
    const std::vector<int64_t> layer_ids = default_target_layer_ids(Lt, 5);

    Rng rng(seed, RngPurpose::Test, 7);
    auto rand_ids = [&](int64_t n) {
      std::vector<int32_t> v(static_cast<size_t>(n));
      for (auto& x : v) x = static_cast<int32_t>(rng.below(static_cast<uint64_t>(V)));
      return v;
    };
    auto run = [&](const std::string& name, auto&& fn, double flops, double tokens, int64_t layers_run) {
      const Timing t = measure(*ctx, fn, budget, max_reps);
      const double s = t.median_s;
      result("name=%s impl=dflash ms=%.2f tokens_per_s=%.0f tflops=%.1f mfu_989=%.4f layers=%lld reps=%d "
             "first_ms=%.1f peak_gib=%.2f",
             name.c_str(), s * 1e3, tokens / s, flops / s / 1e12, flops / s / 1e12 / kPeakTflops, (long long)layers_run,
             t.reps, t.first_s * 1e3, gib(double(ctx->memory().peak_bytes)));
    };

    // ---- the prefill (--gemm-only: skipped, for variant sweeps) ----
    std::vector<std::vector<int32_t>> seqs;
    std::vector<int64_t> lens;
    for (int64_t i = 0; i < nseq; ++i) {
      seqs.push_back(rand_ids(T));
      lens.push_back(T);
    }
    if (!args.flag("gemm-only")) {
      const std::string tag = cat(nseq, "x", T);
      run("moe_prefill_" + tag, [&] { (void)target->forward_packed(*ctx, seqs, layer_ids, /*want_final=*/true); },
          moe_prefill_flops(cfg, Lt, lens), double(nseq * T), Lt);
      const int64_t last = layer_ids.back() + 1;
      run("moe_prefill_" + tag + "_cap", [&] { (void)target->forward_packed(*ctx, seqs, layer_ids, false); },
          moe_prefill_flops(cfg, last, lens), double(nseq * T), last);
      const Tensor one = cpu_tensor_i32(seqs[0], {T});
      run(cat("moe_prefill_1x", T), [&] { (void)target->forward(*ctx, one, layer_ids, true); },
          moe_prefill_flops(cfg, Lt, {T}), double(T), Lt);
    }

    // ---- the grouped expert GEMM alone, on the routing of the packed tokens at layer 0's router ----
    if (cfg.moe.expert_bias) {  // (biases, MXFP4: the rows of --experts measure gpt-oss's GEMMs)
      note("gpt-oss experts: the expert GEMM rows are bench_moe --experts H,I,E,k");
      return 0;
    }
    const int64_t R = nseq * T;
    const MoeLayerWeights& mw = target->weights().layers[0].moe;
    RandPool pool(*ctx, 1.0, seed + 3);
    Tensor x = ctx->empty(ctx->compute_dtype(), {R, H});
    pool.fill(x);
    Tensor logits = ctx->empty(ctx->compute_dtype(), {R, E});
    ctx->linear(x, mw.router, nullptr, logits);
    Tensor idx = ctx->empty(DType::I32, {R, k}), wts = ctx->empty(DType::F32, {R, k});
    ctx->moe_route(logits, k, true, idx, wts);
    Tensor off = ctx->empty(DType::I32, {E + 1}), rows = ctx->empty(DType::I32, {R * k}),
           slot = ctx->empty(DType::I32, {R * k});
    ctx->moe_group(idx, off, rows, slot);
    Tensor xg = ctx->empty(ctx->compute_dtype(), {R * k, H});
    ctx->gather_rows(xg, x, rows);  // the grouped rows, contiguous (what cuBLAS reads)
    Tensor gu = ctx->empty(ctx->compute_dtype(), {R * k, 2 * I}), act = ctx->empty(ctx->compute_dtype(), {R * k, I});
    Tensor y = ctx->empty(ctx->compute_dtype(), {R * k, H});
    const double f_gu = 2.0 * double(R * k) * double(2 * I) * double(H), f_dn = 2.0 * double(R * k) * double(H) * I;
    const std::vector<int32_t> offh = [&] {
      Tensor h = ctx->to_host(off);
      return std::vector<int32_t>(h.ptr<int32_t>(), h.ptr<int32_t>() + E + 1);
    }();
    int64_t mn = R * k, mx = 0;
    for (int64_t e = 0; e < E; ++e) {
      mn = std::min<int64_t>(mn, offh[e + 1] - offh[e]);
      mx = std::max<int64_t>(mx, offh[e + 1] - offh[e]);
    }
    note("routing of %lld tokens: %lld rows per expert on average, min %lld, max %lld", (long long)R,
         (long long)(R * k / E), (long long)mn, (long long)mx);
    auto gemm_row = [&](const char* name, const char* impl, auto&& fn, double flops) {
      const Timing t = measure(*ctx, fn, budget, max_reps);
      result("name=%s impl=%s ms=%.3f tflops=%.1f mfu_989=%.4f reps=%d rows=%lld", name, impl, t.median_s * 1e3,
             flops / t.median_s / 1e12, flops / t.median_s / 1e12 / kPeakTflops, t.reps, (long long)(R * k));
    };
    gemm_row("moe_gemm_gate_up", "dflash", [&] { ctx->moe_linear(x, &rows, mw.gate_up, off, gu, MoeAct::None); }, f_gu);
    gemm_row("moe_gemm_swiglu", "dflash", [&] { ctx->moe_linear(x, &rows, mw.gate_up, off, act, MoeAct::SwiGLU); },
             f_gu);
    gemm_row("moe_gemm_down", "dflash", [&] { ctx->moe_linear(act, nullptr, mw.down, off, y, MoeAct::None); }, f_dn);

#ifdef DFLASH_HAVE_CUDA
    if (ctx->device() == Device::CUDA) {
      cublasHandle_t h = nullptr;
      DFLASH_CHECK(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS, "cublasCreate");
      cublasSetStream(h, static_cast<cudaStream_t>(ctx->native_stream()));
      cublasSetMathMode(h, CUBLAS_DEFAULT_MATH);
      // Row-major C[M_e, N] = A[M_e, K] W_e[N, K]^T is column-major C^T[N, M_e] = W_e^T' (OP_T of the [K, N]
      // column-major view of W_e) x A^T (OP_N): m = N, n = M_e, k = K (as backend/cuda/linear.cu maps it).
      auto grouped = [&](const Tensor& a, const Tensor& w, const Tensor& c, int64_t N, int64_t K,
                         const std::vector<int32_t>& o) {
        std::vector<cublasOperation_t> ta, tb;
        std::vector<int> m, n, kk, lda, ldb, ldc, gs;
        std::vector<const void*> A, B;
        std::vector<void*> C;
        std::vector<float> alpha, beta;
        const auto* ap = static_cast<const uint16_t*>(a.data);
        const auto* wp = static_cast<const uint16_t*>(w.data);
        auto* cp = static_cast<uint16_t*>(c.data);
        for (int64_t e = 0; e < E; ++e) {
          const int64_t me = o[e + 1] - o[e];
          if (me == 0) continue;
          ta.push_back(CUBLAS_OP_T);
          tb.push_back(CUBLAS_OP_N);
          m.push_back(static_cast<int>(N));
          n.push_back(static_cast<int>(me));
          kk.push_back(static_cast<int>(K));
          A.push_back(wp + e * N * K);
          lda.push_back(static_cast<int>(K));
          B.push_back(ap + int64_t{o[e]} * K);
          ldb.push_back(static_cast<int>(K));
          C.push_back(cp + int64_t{o[e]} * N);
          ldc.push_back(static_cast<int>(N));
          alpha.push_back(1.f);
          beta.push_back(0.f);
          gs.push_back(1);
        }
        // the pointer arrays live in device memory (cuBLAS reads them there); the sizes are host arrays
        const int64_t G = static_cast<int64_t>(gs.size());
        Tensor ptrs = ctx->empty(DType::I64, {3 * G});
        std::vector<int64_t> hp(static_cast<size_t>(3 * G));
        for (int64_t g = 0; g < G; ++g) {
          hp[g] = reinterpret_cast<int64_t>(A[g]);
          hp[G + g] = reinterpret_cast<int64_t>(B[g]);
          hp[2 * G + g] = reinterpret_cast<int64_t>(C[g]);
        }
        Tensor hpt = cpu_empty(DType::I64, {3 * G});
        std::copy(hp.begin(), hp.end(), hpt.ptr<int64_t>());
        ctx->copy(ptrs, hpt);
        const auto* dp = static_cast<void* const*>(ptrs.data);
        const cublasStatus_t st = cublasGemmGroupedBatchedEx(
            h, ta.data(), tb.data(), m.data(), n.data(), kk.data(), alpha.data(),
            reinterpret_cast<const void* const*>(dp), CUDA_R_16BF, lda.data(),
            reinterpret_cast<const void* const*>(dp + G), CUDA_R_16BF, ldb.data(), beta.data(),
            const_cast<void* const*>(dp + 2 * G), CUDA_R_16BF, ldc.data(), static_cast<int>(G), gs.data(),
            CUBLAS_COMPUTE_32F);
        DFLASH_CHECK(st == CUBLAS_STATUS_SUCCESS, "cublasGemmGroupedBatchedEx: status ", static_cast<int>(st));
      };
      auto with_sync = [&](auto&& g) {
        Tensor hoff = ctx->to_host(off);  // the device -> host copy of the counts and its synchronisation
        g(std::vector<int32_t>(hoff.ptr<int32_t>(), hoff.ptr<int32_t>() + E + 1));
      };
      gemm_row("cublas_grouped_gate_up", "cublas_gemm", [&] { grouped(xg, mw.gate_up.w, gu, 2 * I, H, offh); }, f_gu);
      gemm_row("cublas_grouped_gate_up", "cublas_sync",
               [&] { with_sync([&](const std::vector<int32_t>& o) { grouped(xg, mw.gate_up.w, gu, 2 * I, H, o); }); }, f_gu);
      gemm_row("cublas_grouped_down", "cublas_gemm", [&] { grouped(act, mw.down.w, y, H, I, offh); }, f_dn);
      // ours with its gather beside cuBLAS without one: the gather costs what it costs, as the layer runs it
      gemm_row("moe_gemm_gate_up_nogather", "dflash", [&] { ctx->moe_linear(xg, nullptr, mw.gate_up, off, gu, MoeAct::None); },
               f_gu);
      cublasDestroy(h);
    }
#endif
    return 0;
  } catch (const std::exception& e) {
    std::printf("RESULT name=moe_error impl=dflash msg=\"%s\"\n", e.what());
    std::fflush(stdout);
    std::fprintf(stderr, "bench_moe: %s\n", e.what());
    return 1;
  }
}
