// cuda/conv1d_causal.cu — the Gated DeltaNet's depthwise causal convolution with SiLU over one sequence
// (backend/context.h conv1d_causal; cpu/conv1d_causal.cpp is the reference): one thread per (t, c), channels fastest
// (coalesced), fp32 accumulation of the K taps over xin = [window ; x]; then, when a window is kept, one thread per
// channel moves it on to the last K - 1 rows of xin (read into registers first: the new window may come from the
// old one when T < K - 1). Memory-bound: each input is read K times, from L1/L2 after the first.
#include "backend/cuda/common.cuh"

namespace dflash::cuda {

namespace {

constexpr int kMaxWindow = 64;  // K - 1 rows at most (linear_conv_kernel_dim <= 64, io/model_family_hybrid.cpp)

template <class T>
__device__ __forceinline__ float xin(const T* x, const T* state, int64_t i, int c, int C, int P) {
  if (i >= P) return to_f(x[(i - P) * C + c]);
  return state ? to_f(state[i * C + c]) : 0.f;
}

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

}  // namespace

void conv1d_causal(Env& e, const Tensor& x, const Tensor& w, const Tensor& state, const Tensor& y,
                   const Conv1dDims& d) {
  const int C = static_cast<int>(d.C), K = static_cast<int>(d.K), P = K - 1;
  DFLASH_CHECK(P <= kMaxWindow, "conv1d_causal (cuda): kernel ", K, " above ", kMaxWindow + 1);
  const bool bf = x.dtype == DType::BF16;
  if (d.T > 0) {
    const unsigned grid = grid_for(d.T * C, 256, e.num_sms);
    if (bf) {
      DFLASH_LAUNCH(grid, 256, 0, e.stream, k_conv1d<bf16>)
      (static_cast<bf16*>(x.data), static_cast<bf16*>(w.data),
       state.defined() ? static_cast<bf16*>(state.data) : nullptr, static_cast<bf16*>(y.data), d.T, C, K);
    } else {
      DFLASH_LAUNCH(grid, 256, 0, e.stream, k_conv1d<float>)
      (x.ptr<float>(), w.ptr<float>(), state.defined() ? state.ptr<float>() : nullptr, y.ptr<float>(), d.T, C, K);
    }
    check_launch("conv1d_causal");
  }
  if (!state.defined() || P == 0 || d.T == 0) return;
  const unsigned grid = grid_for(C, 256, e.num_sms);
  if (bf) {
    DFLASH_LAUNCH(grid, 256, 0, e.stream, k_conv1d_window<bf16>)
    (static_cast<bf16*>(x.data), static_cast<bf16*>(state.data), d.T, C, P);
  } else {
    DFLASH_LAUNCH(grid, 256, 0, e.stream, k_conv1d_window<float>)(x.ptr<float>(), state.ptr<float>(), d.T, C, P);
  }
  check_launch("conv1d_causal window");
}

}  // namespace dflash::cuda
