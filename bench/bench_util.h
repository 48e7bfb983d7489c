// bench/bench_util.h — helpers shared by the issue-6 benchmarks (bench_attention, bench_step, bench_prefill):
// argument parsing, wall-clock timing around Context::synchronize(), medians, fast random device tensors, the
// anchor generator shared with bench/torch_ref.py, FLOP formulas and the RESULT line format.
//
// Timing: the Context does not expose its CUDA stream, so a measurement is the wall time between two
// ctx.synchronize() calls around the work (the same instants CUDA events on that stream would record, plus a
// few microseconds of synchronisation; every measured region here runs for milliseconds or more).
//
// Output: one line per measurement, `RESULT name=<id> key=value ...` (bench/run_all.sh parses these).
#pragma once
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "backend/context.h"
#include "core/tensor.h"

namespace bench {

using dflash::Context;
using dflash::DType;
using dflash::Shape;
using dflash::Tensor;

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

inline double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// --key value, --key=value, or a bare --flag (value "1").
class Args {
 public:
  Args(int argc, char** argv) {
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      if (a.rfind("--", 0) != 0) continue;
      a = a.substr(2);
      const size_t eq = a.find('=');
      if (eq != std::string::npos) {
        kv_[a.substr(0, eq)] = a.substr(eq + 1);
      } else if (i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0) {
        kv_[a] = argv[++i];
      } else {
        kv_[a] = "1";
      }
    }
  }
  int64_t i(const std::string& k, int64_t def) const {
    auto it = kv_.find(k);
    return it == kv_.end() ? def : std::strtoll(it->second.c_str(), nullptr, 10);
  }
  double f(const std::string& k, double def) const {
    auto it = kv_.find(k);
    return it == kv_.end() ? def : std::strtod(it->second.c_str(), nullptr);
  }
  std::string s(const std::string& k, const std::string& def) const {
    auto it = kv_.find(k);
    return it == kv_.end() ? def : it->second;
  }
  bool flag(const std::string& k) const { return kv_.count(k) && kv_.at(k) != "0"; }

 private:
  std::map<std::string, std::string> kv_;
};

// One printf-style line after `prefix`, flushed at once (the logs are read even when a later step is killed).
inline void print_line(const char* prefix, const char* fmt, va_list ap) {
  std::printf("%s", prefix);
  std::vfprintf(stdout, fmt, ap);
  std::printf("\n");
  std::fflush(stdout);
}
// A RESULT line (what run_all.sh's table reads) and a "# " note.
inline void result(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  print_line("RESULT ", fmt, ap);
  va_end(ap);
}
inline void note(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  print_line("# ", fmt, ap);
  va_end(ap);
}

// ---- anchors shared with bench/torch_ref.py ---------------------------------------------------------------
// Stratified random anchors, identical in the C++ and Python benches (so both count the same FLOPs):
//   state_s = seed * 0x9E3779B97F4A7C15 + s + 1 (mod 2^64);  next: state = state * 6364136223846793005 +
//   1442695040888963407 (mod 2^64), u = (state >> 11) * 2^-53
//   gap = (S - 1) / N (integer), a_j = (j * (S - 1)) / N + min(gap - 1, floor(u_j * gap))
// -> sorted, distinct, within [0, S-2], about uniform over the sequence (what sampled candidates of a fully
// supervised sequence look like). Needs S - 1 >= N.
inline std::vector<int32_t> make_anchors(uint64_t seed, uint64_t seq, int64_t S, int64_t N) {
  const int64_t gap = (S - 1) / N;
  if (gap < 1) {
    std::fprintf(stderr, "make_anchors: S - 1 = %lld < N = %lld\n", (long long)(S - 1), (long long)N);
    std::exit(2);
  }
  uint64_t st = seed * 0x9E3779B97F4A7C15ull + seq + 1;
  std::vector<int32_t> a(static_cast<size_t>(N));
  for (int64_t j = 0; j < N; ++j) {
    st = st * 6364136223846793005ull + 1442695040888963407ull;
    const double u = static_cast<double>(st >> 11) * (1.0 / 9007199254740992.0);
    const int64_t off = std::min<int64_t>(gap - 1, static_cast<int64_t>(std::floor(u * static_cast<double>(gap))));
    a[static_cast<size_t>(j)] = static_cast<int32_t>((j * (S - 1)) / N + off);
  }
  return a;
}

// DFlash attention work on unmasked (query, key) pairs, one sequence: forward 4 * d * heads * sum_j B*(a_j + B)
// (QK^T and PV, 2 FLOPs per multiply-add each); backward counted as 2.5 x forward.
// window > 0 (sliding-window layer, spec 2.3): slot i sees min(a_j, W - 1 - i) context keys (none below 0) and
// the i + 1 block keys 0..i.
inline double dflash_attn_fwd_flops(const std::vector<int32_t>& anchors, int64_t B, int64_t nh, int64_t d,
                                    int64_t window = 0) {
  double pairs = 0;
  for (int32_t a : anchors) {
    if (window <= 0) {
      pairs += static_cast<double>(B) * static_cast<double>(a + B);
      continue;
    }
    for (int64_t i = 0; i < B; ++i)
      pairs += static_cast<double>(std::max<int64_t>(0, std::min<int64_t>(a, window - 1 - i)) + i + 1);
  }
  return 4.0 * static_cast<double>(d) * static_cast<double>(nh) * pairs;
}

// ---- fast random device tensors -----------------------------------------------------------------------------
// A pool of kPool normal values (bf16, given std) on the device, from a cheap host generator; any BF16 or F32
// device tensor is filled by device-to-device copies of pool windows at pseudo-random offsets (a few thousand
// copies for 16 GB, milliseconds of device time; no per-element host loop over the weights).
class RandPool {
 public:
  static constexpr int64_t kPool = int64_t{1} << 22;  // 4M values
  static constexpr int64_t kSlack = int64_t{1} << 16;

  RandPool(Context& ctx, double stdev, uint64_t seed) : ctx_(ctx), state_(seed * 0xD1B54A32D192ED03ull + 7) {
    const int64_t n = kPool + kSlack;
    Tensor h = dflash::cpu_empty(DType::BF16, {n});
    uint16_t* p = h.ptr<uint16_t>();
    for (int64_t i = 0; i < n; i += 2) {  // Box-Muller on a xorshift64* stream
      const double u1 = std::max(uniform(), 1e-300), u2 = uniform();
      const double r = std::sqrt(-2.0 * std::log(u1)) * stdev;
      p[i] = dflash::f32_to_bf16(static_cast<float>(r * std::cos(6.283185307179586 * u2)));
      if (i + 1 < n) p[i + 1] = dflash::f32_to_bf16(static_cast<float>(r * std::sin(6.283185307179586 * u2)));
    }
    pool_ = ctx.to_device(h);
  }

  // Fills a device tensor (BF16 or F32) with pool values.
  void fill(const Tensor& t) {
    Tensor flat = t.reshape({t.numel()});
    for (int64_t o = 0; o < flat.numel(); o += kPool) {
      const int64_t len = std::min(kPool, flat.numel() - o);
      const int64_t src_off = static_cast<int64_t>(next() % static_cast<uint64_t>(kSlack));
      ctx_.copy(flat.slice(o, o + len), pool_.slice(src_off, src_off + len));
    }
  }
  Tensor make(DType dt, Shape s) {
    Tensor t = ctx_.empty(dt, std::move(s));
    fill(t);
    return t;
  }

 private:
  uint64_t next() {
    state_ ^= state_ >> 12;
    state_ ^= state_ << 25;
    state_ ^= state_ >> 27;
    return state_ * 0x2545F4914F6CDD1Dull;
  }
  double uniform() { return static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0); }

  Context& ctx_;
  uint64_t state_;
  Tensor pool_;
};

// A device tensor of the given shape with every element = value (small tensors: norm weights).
inline Tensor const_tensor(Context& ctx, DType dt, Shape s, float value) {
  Tensor h = dflash::cpu_empty(DType::F32, s);
  for (float& x : h.span<float>()) x = value;
  return ctx.to_device(h, dt);
}

// The device to run on (--device, default "cuda"; "cpu" runs a smoke test at small shapes). False, after saying why,
// when this build cannot run it (no CUDA backend compiled in).
inline bool device_available(const std::string& dev, const char* prog) {
#ifndef DFLASH_HAVE_CUDA
  if (dev.rfind("cuda", 0) == 0) {
    std::printf("%s: this build has no CUDA backend (configure with nvcc present); nothing measured\n", prog);
    return false;
  }
#else
  (void)dev;
  (void)prog;
#endif
  return true;
}

inline double gib(double bytes) { return bytes / double(int64_t{1} << 30); }

// Wall seconds of fn() between two synchronisations of ctx.
template <class F>
double timed(Context& ctx, F&& fn) {
  ctx.synchronize();
  const double t0 = now_s();
  fn();
  ctx.synchronize();
  return now_s() - t0;
}

// A warm-up call of fn (first_s), then reps = 2 .. max_reps timed repeats fitting budget_s (the peak memory counted
// from their start): the median seconds.
struct Timing {
  double median_s = 0, first_s = 0;
  int reps = 0;
};
template <class F>
Timing measure(Context& ctx, F&& fn, double budget_s, int max_reps) {
  Timing t;
  t.first_s = timed(ctx, fn);
  t.reps = std::max(2, std::min(max_reps, static_cast<int>(budget_s / std::max(t.first_s, 1e-4))));
  ctx.reset_peak_memory();
  std::vector<double> ts;
  for (int r = 0; r < t.reps; ++r) ts.push_back(timed(ctx, fn));
  t.median_s = median(ts);
  return t;
}

// The dense bf16 peak of the H200 SXM datasheet (issue 6's MFU reference).
constexpr double kPeakTflops = 989.0;

// Measures the bf16 GEMM ceiling through the Context's linear op: y[M,N] = x[M,K] w[N,K]^T at n^3, random data.
// Returns TFLOP/s (median over batches of `per_batch` GEMMs between two synchronisations).
inline double gemm_ceiling_tflops(Context& ctx, RandPool& pool, int64_t n, int batches = 5, int per_batch = 5) {
  const DType dt = ctx.compute_dtype();
  Tensor x = pool.make(dt, {n, n}), w = pool.make(dt, {n, n});
  Tensor y = ctx.empty(dt, {n, n});
  for (int i = 0; i < 3; ++i) ctx.linear(x, w, nullptr, y);
  ctx.synchronize();
  std::vector<double> per;
  for (int b = 0; b < batches; ++b) {
    const double t0 = now_s();
    for (int i = 0; i < per_batch; ++i) ctx.linear(x, w, nullptr, y);
    ctx.synchronize();
    per.push_back((now_s() - t0) / per_batch);
  }
  const double s = median(per);
  return 2.0 * double(n) * double(n) * double(n) / s / 1e12;
}

}  // namespace bench
