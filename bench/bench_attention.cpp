// bench/bench_attention.cpp — DFlash attention (spec 2.3) forward and forward+backward on "cuda" at the Qwen3-8B
// drafter shapes of issue 6: 32 q heads, 8 kv heads, head_dim 128, B 16, N 512 sorted anchors per sequence, S 3072,
// 4 sequences, bf16. Ours runs PER SEQUENCE (one Context::dflash_attention call per sequence, as the trainer does);
// a measurement is the time of all 4 sequences. The PyTorch side (bench/torch_ref.py --part attn) runs the same
// anchors batched as one flex_attention call of batch 4.
//
// FLOPs counted on the unmasked work only: forward 4 * d * nh * sum over sequences and blocks B*(a_j + B);
// backward 2.5 x forward; forward+backward 3.5 x forward.
// Timing: wall time between two Context::synchronize() calls (see bench_util.h), after one warm-up, median of
// repeats (count chosen to fit --budget-s seconds per measurement, at least 3). The inputs of the 4 sequences
// (~110 MB each) do not fit in the 60 MB L2 together, so consecutive sequences read cold inputs anyway.
//
// Also the target's causal prefill attention (Context::attention_causal_batch, as Target::run calls it) of one
// sequence of --causal-T tokens and of --causal-batch stacked sequences of --causal-T-batch tokens (one call, one
// launch on the H200) with the same heads: RESULT
// name=attn_causal_<batch>x<T>,
// FLOPs 4 * d * nh * T (T + 1) / 2 per sequence (the unmasked pairs, as bench_prefill counts them). A call takes
// 0.1-0.2 ms, so the causal rows are timed two ways, as torch_ref.py times SDPA: ms / tflops with per_sample calls
// back to back per timed sample (~5 ms: the kernel's throughput, as a prefill issues one layer after another) and
// ms_single / tflops_single with one call per sample (its launch and synchronisation latency inside).
// Built with -DDFLASH_FWD_TIMELINE (diagnostic: clock stamps per CTA in the forward kernel), each causal row is
// followed by a TIMELINE line: where the SMs' time went in the last launch (attention_wgmma.cu).
//
//   bench_attention [--seqs 4] [--S 3072] [--N 512] [--B 16] [--nh 32] [--nkv 8] [--d 128] [--seed 1]
//                   [--budget-s 8] [--max-reps 20] [--window 0] [--causal-T 3072] [--causal-batch 4]
//                   [--causal-T-batch 1024] [--dflash 1]   (--causal-T 0: no causal rows; --dflash 0: no DFlash rows)
// --window W > 0: a sliding-window layer (FLOPs on the pairs the window leaves; W 0 = full attention, the
// reference the windowed time is read against).
// The hybrid targets' full attention (Qwen3.5-35B-A3B: head dim 256, 16 / 2 heads, 4 x 3072 tokens):
//   bench_attention --dflash 0 --d 256 --nh 16 --nkv 2 --causal-T 3072 --causal-batch 4 --causal-T-batch 3072
// and with DFLASH_ATTN_WGMMA=0 in the environment the same rows on the mma.sync forward (attention_tc.cu) instead of
// the wgmma one (attention_wgmma.cu).
#include <cmath>
#include <cstdio>
#include <vector>

#include "bench_util.h"

using namespace dflash;
using namespace bench;
#ifdef DFLASH_FWD_TIMELINE
namespace dflash::cuda {
void attn_fwd_timeline_report(const char* label);
}
#endif

int main(int argc, char** argv) {
  try {
    const Args args(argc, argv);
    const int64_t seqs = args.i("seqs", 4), S = args.i("S", 3072), N = args.i("N", 512), B = args.i("B", 16);
    const int64_t nh = args.i("nh", 32), nkv = args.i("nkv", 8), d = args.i("d", 128);
    const uint64_t seed = static_cast<uint64_t>(args.i("seed", 1));
    const double budget = args.f("budget-s", 8.0);
    const int max_reps = static_cast<int>(args.i("max-reps", 20));
    const int64_t window = args.i("window", 0);
    const bool dflash_rows = args.i("dflash", 1) != 0;
    const int64_t NB = N * B;

    const std::string device = args.s("device", "cuda");
    if (!device_available(device, "bench_attention")) return 0;
    auto ctx = make_context(device);
    const DType act = ctx->compute_dtype();
    note("bench_attention on %s: seqs %lld, S %lld, N %lld, B %lld, heads %lld/%lld, d %lld, %s, per sequence",
         ctx->describe().c_str(), (long long)seqs, (long long)S, (long long)N, (long long)B, (long long)nh,
         (long long)nkv, (long long)d, dtype_name(act));
    RandPool pool(*ctx, 1.0, seed);

    struct Seq {
      DFlashAttnArgs a;
      Tensor out, lse, dout, dq, dkc, dvc, dkb, dvb;
    };
    std::vector<Seq> sq(dflash_rows ? static_cast<size_t>(seqs) : 0);
    double flops_fwd = 0;
    for (int64_t s = 0; s < static_cast<int64_t>(sq.size()); ++s) {
      const std::vector<int32_t> anc = make_anchors(seed, static_cast<uint64_t>(s), S, N);
      flops_fwd += dflash_attn_fwd_flops(anc, B, nh, d, window);
      Seq& q = sq[static_cast<size_t>(s)];
      q.a.q = pool.make(act, {NB, nh, d});
      q.a.k_ctx = pool.make(act, {S, nkv, d});
      q.a.v_ctx = pool.make(act, {S, nkv, d});
      q.a.k_blk = pool.make(act, {NB, nkv, d});
      q.a.v_blk = pool.make(act, {NB, nkv, d});
      q.a.anchors = ctx->to_device(cpu_tensor_i32(anc, {N}));
      Tensor valid = cpu_empty(DType::U8, {N});
      for (uint8_t& v : valid.span<uint8_t>()) v = 1;
      q.a.valid = ctx->to_device(valid);
      q.a.block_size = static_cast<int>(B);
      q.a.window = static_cast<int>(window);
      q.a.scale = 1.0f / std::sqrt(static_cast<float>(d));
      q.out = ctx->empty(act, {NB, nh, d});
      q.lse = ctx->empty(DType::F32, {NB, nh});
      q.dout = pool.make(act, {NB, nh, d});
      q.dq = ctx->empty(act, {NB, nh, d});
      q.dkc = ctx->empty(act, {S, nkv, d});
      q.dvc = ctx->empty(act, {S, nkv, d});
      q.dkb = ctx->empty(act, {NB, nkv, d});
      q.dvb = ctx->empty(act, {NB, nkv, d});
    }
    ctx->synchronize();

    auto fwd = [&] {
      for (auto& q : sq) ctx->dflash_attention(q.a, q.out, q.lse);
    };
    auto fwd_bwd = [&] {
      for (auto& q : sq) {
        ctx->dflash_attention(q.a, q.out, q.lse);
        ctx->dflash_attention_backward(q.a, q.out, q.lse, q.dout, q.dq, q.dkc, q.dvc, q.dkb, q.dvb);
      }
    };
    // One call timed between synchronisations; measure: the median of repeats, their count from a first (warm-up) time.
    auto once = [&](auto&& fn) {
      ctx->synchronize();
      const double t0 = now_s();
      fn();
      ctx->synchronize();
      return now_s() - t0;
    };
    auto measure = [&](auto&& fn, double probe) {
      const int reps = std::max(3, std::min(max_reps, static_cast<int>(budget / std::max(probe, 1e-4))));
      std::vector<double> ts;
      for (int r = 0; r < reps; ++r) ts.push_back(once(fn));
      return std::pair<double, int>(median(ts), reps);
    };
    if (dflash_rows) {
      note("attention forward work: %.1f GFLOP for %lld sequences (unmasked pairs only)", flops_fwd / 1e9,
           (long long)seqs);
      const double t_first_fwd = once(fwd);  // (warm-up of both, timing each once to choose the repeat counts)
      const double t_first_fb = once(fwd_bwd);
      note("first calls: forward %.1f ms, forward+backward %.1f ms (no JIT: kernels are compiled ahead of time)",
           t_first_fwd * 1e3, t_first_fb * 1e3);
      const auto [tf, rf] = measure(fwd, t_first_fwd);
      result("name=attn_fwd impl=dflash ms=%.3f tflops=%.2f per_seq_ms=%.3f seqs=%lld reps=%d layout=per_sequence "
             "window=%lld", tf * 1e3, flops_fwd / tf / 1e12, tf * 1e3 / double(seqs), (long long)seqs, rf,
             (long long)window);
#ifdef DFLASH_FWD_TIMELINE
      dflash::cuda::attn_fwd_timeline_report("dflash forward (the last sequence's launch)");
#endif
      const auto [tfb, rfb] = measure(fwd_bwd, t_first_fb);
      result("name=attn_fwd_bwd impl=dflash ms=%.3f tflops=%.2f per_seq_ms=%.3f seqs=%lld reps=%d layout=per_sequence "
             "window=%lld", tfb * 1e3, 3.5 * flops_fwd / tfb / 1e12, tfb * 1e3 / double(seqs), (long long)seqs, rfb,
             (long long)window);
      const double tb = std::max(tfb - tf, 1e-9);
      result("name=attn_bwd impl=dflash ms=%.3f tflops=%.2f derived=fwd_bwd_minus_fwd", tb * 1e3,
             2.5 * flops_fwd / tb / 1e12);
      result("name=attn_first_call impl=dflash fwd_ms=%.3f fwd_bwd_ms=%.3f", t_first_fwd * 1e3, t_first_fb * 1e3);
      result("name=attn_mem impl=dflash peak_gib=%.3f", gib(double(ctx->memory().peak_bytes)));
    }
    // the target's causal prefill attention: 1 x T and batch x T_batch
    const int64_t cT = args.i("causal-T", 3072), cB = args.i("causal-batch", 4), cTb = args.i("causal-T-batch", 1024);
    for (const auto& [T, nseq] : {std::pair<int64_t, int64_t>{cT, 1}, std::pair<int64_t, int64_t>{cTb, cB}}) {
      if (T <= 0 || nseq <= 0) continue;
      // the sequences stacked as the target stacks a batch: one attention_causal_batch call (one launch)
      const Tensor q = pool.make(act, {nseq * T, nh, d}), k = pool.make(act, {nseq * T, nkv, d}),
                   v = pool.make(act, {nseq * T, nkv, d}), out = ctx->empty(act, {nseq * T, nh, d});
      std::vector<CausalSeq> seqs;
      for (int64_t i = 0; i < nseq; ++i) {
        CausalSeq c;
        c.begin = i * T;
        c.end = (i + 1) * T;
        c.k = k.slice(c.begin, c.end);
        c.v = v.slice(c.begin, c.end);
        seqs.push_back(c);
      }
      auto causal = [&] { ctx->attention_causal_batch(q, out, seqs, 1.0f / std::sqrt(static_cast<float>(d))); };
      const double flops = 4.0 * double(d) * double(nh) * double(T) * double(T + 1) / 2.0 * double(nseq);
      // one call per timed sample (host clock around it: launch and synchronisation latency inside), and `per` calls
      // back to back per sample (the kernel's throughput, as the target's prefill issues them); torch_ref.py times
      // SDPA both ways too
      const double probe = once(causal);
      const double t1 = measure(causal, probe).first;
      const int per = std::max(1, static_cast<int>(std::lround(5e-3 / std::max(t1, 1e-6))));
      auto many = [&] {
        for (int i = 0; i < per; ++i) causal();
      };
      const auto [tm, rc] = measure(many, t1 * per);
      const double tc = tm / per;
      result("name=attn_causal_%lldx%lld impl=dflash ms=%.3f tflops=%.2f reps=%d per_sample=%d ms_single=%.3f "
             "tflops_single=%.2f layout=batched", (long long)nseq, (long long)T, tc * 1e3, flops / tc / 1e12, rc, per,
             t1 * 1e3, flops / t1 / 1e12);
#ifdef DFLASH_FWD_TIMELINE
      {
        const std::string label = std::to_string(nseq) + "x" + std::to_string(T);
        dflash::cuda::attn_fwd_timeline_report(label.c_str());
      }
#endif
    }
    return 0;
  } catch (const std::exception& e) {
    std::printf("RESULT name=attn_error impl=dflash msg=\"%s\"\n", e.what());
    std::fflush(stdout);
    std::fprintf(stderr, "bench_attention: %s\n", e.what());
    return 1;
  }
}
