// backend/cuda/async_copy.cuh — cp.async (sm_80+) global -> shared copies shared by the tensor-core attention
// kernels (attention_tc.cu, attention_wgmma.cu). PTX ISA 9.7.9.25 (cp.async, cp.async.commit_group / wait_group).
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

#endif

}  // namespace dflash::cuda
