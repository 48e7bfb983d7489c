// bench/bench_step.cpp — the drafter training step at the Qwen3-8B drafter shapes of issue 6, on "cuda":
// H 4096, 5 layers, 32/8 heads, d 128, intermediate 12288, V 151936, nf 5, B 16, N 512 anchors, S 3072, 4 sequences
// per optimizer step. The target forward is skipped: each sequence's features [S, 5*4096] are random bf16, and the
// target's embedding / lm_head [V, H] are random bf16 (they stand in for weights read from disk).
// One step = what train/trainer.cpp does per optimizer step minus the target forward: per sequence make_draft_batch
// + upload_draft_batch + Drafter::forward_backward (fused chunked lm_head loss, backward), then global_grad_sq +
// optimizer_step (clip 1.0 + AdamW on fp32 masters) + synchronize. Sequences run one after another (as the trainer).
//
// Drafter parameters: the library's Drafter constructor, which draws every weight on the device
// (Context::fill_normal, the values of core/rng.h fill_normal); its time is in the start-up figure.
//
// Model FLOPs of one step (per sequence, summed; recompute NOT counted, i.e. MFU convention):
//   fc:                 2*S*(nf*H)*H forward + 2*S*(nf*H)*H backward (dW only; the features need no gradient)
//   per layer, block rows (NB = N*B): 3 * 2*NB*(H*nh*d + 2*H*nkv*d + nh*d*H + 3*H*I)   (forward, dX, dW)
//   per layer, context K/V over S rows: 3 * 2*S*H*(2*nkv*d)
//   per layer, attention: 3.5 * 4*d*nh*sum_j B*(a_j + B)    (forward + backward at 2.5x)
//   lm_head: (2*V*H forward + 2*V*H backward, dh only: lm_head is frozen) per scored row (rows with weight > 0)
// MFU = model TFLOP/s / 989 (H200 bf16 dense peak) and / the measured cuBLAS ceiling (an n^3 bf16 GEMM through
// Context::linear, n = 8192, timed in the same run).
// Start-up = wall time from main() entry to the end of the first finished step, minus the time spent creating the
// random stand-ins of what would be read (embedding, lm_head, features); it includes the CUDA context, the drafter's
// parameters and optimizer state (bench's device fill), the draft batches and the first step.
//
//   bench_step [--modes normal,recompute | --recompute] [--seqs 4] [--S 3072] [--N 512] [--layers 5]
//              [--budget-s 15] [--max-reps 5] [--max-seconds 100] [--gemm-n 8192] [--seed 1] [--profile]
//              [--c02-steps 50] [--arch dflash|dflash2]
// --arch dflash2: the DFlash2 drafter (docs/spec.md 1.1-1.2; published shapes: 2 taps, groups of 16, rank 256, top 16):
// its FLOPs add per layer the two kernel projections (3 * 2*NB*H*2TG each) and per step the selector's projection
// (3 * 2*NB*H*r); the convolutions and the pair scores are memory-bound and not counted.
// --c02-steps: case C02, steps whose sequences have random lengths (RESULT name=c02; 0 skips it).
// --profile: after each mode's timed steps, one more step with the per-op profile (Context::op_profile) printed
// as a table: where the step's device time goes, op by op.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "bench_util.h"
#include "core/rng.h"
#include "model/draft_batch.h"
#include "model/drafter.h"
#include "train/optimizer.h"

using namespace dflash;
using namespace bench;

int main(int argc, char** argv) {
  const double t_main = now_s();
  try {
    const Args args(argc, argv);
    const int64_t seqs = args.i("seqs", 4), S = args.i("S", 3072), N = args.i("N", 512), B = args.i("B", 16);
    const int64_t H = args.i("H", 4096), L = args.i("layers", 5), nh = args.i("nh", 32), nkv = args.i("nkv", 8);
    const int64_t d = args.i("d", 128), I = args.i("I", 12288), V = args.i("V", 151936), nf = args.i("nf", 5);
    const uint64_t seed = static_cast<uint64_t>(args.i("seed", 1));
    const double budget = args.f("budget-s", 15.0), max_seconds = args.f("max-seconds", 100.0);
    const int max_reps = static_cast<int>(args.i("max-reps", 5));
    const int64_t gemm_n = args.i("gemm-n", 8192);
    std::string modes_s = args.flag("recompute") ? "recompute" : args.s("modes", "normal,recompute");
    std::vector<std::string> modes;
    {
      std::stringstream ss(modes_s);
      for (std::string m; std::getline(ss, m, ',');)
        if (m == "normal" || m == "recompute") modes.push_back(m);
    }
    const int64_t NB = N * B;
    const int32_t mask_id = V > 151669 ? 151669 : static_cast<int32_t>(V - 1);

    // ---- memory estimate (before allocating anything) ---------------------------------------------------
    const double P = double(nf * H * H + H + H) +
                     double(L) * double(2 * H + 2 * d + 2 * nh * d * H + 2 * nkv * d * H + 3 * H * I);
    const double params_b = P * (4 + 4 + 4 + 4 + 2);  // master, grad, m, v (F32) + bf16 compute copy
    const double target_b = 2.0 * double(V) * double(H) * 2;
    const double feat_b = double(seqs) * double(S) * double(nf * H) * 2;
    const double layer_act_b = 2.0 * (double(NB) * (7.0 * H + 3.0 * I + 3.0 * nkv * d) + 3.0 * S * nkv * d) +
                               4.0 * (2.0 * NB + double(NB) * nh + double(S + NB) * nkv);
    const double loss_b = 1024.0 * double(V) * (4 + 2);
    const double bwd_tmp_b = 2.0 * double(NB) * (3.0 * I + 4.0 * H) + 2.0 * 4.0 * S * nkv * d;
    const double base_b = params_b + target_b + feat_b + 2.0 * 2 * S * H;
    const double est_normal = base_b + L * layer_act_b + double(L + 1) * NB * H * 2 + loss_b + bwd_tmp_b;
    const double est_recomp = base_b + layer_act_b + double(L + 1) * NB * H * 2 + loss_b + bwd_tmp_b;
    note("memory estimate: params+grads+AdamW %.1f GiB (%.3e params), target embed+lm_head %.1f GiB, features %.2f "
         "GiB, activations/layer/sequence %.2f GiB -> peak ~%.1f GiB (recompute ~%.1f GiB) of 141 GB",
         gib(params_b), P, gib(target_b), gib(feat_b), gib(layer_act_b), gib(est_normal), gib(est_recomp));
    result("name=step_mem_estimate impl=dflash normal_gib=%.2f recompute_gib=%.2f params=%.0f", gib(est_normal),
           gib(est_recomp), P);

    // ---- context, stand-ins for weights that would be read (excluded from start-up) -----------------------
    const double t_ctx0 = now_s();
    const std::string device = args.s("device", "cuda");
    if (!device_available(device, "bench_step")) return 0;
    const bool profile = args.flag("profile");
    auto ctx = make_context(device, {.profile_ops = profile});
    const DType act = ctx->compute_dtype();
    ctx->synchronize();
    const double t_ctx = now_s() - t_ctx0;
    note("device %s; CUDA context %.3f s", ctx->describe().c_str(), t_ctx);
    const double t_ex0 = now_s();
    RandPool wpool(*ctx, 0.02, seed), xpool(*ctx, 1.0, seed + 1);
    Tensor embed = wpool.make(act, {V, H});
    Tensor lm_head = wpool.make(act, {V, H});
    std::vector<Tensor> features;
    for (int64_t s = 0; s < seqs; ++s) features.push_back(xpool.make(act, {S, nf * H}));
    ctx->synchronize();
    const double t_excluded = now_s() - t_ex0;

    // ---- drafter (included in start-up) ----------------------------------------------------------------
    const double t_dr0 = now_s();
    DrafterConfig big;
    big.hidden_size = H;
    big.intermediate_size = I;
    big.num_layers = L;
    big.num_heads = nh;
    big.num_kv_heads = nkv;
    big.head_dim = d;
    big.vocab_size = V;
    big.block_size = B;
    big.target_layer_ids = default_target_layer_ids(36, nf);
    big.num_target_layers = 36;
    big.mask_token_id = mask_id;
    big.rms_norm_eps = 1e-6;
    big.rope_theta = 1e6;
    big.max_position_embeddings = 40960;
    big.arch = parse_draft_arch(args.s("arch", "dflash"), "--arch");
    big.validate();
    const std::string impl = big.dflash2() ? "dflash2" : "dflash";
    Drafter drafter(*ctx, big, seed);  // the library's constructor: weights drawn on the device (fill_normal)
    ParamSet& ps = drafter.params();
    ps.flatten_grads(*ctx);  // the gradients in one buffer and AdamW's moments now, as the trainer's drafter worker
    ps.init_moments(*ctx);   // (train/drafter_worker.cpp) sets them up before its first step
    ctx->synchronize();
    const double t_drafter = now_s() - t_dr0;
    note("drafter: %lld parameters (%.3e), created on the device in %.3f s; in use %.2f GiB", (long long)ps.numel(),
         double(ps.numel()), t_drafter, gib(double(ctx->memory().in_use_bytes)));

    // ---- per-sequence host data: tokens, loss mask (all supervised), anchors ---------------------------------
    struct SeqData {
      std::vector<int32_t> tokens, anchors;
      std::vector<uint8_t> mask;
    };
    std::vector<SeqData> sd(static_cast<size_t>(seqs));
    double flops = 0, flops_attn = 0;
    int64_t scored_rows = 0;
    // model FLOPs of one sequence (the formula at the top of this file)
    auto seq_flops = [&](double Sq, double NBq, double Rs, const std::vector<int32_t>& anchors) {
      const double fa = dflash_attn_fwd_flops(anchors, B, nh, d);
      double f = 2.0 * 2.0 * Sq * double(nf * H) * H;                                             // fc
      f += L * 3.0 * 2.0 * NBq * double(H * nh * d + 2 * H * nkv * d + nh * d * H + 3 * H * I);   // block GEMMs
      f += L * 3.0 * 2.0 * Sq * double(H) * double(2 * nkv * d);                                  // context K/V
      f += 3.5 * fa * L;                                                                           // attention
      f += 4.0 * double(V) * double(H) * Rs;                                                       // lm_head
      if (big.dflash2())  // kernel projections (2 per layer) and the selector's hidden projection
        f += L * 2.0 * 3.0 * 2.0 * NBq * double(H) * double(big.conv_coefficients()) +
             3.0 * 2.0 * NBq * double(H) * double(big.selector_rank);
      return f;
    };
    {
      Rng trng(seed, RngPurpose::Test, 6);
      for (int64_t s = 0; s < seqs; ++s) {
        SeqData& q = sd[static_cast<size_t>(s)];
        q.tokens.resize(static_cast<size_t>(S));
        for (auto& t : q.tokens) t = static_cast<int32_t>(trng.below(static_cast<uint64_t>(V)));
        q.mask.assign(static_cast<size_t>(S), 1);
        q.anchors = make_anchors(seed, static_cast<uint64_t>(s), S, N);
        const DraftBatch b = make_draft_batch(q.tokens, q.mask, q.anchors, N, B, mask_id, default_gamma(B));
        scored_rows += static_cast<int64_t>(b.rows.size());
        flops_attn += 3.5 * dflash_attn_fwd_flops(q.anchors, B, nh, d) * L;
        flops += seq_flops(S, NB, double(b.rows.size()), q.anchors);
      }
    }
    note("model FLOPs per step: %.2f TFLOP (attention %.2f), %lld scored rows, %lld draft tokens", flops / 1e12,
         flops_attn / 1e12, (long long)scored_rows, (long long)(seqs * NB));

    OptimConfig oc;  // spec 2.5 defaults: AdamW 0.9/0.999, eps 1e-8, wd 0, clip 1.0
    int64_t step_index = 0;
    struct StepTimes {
      double total, fb, opt, loss;
    };
    auto step = [&](bool recompute) {
      const double t0 = now_s();
      std::vector<DraftBatch> bs;
      double sum_w = 0;
      for (auto& q : sd) {
        bs.push_back(make_draft_batch(q.tokens, q.mask, q.anchors, N, B, mask_id, default_gamma(B)));
        sum_w += bs.back().sum_w;
      }
      double loss_sum = 0;
      for (int64_t s = 0; s < seqs; ++s) {
        DraftInputs in = upload_draft_batch(*ctx, bs[static_cast<size_t>(s)], features[static_cast<size_t>(s)]);
        const DraftStepStats st = drafter.forward_backward(*ctx, in, embed, lm_head, 0.0f,
                                                           static_cast<float>(1.0 / sum_w), true, recompute);
        loss_sum += st.loss_sum;
      }
      ctx->synchronize();
      const double t1 = now_s();
      const double gsq = global_grad_sq(*ctx, ps);
      optimizer_step(*ctx, ps, oc, oc.lr, ++step_index, gsq);
      ctx->synchronize();
      const double t2 = now_s();
      return StepTimes{t2 - t0, t1 - t0, t2 - t1, loss_sum / sum_w};
    };

    double t_first_step_end = 0;
    bool startup_done = false;
    const double draft_tokens = double(seqs * NB);
    for (const std::string& mode : modes) {
      const bool rc = mode == "recompute";
      if (now_s() - t_main > max_seconds) {
        note("skipping mode %s: past --max-seconds %.0f", mode.c_str(), max_seconds);
        continue;
      }
      // warm-up step (the very first one is the start-up step)
      const StepTimes w = step(rc);
      if (!startup_done) {
        t_first_step_end = now_s();
        startup_done = true;
        const double startup = t_first_step_end - t_main - t_excluded;
        result("name=startup impl=dflash s=%.3f cuda_context_s=%.3f drafter_init_s=%.3f first_step_s=%.3f "
               "excluded_weight_fill_s=%.3f mode=%s",
               startup, t_ctx, t_drafter, w.total, t_excluded, mode.c_str());
      }
      note("%s: warm-up step %.3f s (forward+backward %.3f s, clip+AdamW %.3f s), loss %.4f", mode.c_str(), w.total,
           w.fb, w.opt, w.loss);
      const double left = max_seconds - (now_s() - t_main);
      // repeats: what --budget-s allows (at least 2, at most --max-reps), fewer if --max-seconds is near (at least 1)
      const int by_budget = std::max(2, std::min(max_reps, static_cast<int>(budget / std::max(w.total, 1e-3))));
      const int reps = std::max(1, std::min(by_budget, static_cast<int>(left / std::max(w.total, 1e-3)) - 1));
      ctx->reset_peak_memory();
      std::vector<double> tt, tfb, topt;
      double loss = 0;
      for (int r = 0; r < reps; ++r) {
        const StepTimes t = step(rc);
        tt.push_back(t.total);
        tfb.push_back(t.fb);
        topt.push_back(t.opt);
        loss = t.loss;
      }
      const double ts = median(tt);
      const double peak = double(ctx->memory().peak_bytes);
      const double tflops = flops / ts / 1e12;
      result("name=%s impl=%s ms=%.1f tokens_per_s=%.0f tflops=%.1f mfu_989=%.4f peak_gib=%.2f fb_ms=%.1f "
             "opt_ms=%.1f reps=%d loss=%.4f seqs=%lld draft_tokens=%.0f layout=per_sequence",
             rc ? "step_recompute" : "step", impl.c_str(), ts * 1e3, draft_tokens / ts, tflops, tflops / kPeakTflops, gib(peak),
             median(tfb) * 1e3, median(topt) * 1e3, reps, loss, (long long)seqs, draft_tokens);
      if (profile) {  // one more step, op by op (backend/op_profile.h); the timed steps above include the events
        ctx->reset_op_profile();
        const StepTimes pt = step(rc);
        const std::vector<OpProfileRow> rows = ctx->op_profile();
        std::printf("PROFILE mode=%s step_ms=%.1f (one step; device time per op, GEMMs as M x N x K)\n%s",
                    mode.c_str(), pt.total * 1e3, format_op_profile(rows).c_str());
        std::fflush(stdout);
      }
    }

    // ---- case C02: steps with random sequence lengths (every one a shape not seen before) ----------------------
    // Each sequence of each step gets S_i uniform in [256, S] and N_i = min(N, S_i - 1) anchors. Nothing is compiled
    // or tuned per shape, so the step time should follow the step's FLOPs: reported are the per-step ms per model
    // TFLOP (median, max) and the first step's ratio to the median (a first-seen-shape outlier would show there).
    const int c02_steps = static_cast<int>(args.i("c02-steps", 50));
    if (c02_steps > 0 && !modes.empty() && now_s() - t_main < max_seconds) {
      const bool rc = modes.front() == "recompute";
      Rng lr(seed, RngPurpose::Test, 9);
      std::vector<double> ratio, tms;
      double fsum = 0;
      for (int st = 0; st < c02_steps; ++st) {
        const double t0 = now_s();
        std::vector<DraftBatch> bs;
        std::vector<int64_t> Ss;
        double sum_w = 0, fl = 0;
        for (int64_t s = 0; s < seqs; ++s) {
          const int64_t Si = 256 + static_cast<int64_t>(lr.below(static_cast<uint64_t>(S - 256 + 1)));
          const int64_t Ni = std::min<int64_t>(N, Si - 1);
          const SeqData& q = sd[static_cast<size_t>(s)];
          const std::vector<int32_t> toks(q.tokens.begin(), q.tokens.begin() + Si);
          const std::vector<uint8_t> msk(q.mask.begin(), q.mask.begin() + Si);
          const std::vector<int32_t> an = make_anchors(seed + 1000 + static_cast<uint64_t>(st), static_cast<uint64_t>(s),
                                                       Si, Ni);
          bs.push_back(make_draft_batch(toks, msk, an, Ni, B, mask_id, default_gamma(B)));
          sum_w += bs.back().sum_w;
          fl += seq_flops(double(Si), double(Ni * B), double(bs.back().rows.size()), an);
          Ss.push_back(Si);
        }
        for (int64_t s = 0; s < seqs; ++s) {
          const Tensor feat = features[static_cast<size_t>(s)].slice(0, Ss[static_cast<size_t>(s)]);
          DraftInputs in = upload_draft_batch(*ctx, bs[static_cast<size_t>(s)], feat);
          drafter.forward_backward(*ctx, in, embed, lm_head, 0.0f, static_cast<float>(1.0 / sum_w), true, rc);
        }
        optimizer_step(*ctx, ps, oc, oc.lr, ++step_index, global_grad_sq(*ctx, ps));
        ctx->synchronize();
        const double ms = (now_s() - t0) * 1e3;
        tms.push_back(ms);
        ratio.push_back(ms / (fl / 1e12));
        fsum += fl;
        if (now_s() - t_main > max_seconds + 60) break;  // a slow device: report what ran
      }
      std::vector<double> sorted = ratio;
      std::sort(sorted.begin(), sorted.end());
      const double med = sorted[sorted.size() / 2], mx = sorted.back();
      result("name=c02 impl=dflash steps=%zu ms_min=%.1f ms_max=%.1f ms_per_tflop_p50=%.3f ms_per_tflop_max=%.3f "
             "max_over_p50=%.3f first_over_p50=%.3f mode=%s",
             ratio.size(), *std::min_element(tms.begin(), tms.end()), *std::max_element(tms.begin(), tms.end()), med,
             mx, mx / med, ratio.front() / med, rc ? "recompute" : "normal");
    }

    // ---- cuBLAS ceiling through Context::linear (same run) --------------------------------------------------
    if (gemm_n > 0) {
      const double ceil = gemm_ceiling_tflops(*ctx, wpool, gemm_n);
      result("name=gemm_ceiling impl=dflash n=%lld tflops=%.1f", (long long)gemm_n, ceil);
    }
    result("name=step_flops impl=dflash tflop=%.6g attn_tflop=%.6g scored_rows=%lld", flops / 1e12, flops_attn / 1e12,
           (long long)scored_rows);

    return 0;
  } catch (const std::exception& e) {
    std::printf("RESULT name=step_error impl=dflash msg=\"%s\"\n", e.what());
    std::fflush(stdout);
    std::fprintf(stderr, "bench_step: %s\n", e.what());
    return 1;
  }
}
