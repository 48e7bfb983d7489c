// bench/bench_hybrid.cpp — hybrid linear-attention targets (issue 37) on "cuda": the prefill with 5-layer capture at
// the shapes of transformers' default configs, beside bench/torch_hybrid.py (transformers 5.17's Qwen3_5TextModel /
// Qwen3_5MoeTextModel with its torch gated-delta-rule path, same FLOP formula), and the gated delta rule alone.
//
// Targets (--model dense|moe|both; random bf16 weights, Target::random: N(0, 0.02), norms 1 — zero-centred norms then
// scale by 2, as a random transformers model with the same fill):
//   dense  Qwen3_5TextConfig defaults = Qwen3.5-9B: H 4096, 32 layers (24 Gated DeltaNet + 8 gated attention), 16/4
//          heads of 256 (rotary 64), linear 16 key / 32 value heads of 128, MLP 12288, vocab 248320;
//   moe    Qwen3_5MoeTextConfig defaults = Qwen3.5-35B-A3B: H 2048, 40 layers (30 + 10), 16/2 heads of 256, 256 experts
//          top-8 of width 512 + a shared expert of 512, vocab 248320.
// Rows (median of repeats, wall time between synchronisations):
//   hybrid_<model>_prefill_4x3072      Target::forward_packed of 4 x 3072 tokens, every layer + the final norm, 5
//                                      layers captured (HF's output_hidden_states=True);
//   hybrid_<model>_prefill_4x3072_cap  without the layers after the last captured one (the trainer's call);
//   hybrid_<model>_profile             one profiled prefill (ContextOptions::profile_ops): the gated delta rule's share
//                                      of the prefill and of a linear-attention layer (its time / (prefill / layers));
//   gdr_chunk_4x3072 / gdr_recurrent_1x3072
//                                      Context::gated_delta_rule alone on 4 sequences of 3072 tokens, 32 value heads over
//                                      16 key heads of 128 (Qwen3.5-9B's), chunked (WY form, tensor cores) and the
//                                      recurrent kernel on one sequence; TFLOP/s of the chunked form's matmuls (11.5
//                                      MFLOP per chunk of 64 and value head) and bytes/s of its reads and writes
//                                      against the H200's 989 TFLOP/s and 4.8 TB/s.
// FLOPs of the prefill (bench/torch_hybrid.py: the same formula): per token and layer 2 x the layer's matmul
// parameters a token uses (linear attention: in_proj_qkv, z, b, a, out_proj; gated attention: q (with its gate), k,
// v, o; dense MLP, or router + top-k experts + shared expert and its gate) plus causal attention 4 d nh T (T + 1) / 2
// per full-attention layer and sequence; no lm_head, no recurrence term. MFU against 989 TFLOP/s.
//
//   bench_hybrid [--model both] [--seqs 4] [--T 3072] [--layers 0] [--budget-s 10] [--max-reps 5] [--device cuda]
//                [--gdr-only]
#include <cmath>
#include <cstdio>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_util.h"
#include "core/rng.h"
#include "io/hf_config.h"
#include "model/target.h"

using namespace dflash;
using namespace bench;

namespace {

nlohmann::json text_config(bool moe) {
  nlohmann::json j = {{"hidden_act", "silu"}, {"vocab_size", 248320}, {"num_attention_heads", 16},
                      {"head_dim", 256}, {"linear_num_key_heads", 16}, {"linear_num_value_heads", 32},
                      {"linear_key_head_dim", 128}, {"linear_value_head_dim", 128}, {"linear_conv_kernel_dim", 4},
                      {"rms_norm_eps", 1e-6}, {"max_position_embeddings", 32768}, {"tie_word_embeddings", false},
                      {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 10000.0}, {"partial_rotary_factor", 0.25}}}};
  if (moe) {
    j["architectures"] = {"Qwen3_5MoeForCausalLM"};
    j["model_type"] = "qwen3_5_moe_text";
    j["hidden_size"] = 2048;
    j["num_hidden_layers"] = 40;
    j["num_key_value_heads"] = 2;
    j["num_experts"] = 256;
    j["num_experts_per_tok"] = 8;
    j["moe_intermediate_size"] = 512;
    j["shared_expert_intermediate_size"] = 512;
  } else {
    j["architectures"] = {"Qwen3_5ForCausalLM"};
    j["model_type"] = "qwen3_5_text";
    j["hidden_size"] = 4096;
    j["intermediate_size"] = 12288;
    j["num_hidden_layers"] = 32;
    j["num_key_value_heads"] = 4;
  }
  return j;
}

// Per-token matmul parameters of layer l as executed, and the prefill's FLOPs (see the header).
double hybrid_prefill_flops(const ModelConfig& c, int64_t layers, const std::vector<int64_t>& lens) {
  const double H = c.hidden_size, nh = c.num_attention_heads, nkv = c.num_key_value_heads, d = c.head_dim;
  const LinearAttnConfig& a = c.linear_attn;
  double f = 0;
  for (int64_t l = 0; l < layers; ++l) {
    const LayerSpec s = c.layer(l);
    double p = 0;
    bool full = false;
    if (s.mixer == TokenMixer::LinearAttention) {
      p += H * (a.conv_dim() + a.value_dim() + 2.0 * a.num_value_heads) + a.value_dim() * H;
    } else {
      p += H * nh * d * (s.attention.output_gate ? 2 : 1) + 2 * H * nkv * d + nh * d * H;
      full = true;
    }
    if (s.mlp == ChannelMixer::Dense) {
      p += 3 * H * s.mlp_width;
    } else {
      p += H * c.moe.num_experts + double(c.moe.top_k) * 3 * H * c.moe.expert_width;
      if (c.moe.shared_expert_width > 0) p += 3 * H * c.moe.shared_expert_width + H;
    }
    for (int64_t t : lens) f += 2.0 * p * double(t) + (full ? 4.0 * d * nh * double(t) * double(t + 1) / 2.0 : 0.0);
  }
  return f;
}

constexpr double kChunkFlop = 11534336.0;  // per chunk of 64 and value head: 5 products of 2^20, 3 of 2^21
constexpr double kPeakTBs = 4.8;            // H200 HBM3e

void bench_gdr(Context& ctx, int64_t nseq, int64_t T, double budget, int max_reps, uint64_t seed) {
  const int64_t nk = 16, nv = 32, d = 128, C = 2 * nk * d + nv * d, R = nseq * T;
  RandPool pool(ctx, 1.0, seed + 11);
  // the packed prefill's rows: nseq sequences of T tokens, one call (GatedDeltaArgs seqs), as the target runs it
  Tensor qkv = ctx.empty(ctx.compute_dtype(), {R, C}), ba = ctx.empty(ctx.compute_dtype(), {R, 2 * nv});
  pool.fill(qkv);
  pool.fill(ba);
  // g around -exp(-1) softplus(a - 1) and beta around 0.5, as a trained model's gates (through gdn_gate)
  Tensor g = ctx.empty(DType::F32, {R, nv}), beta = ctx.empty(DType::F32, {R, nv});
  ctx.gdn_gate(ba, const_tensor(ctx, ctx.compute_dtype(), {nv}, -1.0f),
               const_tensor(ctx, ctx.compute_dtype(), {nv}, -1.0f), g, beta);
  Tensor out = ctx.empty(ctx.compute_dtype(), {R, nv, d});
  std::vector<int64_t> seqs;
  for (int64_t s = 0; s <= nseq; ++s) seqs.push_back(s * T);
  const double chunks = double(nseq) * double((T + 63) / 64) * double(nv);
  const double bytes = double(nseq) * double(T) * (double(nv) * (2.0 * d * 2 + d * 2 + 8 + d * 2));
  const Timing t = measure(ctx, [&] { ctx.gated_delta_rule({qkv, g, beta, Tensor{}, nk, d, nv, d, seqs}, out); },
                           budget, max_reps);
  result("name=gdr_chunk_%lldx%lld impl=dflash ms=%.3f tflops=%.1f tflops_frac_989=%.4f tb_per_s=%.2f "
         "bw_frac_4.8=%.3f heads=%lld reps=%d",
         (long long)nseq, (long long)T, t.median_s * 1e3, chunks * kChunkFlop / t.median_s / 1e12,
         chunks * kChunkFlop / t.median_s / 1e12 / kPeakTflops, bytes / t.median_s / 1e12,
         bytes / t.median_s / 1e12 / kPeakTBs, (long long)nv, t.reps);
  // the recurrent kernel on one sequence (T >= 64 would take the chunked path: call it through a state-carrying
  // sequence of 63-token pieces, which is the recurrent kernel's own work)
  Tensor st = ctx.zeros(DType::F32, {nv, d, d});
  const Timing r = measure(ctx, [&] {
    for (int64_t t0 = 0; t0 < T; t0 += 63) {
      const int64_t t1 = std::min(T, t0 + 63);
      ctx.gated_delta_rule({qkv.slice(t0, t1), g.slice(t0, t1), beta.slice(t0, t1), st, nk, d, nv, d, {}},
                           out.slice(t0, t1));
    }
  }, budget, max_reps);
  result("name=gdr_recurrent_1x%lld impl=dflash ms=%.3f speedup_chunked_per_seq=%.1f reps=%d", (long long)T,
         r.median_s * 1e3, r.median_s / (t.median_s / double(nseq)), r.reps);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args args(argc, argv);
    const std::string device = args.s("device", "cuda");
    if (!device_available(device, "bench_hybrid")) return 0;
    const int64_t nseq = args.i("seqs", 4), T = args.i("T", 3072);
    const double budget = args.f("budget-s", 10.0);
    const int max_reps = static_cast<int>(args.i("max-reps", 5));
    const uint64_t seed = static_cast<uint64_t>(args.i("seed", 1));
    const std::string which = args.s("model", "both");
    {
      auto ctx = make_context(device);
      bench_gdr(*ctx, nseq, T, budget, max_reps, seed);
    }
    if (args.flag("gdr-only")) return 0;
    for (const bool moe : {false, true}) {
      if (which != "both" && which != (moe ? "moe" : "dense")) continue;
      const std::string model = moe ? "moe" : "dense";
      nlohmann::json cj = text_config(moe);
      if (args.i("layers", 0) > 0) cj["num_hidden_layers"] = args.i("layers", 0);
      const ModelConfig cfg = parse_model_config(cj, moe ? "Qwen3_5MoeTextConfig defaults" : "Qwen3_5TextConfig defaults");
      const int64_t Lt = cfg.num_hidden_layers, V = cfg.vocab_size;
      ContextOptions o;
      o.profile_ops = true;  // only the profiled run records (others: reset before and after)
      auto ctx = make_context(device, o);
      const double t_w0 = now_s();
      auto target = Target::random(cfg, *ctx, seed);
      ctx->synchronize();
      const TargetParams tp = target_params(cfg);
      int64_t nlin = 0;
      for (int64_t l = 0; l < Lt; ++l) nlin += cfg.layer(l).mixer == TokenMixer::LinearAttention;
      note("bench_hybrid %s on %s: %s, %lld layers (%lld linear attention); %.2fB params (%.2fB active per token), "
           "random weights built in %.1f s, %.1f GiB in use",
           model.c_str(), ctx->describe().c_str(), cfg.architecture.c_str(), (long long)Lt, (long long)nlin,
           tp.total / 1e9, tp.active / 1e9, now_s() - t_w0, gib(double(ctx->memory().in_use_bytes)));
      const std::vector<int64_t> layer_ids = default_target_layer_ids(Lt, 5);
      Rng rng(seed, RngPurpose::Test, 7);
      std::vector<std::vector<int32_t>> seqs;
      std::vector<int64_t> lens;
      for (int64_t i = 0; i < nseq; ++i) {
        std::vector<int32_t> v(static_cast<size_t>(T));
        for (auto& x : v) x = static_cast<int32_t>(rng.below(static_cast<uint64_t>(V)));
        seqs.push_back(v);
        lens.push_back(T);
      }
      auto run = [&](const std::string& name, auto&& fn, double flops, int64_t layers_run) {
        ctx->reset_op_profile();
        const Timing t = measure(*ctx, fn, budget, max_reps);
        const double s = t.median_s, tokens = double(nseq * T);
        result("name=%s impl=dflash ms=%.2f tokens_per_s=%.0f tflops=%.1f mfu_989=%.4f layers=%lld reps=%d "
               "first_ms=%.1f peak_gib=%.2f",
               name.c_str(), s * 1e3, tokens / s, flops / s / 1e12, flops / s / 1e12 / kPeakTflops,
               (long long)layers_run, t.reps, t.first_s * 1e3, gib(double(ctx->memory().peak_bytes)));
        return s;
      };
      const std::string tag = cat(nseq, "x", T);
      const double s_full = run("hybrid_" + model + "_prefill_" + tag,
                                [&] { (void)target->forward_packed(*ctx, seqs, layer_ids, true); },
                                hybrid_prefill_flops(cfg, Lt, lens), Lt);
      const int64_t last = layer_ids.back() + 1;
      run("hybrid_" + model + "_prefill_" + tag + "_cap", [&] { (void)target->forward_packed(*ctx, seqs, layer_ids, false); },
          hybrid_prefill_flops(cfg, last, lens), last);
      // one profiled prefill: the gated delta rule's share
      ctx->reset_op_profile();
      (void)target->forward_packed(*ctx, seqs, layer_ids, true);
      double total_ms = 0, gdr_ms = 0, conv_ms = 0;
      for (const OpProfileRow& r : ctx->op_profile()) {
        total_ms += r.ms;
        if (r.op.rfind("gated_delta_rule", 0) == 0) gdr_ms += r.ms;
        if (r.op.rfind("conv1d_causal", 0) == 0) conv_ms += r.ms;
      }
      const double layer_ms = s_full * 1e3 / double(Lt), gdr_layer_ms = nlin ? gdr_ms / double(nlin) : 0.0;
      result("name=hybrid_%s_profile impl=dflash op_total_ms=%.2f gdr_ms=%.2f gdr_share=%.4f gdr_ms_per_linear_layer=%.3f "
             "layer_avg_ms=%.3f gdr_frac_of_layer=%.4f conv_ms=%.2f",
             model.c_str(), total_ms, gdr_ms, total_ms > 0 ? gdr_ms / total_ms : 0.0, gdr_layer_ms, layer_ms,
             layer_ms > 0 ? gdr_layer_ms / layer_ms : 0.0, conv_ms);
      for (const OpProfileRow& r : ctx->op_profile()) note("  op %-60s %9.3f ms", r.op.c_str(), r.ms);
    }
    return 0;
  } catch (const std::exception& e) {
    std::printf("RESULT name=hybrid_error impl=dflash msg=\"%s\"\n", e.what());
    std::fflush(stdout);
    std::fprintf(stderr, "bench_hybrid: %s\n", e.what());
    return 1;
  }
}
