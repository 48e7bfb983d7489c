// cuda/conv1d_causal.cu — the Gated DeltaNet's depthwise causal convolution with SiLU over one sequence, or over the
// sequences of a packed prefill in one launch (backend/context.h conv1d_causal; cpu/conv1d_causal.cpp is the reference):
//   y[t, c] = silu(sum_{j < K} w[c, j] xin[t + j, c]),   xin = [window ; x],   x, y [T, C], w [C, K], window [K - 1, C]
// bf16 on the device (fp32 runs the same templates), fp32 accumulation, one rounding per output.
//
// Memory-bound: the ideal moves x once and y once (Qwen3.5-35B-A3B's prefill: T = 3072, C = 8192, K = 4, bf16: 2 x 48
// MiB, ~25 us at the H200's ~4 TB/s; one thread per (t, c) with 2-byte loads, int64 divisions and each input read K
// times, as k_conv1d does, takes ~0.7 ms: bench/NOTES.md 26). So k_conv1d_run gives each thread V channels (one
// 16-byte access: 8 bf16 or 4 fp32) and a run of kRun consecutive tokens:
//   * its V x K weights in registers (loaded once);
//   * the last K - 1 input rows in registers, a window that slides down the run: each row of x is loaded once per run,
//     plus K - 1 halo rows above the run (read by the run before as well: L2 hits, the runs of one row of blocks
//     being launched together); so K is a template parameter (K <= kRunMaxK; within a batch the shifts are renames);
//   * rows loaded kBatch at a time, then computed: kBatch 16-byte loads in flight per thread; the loop over a run's
//     batches is not unrolled (~1k instructions instead of ~4k);
//   * threads side by side over channels (coalesced rows), blockIdx.y over runs;
//   * several sequences (a packed prefill, seqs): each is cut into its own runs (a run never straddles two sequences,
//     each sequence's window starts at zero) and blockIdx.y walks the runs of all of them (RunSeqs: up to kMaxSeqs
//     sequences per launch), so the prefill is one launch per layer, not one per sequence (bench/NOTES.md 26).
// The arithmetic per output is k_conv1d's, in the same order (acc = 0; acc += w[c, j] xin[t + j, c] for
// j = 0..K-1; acc / (1 + expf(-acc)); one rounding), so the results are bit-identical to k_conv1d's. That
// arithmetic is ~24 instructions per output (4 FFMA, expf ~9, the IEEE division ~9, bf16 unpack / pack ~2), so the
// prefill's call is about as much issue time (~20 us on 132 SMs) as memory time (~100 MB: ~25 us); bf16, K = 4: 113
// registers, no spills, 4 blocks of 128 per SM.
// Vectors need C % V == 0 and x, y, the window 16-byte aligned; otherwise the same kernel runs with V = 1 (2- or
// 4-byte accesses, still one load per input). K above kRunMaxK (no model so far) falls back to k_conv1d, one thread
// per (t, c) reading each input K times.
//
// The window moves on to the last K - 1 rows of xin (they may come from the old window when T < K - 1). With a single
// run (T <= kRun: decode and verify steps) the thread that read a channel group's window writes it, after its outputs
// (k_conv1d_run keep: one launch); otherwise the window belongs to another block's run and k_conv1d_window moves it
// after the convolution (one thread per channel, the rows read into registers first).
#include <algorithm>
#include <span>

#include "backend/cuda/common.cuh"

namespace dflash::cuda {

namespace {

constexpr int kMaxWindow = 64;  // K - 1 rows at most (linear_conv_kernel_dim <= 64, io/model_family_hybrid.cpp)
constexpr int kRunMaxK = 8;     // k_conv1d_run's K (Qwen3-Next / Qwen3.5: 4); above: k_conv1d
constexpr int kRun = 16;        // tokens per thread: K - 1 halo rows per 16 (from L2)
constexpr int kBatch = 4;       // rows loaded before they are computed
constexpr int kRunThreads = 128;
constexpr int kMaxSeqs = 32;  // sequences per k_conv1d_run launch

// The sequences of one k_conv1d_run launch: sequence s is rows [off[s], off[s + 1]) of x and y, and its runs of kRun
// tokens are the launch's runs [run[s], run[s + 1]) (run[0] = 0).
struct RunSeqs {
  int n;
  int64_t off[kMaxSeqs + 1];
  int64_t run[kMaxSeqs + 1];
};

template <class T>
__device__ __forceinline__ float xin(const T* x, const T* state, int64_t i, int c, int C, int P) {
  if (i >= P) return to_f(x[(i - P) * C + c]);
  return state ? to_f(state[i * C + c]) : 0.f;
}

// V consecutive elements at p, as floats (V = 1, or one 16-byte access: 8 bf16 / 4 fp32) and back.
template <int V, class T>
__device__ __forceinline__ void load_row(const T* p, float (&f)[V]) {
  if constexpr (V == 1) {
    f[0] = to_f(*p);
  } else if constexpr (sizeof(T) == 2) {
    static_assert(V == 8);
    const uint4 v = *reinterpret_cast<const uint4*>(p);
    bf16x8_to_f(v, f);
  } else {
    static_assert(V == 4 && sizeof(T) == 4);
    const float4 v = *reinterpret_cast<const float4*>(p);
    f[0] = v.x, f[1] = v.y, f[2] = v.z, f[3] = v.w;
  }
}
template <int V, class T>
__device__ __forceinline__ void store_row(T* p, const float (&f)[V]) {
  if constexpr (V == 1) {
    *p = from_f<T>(f[0]);
  } else if constexpr (sizeof(T) == 2) {
    *reinterpret_cast<uint4*>(p) = f_to_bf16x8(f);
  } else {
    float4 v;
    v.x = f[0], v.y = f[1], v.z = f[2], v.w = f[3];
    *reinterpret_cast<float4*>(p) = v;
  }
}
template <int V, class T>
__device__ __forceinline__ void copy_row(T* dst, const T* src) {
  if constexpr (V == 1) {
    *dst = *src;
  } else {
    *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
  }
}

// Thread (blockIdx.x * blockDim.x + threadIdx.x) owns channels [c0, c0 + V); blockIdx.y walks the runs of kRun
// tokens of sq's sequences. state: the window [K - 1, C] or null (zeros; always with several sequences); not restrict:
// with keep (one sequence of a single run, gridDim.y == 1) each thread moves its channels of it on after its outputs.
template <class T, int K, int V>
__global__ void __launch_bounds__(kRunThreads)
    k_conv1d_run(const T* __restrict__ x, const T* __restrict__ w, T* state, T* __restrict__ y, int C, bool keep,
                 const RunSeqs sq) {
  constexpr int P = K - 1;
  constexpr int PW = P > 0 ? P : 1;  // the window's array size
  const int c0 = (blockIdx.x * blockDim.x + threadIdx.x) * V;
  if (c0 >= C) return;
  float wr[K][V];
  DFLASH_UNROLL
  for (int v = 0; v < V; ++v) {
    DFLASH_UNROLL
    for (int j = 0; j < K; ++j) wr[j][v] = to_f(w[static_cast<int64_t>(c0 + v) * K + j]);
  }
  const int64_t runs = sq.run[sq.n];
  int q = 0;  // the sequence of run (ascending in this loop)
  for (int64_t run = blockIdx.y; run < runs; run += gridDim.y) {
    while (run >= sq.run[q + 1]) ++q;
    const int64_t Tn = sq.off[q + 1] - sq.off[q], t0 = (run - sq.run[q]) * kRun;  // t: rows of sequence q
    const T* xs = x + sq.off[q] * C;
    T* ys = y + sq.off[q] * C;
    float win[PW][V];  // xin rows t .. t + P - 1 before output t
    DFLASH_UNROLL
    for (int j = 0; j < P; ++j) {
      const int64_t i = t0 + j;
      if (i >= P) {
        load_row<V>(xs + (i - P) * C + c0, win[j]);
      } else if (state) {
        load_row<V>(state + i * C + c0, win[j]);
      } else {
        DFLASH_UNROLL
        for (int v = 0; v < V; ++v) win[j][v] = 0.f;
      }
    }
#pragma unroll 1  // a loop of batches (the window shifts within a batch are renames): ~1k instructions, not 4k
    for (int b0 = 0; b0 < kRun && t0 + b0 < Tn; b0 += kBatch) {
      float nx[kBatch][V];  // xin rows t + P: x rows t (past the end: the last row again, its outputs not stored)
      DFLASH_UNROLL
      for (int b = 0; b < kBatch; ++b) {
        const int64_t t = t0 + b0 + b;
        load_row<V>(xs + (t < Tn ? t : Tn - 1) * C + c0, nx[b]);
      }
      DFLASH_UNROLL
      for (int b = 0; b < kBatch; ++b) {
        const int64_t t = t0 + b0 + b;
        float out[V];
        DFLASH_UNROLL
        for (int v = 0; v < V; ++v) {
          float acc = 0.f;  // k_conv1d's order: j = 0..K-1
          DFLASH_UNROLL
          for (int j = 0; j < P; ++j) acc += wr[j][v] * win[j][v];
          acc += wr[P][v] * nx[b][v];
          out[v] = acc / (1.f + expf(-acc));
        }
        if (t < Tn) store_row<V>(ys + t * C + c0, out);
        if constexpr (P > 0) {
          DFLASH_UNROLL
          for (int j = 0; j + 1 < P; ++j) {
            DFLASH_UNROLL
            for (int v = 0; v < V; ++v) win[j][v] = win[j + 1][v];
          }
          DFLASH_UNROLL
          for (int v = 0; v < V; ++v) win[P - 1][v] = nx[b][v];
        }
      }
    }
  }
  if (!keep) return;
  // window row i = xin row Tn + i: in ascending i a row of the old window is read before it is overwritten
  const int64_t Tn = sq.off[1];
  DFLASH_UNROLL
  for (int i = 0; i < P; ++i) {
    const int64_t s = Tn + i;
    copy_row<V>(state + i * C + c0, s >= P ? x + (s - P) * C + c0 : state + s * C + c0);
  }
}

// Any K: one thread per (t, c), each input read K times.
template <class T>
__global__ void k_conv1d(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ state,
                         T* __restrict__ y, int64_t Tn, int C, int K) {
  const int64_t n = Tn * C;
  const int P = K - 1;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = idx / C;
    const int c = static_cast<int>(idx % C);
    float acc = 0.f;
    for (int j = 0; j < K; ++j) acc += to_f(w[c * K + j]) * xin(x, state, t + j, c, C, P);
    y[idx] = from_f<T>(acc / (1.f + expf(-acc)));
  }
}

template <class T>
__global__ void k_conv1d_window(const T* __restrict__ x, T* state, int64_t Tn, int C, int P) {
  for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += gridDim.x * blockDim.x) {
    float v[kMaxWindow];
    for (int i = 0; i < P; ++i) v[i] = xin(x, state, Tn + i, c, C, P);
    for (int i = 0; i < P; ++i) state[i * C + c] = from_f<T>(v[i]);
  }
}

// k_conv1d_run<T, K, V or 1> over the sequences [seqs[i], seqs[i + 1]) (kMaxSeqs a launch); returns whether it moved
// the window on (keep).
template <class T, int K>
bool launch_run(Env& e, const T* x, const T* w, T* state, T* y, std::span<const int64_t> seqs, int C) {
  constexpr int V = 16 / static_cast<int>(sizeof(T));
  const auto a16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  // (C % V == 0: every sequence's rows start 16-byte aligned too)
  const bool vec = C % V == 0 && a16(x) && a16(y) && (!state || a16(state));
  const int64_t groups = vec ? C / V : C;
  const int threads = groups >= kRunThreads ? kRunThreads : static_cast<int>((groups + 31) / 32 * 32);
  const int64_t n = static_cast<int64_t>(seqs.size()) - 1;
  bool keep = false;
  for (int64_t s0 = 0; s0 < n; s0 += kMaxSeqs) {
    RunSeqs sq{};
    sq.n = static_cast<int>(std::min<int64_t>(kMaxSeqs, n - s0));
    for (int i = 0; i <= sq.n; ++i) sq.off[i] = seqs[static_cast<size_t>(s0 + i)];
    for (int i = 0; i < sq.n; ++i) sq.run[i + 1] = sq.run[i] + (sq.off[i + 1] - sq.off[i] + kRun - 1) / kRun;
    const int64_t runs = sq.run[sq.n];
    if (runs == 0) continue;
    const dim3 grid(static_cast<unsigned>((groups + threads - 1) / threads),
                    static_cast<unsigned>(runs < 65535 ? runs : 65535));
    keep = state && K > 1 && n == 1 && runs == 1;
    if (vec) {
      DFLASH_LAUNCH(grid, threads, 0, e.stream, k_conv1d_run<T, K, V>)(x, w, state, y, C, keep, sq);
    } else {
      DFLASH_LAUNCH(grid, threads, 0, e.stream, k_conv1d_run<T, K, 1>)(x, w, state, y, C, keep, sq);
    }
  }
  return keep;
}

// The convolution of T > 0 tokens in the sequences seqs; returns whether the window was moved on too.
template <class T>
bool conv(Env& e, const T* x, const T* w, T* state, T* y, std::span<const int64_t> seqs, int C, int K) {
  switch (K) {
    case 1: return launch_run<T, 1>(e, x, w, state, y, seqs, C);
    case 2: return launch_run<T, 2>(e, x, w, state, y, seqs, C);
    case 3: return launch_run<T, 3>(e, x, w, state, y, seqs, C);
    case 4: return launch_run<T, 4>(e, x, w, state, y, seqs, C);
    case 5: return launch_run<T, 5>(e, x, w, state, y, seqs, C);
    case 6: return launch_run<T, 6>(e, x, w, state, y, seqs, C);
    case 7: return launch_run<T, 7>(e, x, w, state, y, seqs, C);
    case 8: return launch_run<T, 8>(e, x, w, state, y, seqs, C);
    default: break;
  }
  static_assert(kRunMaxK == 8);
  for (size_t i = 0; i + 1 < seqs.size(); ++i) {  // (no model so far: one launch per sequence)
    const int64_t b = seqs[i], Tn = seqs[i + 1] - b;
    if (Tn == 0) continue;
    DFLASH_LAUNCH(grid_for(Tn * C, 256, e.num_sms), 256, 0, e.stream, k_conv1d<T>)(x + b * C, w, state, y + b * C, Tn,
                                                                                  C, K);
  }
  return false;
}

template <class T>
void conv_and_window(Env& e, const T* x, const T* w, T* state, T* y, const Conv1dDims& d) {
  const int C = static_cast<int>(d.C), K = static_cast<int>(d.K), P = K - 1;
  bool moved = false;
  if (d.T > 0) {
    const int64_t one[2] = {0, d.T};
    moved = conv(e, x, w, state, y, d.seqs.empty() ? std::span<const int64_t>(one) : d.seqs, C, K);
    check_launch("conv1d_causal");
  }
  if (!state || P == 0 || d.T == 0 || moved) return;  // (state: one sequence)
  DFLASH_LAUNCH(grid_for(C, 256, e.num_sms), 256, 0, e.stream, k_conv1d_window<T>)(x, state, d.T, C, P);
  check_launch("conv1d_causal window");
}

}  // namespace

void conv1d_causal(Env& e, const Tensor& x, const Tensor& w, const Tensor& state, const Tensor& y,
                   const Conv1dDims& d) {
  DFLASH_CHECK(d.K - 1 <= kMaxWindow, "conv1d_causal (cuda): kernel ", d.K, " above ", kMaxWindow + 1);
  if (x.dtype == DType::BF16) {
    conv_and_window(e, static_cast<const bf16*>(x.data), static_cast<const bf16*>(w.data),
                    state.defined() ? static_cast<bf16*>(state.data) : nullptr, static_cast<bf16*>(y.data), d);
  } else {
    conv_and_window(e, x.ptr<const float>(), w.ptr<const float>(), state.defined() ? state.ptr<float>() : nullptr,
                    y.ptr<float>(), d);
  }
}

}  // namespace dflash::cuda
