// backend/cuda/common.cuh — what every CUDA op file shares.
// defines: check_launch, DFLASH_LAUNCH, DFLASH_DYN_SMEM, DFLASH_UNROLL,
//          bf16 <-> float helpers (Raw, load_f, store_f: 1 or 8 values), warp / block reductions, grid sizing
//
// The kernels are written in a small subset of CUDA C++ (no <<< >>> outside DFLASH_LAUNCH, shared memory only via
// __shared__ arrays of plain types or DFLASH_DYN_SMEM, full-warp shuffles) so that the same files also compile as
// plain C++ against tests/cuda/emu/cuda_emu.h (DFLASH_CUDA_EMU), which runs them on the CPU with one fiber per
// CUDA thread. That is how they were first validated against the CPU ops on a machine without a GPU.
#pragma once
#include <cstdint>

#ifdef DFLASH_CUDA_EMU
#include "cuda_emu.h"
#else
#include <cublasLt.h>      // defines: cuBLASLt
#include <cuda_bf16.h>     // defines: __nv_bfloat16, __float2bfloat16, __bfloat162float
#include <cuda_runtime.h>  // defines: the runtime API, dim3, threadIdx...
#define DFLASH_LAUNCH(grid, block, smem, stream, ...) __VA_ARGS__<<<(grid), (block), (smem), (stream)>>>
#define DFLASH_DYN_SMEM(name) extern __shared__ __align__(16) unsigned char name[]
#define DFLASH_UNROLL _Pragma("unroll")
#endif

#include "backend/cuda/check.h"
#include "backend/cuda/ops.h"

// DFLASH_HOPPER_DEVICE: 1 while nvcc compiles device code for sm_90a, the target of the Hopper tier's kernels
// (warpgroup MMA, setmaxnreg, TMA, mbarrier transactions, programmatic dependent launch: attention_wgmma.cu and
// moe.cu's grouped GEMMs), 0 for every other target of DFLASH_CUDA_ARCHS and for the host pass. Those kernels' bodies
// compile only under it; elsewhere a body is a trap, never reached: the context runs them only on the Hopper tier
// (backend/kernel_tier.h), which needs a compute capability 9.0 device and the build's sm_90a code.
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DFLASH_HOPPER_DEVICE 1
#else
#define DFLASH_HOPPER_DEVICE 0
#endif

namespace dflash::cuda {

using bf16 = __nv_bfloat16;

// Throws if the last launch failed (bad configuration, too much shared memory, ...).
inline void check_launch(const char* kernel) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) fail(cat("CUDA kernel ", kernel, " failed to launch: ", cudaGetErrorString(e)));
}

// Blocks for a grid-stride loop over n items with `threads` per block: enough to fill the device, never more
// than needed.
inline unsigned grid_for(int64_t n, int threads, int num_sms) {
  const int64_t need = (n + threads - 1) / threads;
  const int64_t cap = static_cast<int64_t>(num_sms > 0 ? num_sms : 1) * 32;
  const int64_t g = need < cap ? need : cap;
  return static_cast<unsigned>(g > 0 ? g : 1);
}

#ifndef DFLASH_CUDA_EMU
// Lets each kernel use up to smem_optin bytes of shared memory per block: the dynamic-size attribute set to the
// device's opt-in maximum less the kernel's own static __shared__ (which counts against the same limit).
template <class... K>
void allow_dynamic_smem(int smem_optin, K... kernels) {
  auto one = [smem_optin](auto kernel) {
    cudaFuncAttributes fa{};
    DFLASH_CUDA_CHECK(cudaFuncGetAttributes(&fa, kernel));
    DFLASH_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           smem_optin - static_cast<int>(fa.sharedSizeBytes)));
  };
  (one(kernels), ...);
}
#endif

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(bf16 x) { return __bfloat162float(x); }
template <class T>
__device__ __forceinline__ T from_f(float x);
template <>
__device__ __forceinline__ float from_f<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ bf16 from_f<bf16>(float x) {
  return __float2bfloat16(x);  // round to nearest even
}

// Eight bf16 values (one 16-byte load or store) to floats and back (round to nearest even).
// v by value, not by reference: bf16x8_to_f(*reinterpret_cast<const uint4*>(p), f) with a reference let nvcc read
// the four bf16 pairs through p itself, four 4-byte loads (ld.global.v2.u16) instead of one 16-byte ld.global.v4.u32;
// a uint4 argument is one 16-byte load at the call (p must be 16-byte aligned, as for any uint4 access).
__device__ __forceinline__ void bf16x8_to_f(const uint4 v, float (&f)[8]) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
  DFLASH_UNROLL
  for (int k = 0; k < 4; ++k) {
    const float2 t = __bfloat1622float2(h[k]);
    f[2 * k] = t.x;
    f[2 * k + 1] = t.y;
  }
}
__device__ __forceinline__ uint4 f_to_bf16x8(const float (&f)[8]) {
  uint4 v;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&v);
  DFLASH_UNROLL
  for (int k = 0; k < 4; ++k) h[k] = __floats2bfloat162_rn(f[2 * k], f[2 * k + 1]);
  return v;
}

// W bf16 values (8: one 16-byte load, the pointer 16-byte aligned; 1: a scalar), kept raw between the load and the
// conversion so that a prefetch stays in flight; load_f / store_f convert to / from fp32 at once.
template <int W>
struct Raw;
template <>
struct Raw<8> {
  uint4 v{};
  __device__ __forceinline__ void load(const bf16* p) { v = *reinterpret_cast<const uint4*>(p); }
  __device__ __forceinline__ void to_f(float (&x)[8]) const { bf16x8_to_f(v, x); }
};
template <>
struct Raw<1> {
  bf16 v{};
  __device__ __forceinline__ void load(const bf16* p) { v = *p; }
  __device__ __forceinline__ void to_f(float (&x)[1]) const { x[0] = __bfloat162float(v); }
};
template <int W>
__device__ __forceinline__ void load_f(const bf16* p, float (&x)[W]) {
  Raw<W> r;
  r.load(p);
  r.to_f(x);
}
template <int W>
__device__ __forceinline__ void store_f(bf16* p, const float (&x)[W]) {
  if constexpr (W == 8)
    *reinterpret_cast<uint4*>(p) = f_to_bf16x8(x);
  else
    p[0] = __float2bfloat16(x[0]);
}
// Whether a bf16 elementwise op over n elements can move 8 at a time: n % 8 == 0 and every pointer 16-byte aligned.
template <class... P>
inline bool bf16x8_ok(int64_t n, const P*... p) {
  return n % 8 == 0 && ((reinterpret_cast<uintptr_t>(p) % 16 == 0) && ...);
}

template <class V>
__device__ __forceinline__ V warp_sum(V v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the whole block; every thread gets the result. blockDim.x must be a multiple of 32; every thread of
// the block must call it (it holds __syncthreads). scratch: 32 entries of shared memory.
template <class V>
__device__ __forceinline__ V block_sum(V v, V* scratch) {
  v = warp_sum(v);
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[w] = v;
  __syncthreads();
  V t = lane < nw ? scratch[lane] : V(0);
  return warp_sum(t);
}

}  // namespace dflash::cuda
