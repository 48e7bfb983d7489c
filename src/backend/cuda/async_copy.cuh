// backend/cuda/async_copy.cuh — cp.async (sm_80+) global -> shared copies shared by the tensor-core attention
// kernels (attention_tc.cu, attention_wgmma.cu) and the chunked gated delta rule (gated_delta_chunk.cu; cp.async also
// on the kernel emulator). PTX ISA 9.7.9.25 (cp.async, cp.async.commit_group / wait_group);
// below, the synchronisation of the wgmma forward's stages and ping-pong and its TMA loads (attention_wgmma.cu).
#pragma once
#include <cstdint>
#include <cstring>

#ifndef DFLASH_CUDA_EMU
#include <cuda.h>
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled
#endif

#include "backend/cuda/common.cuh"

namespace dflash::cuda {

#ifndef DFLASH_CUDA_EMU

// cuTensorMapEncodeTiled through the runtime's driver entry point (nothing links libcuda), looked up once per process
// (a thread-safe static). Throws if the driver has none.
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    const cudaError_t err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q);
    DFLASH_CHECK(err == cudaSuccess && q == cudaDriverEntryPointSuccess && fn != nullptr,
                 "cuda: the driver has no cuTensorMapEncodeTiled (", cudaGetErrorString(err), ")");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

// Shared-memory address of a generic pointer into shared memory.
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 16 bytes global -> shared, asynchronously; zero-filled when !pred (src must still be a valid address).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool pred) {
  const int n = pred ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}
// 4 bytes global -> shared (.ca: .cg copies only 16), zero-filled when !pred (src must still be a valid address).
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, bool pred) {
  const int n = pred ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(n));
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
// try_wait with a suspend-time hint (kMbarSuspendNs; PTX ISA, mbarrier.try_wait): the waiting thread sleeps until
// the phase completes or the hint's time passes (then it asks again), instead of the system's default limit, so that
// waiting warps leave the issue slots to the warps that compute (CUTLASS's ClusterBarrier::wait uses the same 10 ms).
constexpr uint32_t kMbarSuspendNs = 10000000;
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2, %3;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity), "r"(kMbarSuspendNs)
        : "memory");
  } while (!done);
}
// ---- TMA (sm_90): PTX ISA 9.7.9.27 (cp.async.bulk.tensor), 9.7.13.15.11 (mbarrier.expect_tx) ---------------------
// Makes the mbarrier initialisations visible to the async proxy (TMA's complete_tx), before the CTA barrier.
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
// One arrival on bar that also expects `bytes` more bytes of asynchronous copies before the phase completes.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// The box of the 3-D tiled tensor map `map` (a __grid_constant__ kernel parameter's address) at element coordinates
// (c0, c1, c2) (innermost first; out-of-range elements are zero-filled) into shared memory at dst, its bytes counted
// on the mbarrier bar (complete_tx). Issued by one thread.
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const void* map, uint32_t bar, int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];\n" ::"r"(
          dst),
      "l"(map), "r"(bar), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}
// The box of the 2-D tiled tensor map `map` at element coordinates (c0, c1) (innermost first), as tma_load_3d.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const void* map, uint32_t bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n" ::"r"(
          dst),
      "l"(map), "r"(bar), "r"(c0), "r"(c1)
      : "memory");
}
// The box of `map` at (c0, c1, c2) from shared memory at src into global memory (elements past the tensor's end are
// not written), in this thread's bulk async-group; src's generic writes must be fenced (fence.proxy.async) by their
// writers first. Issued by one thread. PTX ISA 9.7.9.27.
__device__ __forceinline__ void tma_store_3d(const void* map, uint32_t src, int c0, int c1, int c2) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(map), "r"(src),
               "r"(c0), "r"(c1), "r"(c2)
               : "memory");
}
// Closes this thread's bulk async-group; waits until at most N of its groups still read shared memory (PTX ISA
// 9.7.9.25.3.2, .read: the global writes may still be under way).
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
template <int N>
__device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void tma_prefetch_map(const void* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(map) : "memory");
}
// Named barrier `id` (1..15; 0 is __syncthreads) over `n` threads: wait for it / arrive without waiting.
__device__ __forceinline__ void named_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void named_arrive(int id, int n) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}

#else  // the kernel emulator (tests/cuda/emu/cuda_emu.h): cp.async whose bytes land at the issuing thread's wait_group

inline uint32_t smem_u32(const void* p) { return ::emu::smem_offset(p); }
inline void cp_async16(uint32_t dst, const void* src, bool pred) { ::emu::cp_async(dst, src, 16, pred); }
inline void cp_async4(uint32_t dst, const void* src, bool pred) { ::emu::cp_async(dst, src, 4, pred); }
inline void cp_async_commit() { ::emu::cp_async_commit(); }
template <int N>
inline void cp_async_wait() {
  ::emu::cp_async_wait(N);
}
#endif

}  // namespace dflash::cuda
