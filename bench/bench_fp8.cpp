// bench/bench_fp8.cpp — FP8 linears against bf16 ones (issue "Targets in the precision they are published in": FP8
// GEMM >= 1.6x our bf16 GEMM at Qwen3-8B linear shapes), both through Context::linear on one device in one run.
// Shapes: the Qwen3-8B target's projections (H 4096, 32/8 heads of 128, intermediate 12288) at M = --tokens rows
// (default 4 x 3072, a prefill batch): q, k+v as one [2048, 4096], o [4096, 4096], gate / up [12288, 4096],
// down [4096, 12288]. Per shape, medians of --reps calls between synchronisations:
//   bf16:  y = x W^T, W bf16 (cuBLASLt bf16)
//   fp8:   the same with W quantized in 128 x 128 blocks (x quantized per token and 128 columns inside the op:
//          the time includes that quantization)
//   fp8c:  per-channel W (compressed-tensors FP8-dynamic), x per token
// Prints RESULT lines and a table; the last table row is the sum over one layer's projections (each once).
//
//   bench_fp8 [--tokens 12288] [--reps 20] [--device cuda]
#include <cstdio>
#include <string>
#include <vector>

#include "bench_util.h"

using namespace dflash;
using namespace bench;

int main(int argc, char** argv) {
  try {
    const Args args(argc, argv);
    const std::string device = args.s("device", "cuda");
    if (!device_available(device, "bench_fp8")) return 0;
    const bool small = device.rfind("cpu", 0) == 0;
    const int64_t M = args.i("tokens", small ? 64 : 4 * 3072), reps = args.i("reps", small ? 2 : 20);
    const int64_t H = small ? 256 : 4096, I = small ? 512 : 12288, KV = small ? 128 : 2048;
    auto ctx = make_context(device);
    const DType act = ctx->compute_dtype();
    RandPool wpool(*ctx, 0.02, 1), xpool(*ctx, 1.0, 2);
    struct Shape3 {
      const char* name;
      int64_t N, K;
    };
    const std::vector<Shape3> shapes = {{"q_proj", H, H}, {"kv_proj", KV, H}, {"o_proj", H, H},
                                        {"gate_proj", I, H}, {"up_proj", I, H}, {"down_proj", H, I}};
    auto time_it = [&](auto&& fn) {
      for (int i = 0; i < 2; ++i) fn();
      std::vector<double> ts;
      for (int64_t r = 0; r < reps; ++r) ts.push_back(timed(*ctx, fn));
      return median(ts);
    };
    std::printf("# bench_fp8 on %s, M = %lld tokens\n", ctx->describe().c_str(), static_cast<long long>(M));
    std::printf("%-10s %6s %6s %10s %10s %10s %8s %8s %9s\n", "proj", "N", "K", "bf16 ms", "fp8 ms", "fp8c ms",
                "fp8 x", "fp8c x", "fp8 TF/s");
    double sb = 0, sf = 0, sc = 0, flops = 0;
    for (const Shape3& s : shapes) {
      const Tensor x = xpool.make(act, {M, s.K}), w = wpool.make(act, {s.N, s.K});
      const LinearWeight q = ctx->quantize_fp8(w, 128, 128), qc = ctx->quantize_fp8(w, 1, s.K);
      Tensor y = ctx->empty(act, {M, s.N});
      const double tb = time_it([&] { ctx->linear(x, w, nullptr, y); });
      const double tf = time_it([&] { ctx->linear(x, q, nullptr, y); });
      const double tc = time_it([&] { ctx->linear(x, qc, nullptr, y); });
      const double fl = 2.0 * double(M) * double(s.N) * double(s.K);
      sb += tb;
      sf += tf;
      sc += tc;
      flops += fl;
      std::printf("%-10s %6lld %6lld %10.3f %10.3f %10.3f %8.2f %8.2f %9.0f\n", s.name, static_cast<long long>(s.N),
                  static_cast<long long>(s.K), tb * 1e3, tf * 1e3, tc * 1e3, tb / tf, tb / tc, fl / tf / 1e12);
      result("name=fp8_gemm proj=%s M=%lld N=%lld K=%lld bf16_ms=%.4f fp8_block_ms=%.4f fp8_channel_ms=%.4f "
             "speedup_block=%.3f speedup_channel=%.3f fp8_tflops=%.1f bf16_tflops=%.1f",
             s.name, static_cast<long long>(M), static_cast<long long>(s.N), static_cast<long long>(s.K), tb * 1e3,
             tf * 1e3, tc * 1e3, tb / tf, tb / tc, fl / tf / 1e12, fl / tb / 1e12);
    }
    std::printf("%-10s %6s %6s %10.3f %10.3f %10.3f %8.2f %8.2f %9.0f\n", "layer", "", "", sb * 1e3, sf * 1e3,
                sc * 1e3, sb / sf, sb / sc, flops / sf / 1e12);
    result("name=fp8_gemm proj=layer M=%lld bf16_ms=%.4f fp8_block_ms=%.4f fp8_channel_ms=%.4f speedup_block=%.3f "
           "speedup_channel=%.3f",
           static_cast<long long>(M), sb * 1e3, sf * 1e3, sc * 1e3, sb / sf, sb / sc);
  } catch (const std::exception& e) {
    std::printf("RESULT name=fp8_gemm_error msg=\"%s\"\n", e.what());
    return 1;
  }
  return 0;
}
