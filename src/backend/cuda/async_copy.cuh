// backend/cuda/async_copy.cuh — cp.async (sm_80+) global -> shared copies shared by the tensor-core attention
// kernels (attention_tc.cu, attention_wgmma.cu). PTX ISA 9.7.9.25 (cp.async, cp.async.commit_group / wait_group);
// below, the synchronisation of the wgmma forward's stages and ping-pong (attention_wgmma.cu).
#pragma once
#include <cstdint>

#include "backend/cuda/common.cuh"

namespace dflash::cuda {

#ifndef DFLASH_CUDA_EMU

// Shared-memory address of a generic pointer into shared memory.
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 16 bytes global -> shared, asynchronously; zero-filled when !pred (src must still be a valid address).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool pred) {
  const int n = pred ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// ---- pipelines without a CTA barrier (sm_90): mbarriers, named barriers --------------------------------------------
// PTX ISA 9.7.13.15 (mbarrier), 9.7.9.25.3.3 (cp.async.mbarrier.arrive), 9.7.13.1 (bar.sync / bar.arrive).
// Initialises the mbarrier at shared address bar for `count` arrivals per phase (one thread, before a barrier).
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// One arrival on bar once every cp.async this thread issued so far has landed (counted in the init count: .noinc).
__device__ __forceinline__ void cp_async_mbar_arrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
// Waits until the phase of parity `parity` (0 for the 1st, 3rd, ... completion; 1 for the 2nd, ...) has completed.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}
// Named barrier `id` (1..15; 0 is __syncthreads) over `n` threads: wait for it / arrive without waiting.
__device__ __forceinline__ void named_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void named_arrive(int id, int n) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
#endif

}  // namespace dflash::cuda
