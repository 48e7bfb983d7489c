// backend/cuda/mma_sync.cuh — warp-level tensor-core primitives (sm_80+): mma.sync m16n8k16 (bf16 operands, fp32
// accumulation) and ldmatrix x4 (plain and .trans), with their fragment layouts (PTX ISA 9.7.13.4.8 and 9.7.13.4.15):
// lane l, g = l / 4, t = l % 4, holds
//   A (16 x 16, .row): a0 = A[g][2t, 2t+1], a1 = A[g+8][2t, 2t+1], a2 = A[g][2t+8, 2t+9], a3 = A[g+8][2t+8, 2t+9]
//   B (16 x 8, .col):  b0 = B[2t, 2t+1][g], b1 = B[2t+8, 2t+9][g]
//   C (16 x 8, fp32):  c0, c1 = C[g][2t, 2t+1], c2, c3 = C[g+8][2t, 2t+1]
//   ldmatrix x4: matrix q (8 x 8 bf16) from the 8 row addresses of lanes 8q .. 8q+7; r[q] = row g, columns 2t, 2t+1
//   of it (.trans: of its transpose, i.e. rows 2t, 2t+1, column g).
// On the kernel emulator (DFLASH_CUDA_EMU; tests/cuda/emu) the same functions are computed from those layouts with
// warp shuffles, so kernels written with them run and are checked on a machine without a GPU.
// defines: ldsm_x4, ldsm_x4_t, mma16816, pack_bf16, load_a, load_at, load_bt, load_b
#pragma once
#include <cstdint>
#include <cstring>

#include "backend/cuda/common.cuh"
#ifndef DFLASH_CUDA_EMU
#include "backend/cuda/async_copy.cuh"  // smem_u32
#endif

namespace dflash::cuda::mma {

// Two floats as a bf16x2 register (lo in the low half), round to nearest even.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return u;
}

#ifndef DFLASH_CUDA_EMU

// p: this lane's row address in shared memory (16-byte aligned).
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
// c += a (16 x 16) b (16 x 8)
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

#else  // the emulator: the layouts above, by shuffles

inline float bf_lo(uint32_t u) {
  uint16_t h = static_cast<uint16_t>(u & 0xffffu);
  __nv_bfloat16 b;
  std::memcpy(&b, &h, 2);
  return __bfloat162float(b);
}
inline float bf_hi(uint32_t u) { return bf_lo(u >> 16); }
inline uint32_t two_bf16(const void* p) {  // two consecutive bf16 as one register
  uint32_t u;
  std::memcpy(&u, p, 4);
  return u;
}
inline uint32_t bf16_pair(const unsigned char* a, const unsigned char* b) {  // low half from a, high half from b
  uint16_t x, y;
  std::memcpy(&x, a, 2);
  std::memcpy(&y, b, 2);
  return static_cast<uint32_t>(x) | (static_cast<uint32_t>(y) << 16);
}
inline void ldsm_x4_impl(uint32_t (&r)[4], const void* p, bool trans) {
  const int lane = static_cast<int>(threadIdx.x & 31), g = lane >> 2, t = lane & 3;
  for (int q = 0; q < 4; ++q) {
    if (!trans) {
      const unsigned char* row = static_cast<const unsigned char*>(__shfl_sync(0xffffffffu, p, 8 * q + g));
      r[q] = two_bf16(row + 4 * t);
    } else {
      const unsigned char* r0 = static_cast<const unsigned char*>(__shfl_sync(0xffffffffu, p, 8 * q + 2 * t));
      const unsigned char* r1 = static_cast<const unsigned char*>(__shfl_sync(0xffffffffu, p, 8 * q + 2 * t + 1));
      r[q] = bf16_pair(r0 + 2 * g, r1 + 2 * g);
    }
  }
}
inline void ldsm_x4(uint32_t (&r)[4], const void* p) { ldsm_x4_impl(r, p, false); }
inline void ldsm_x4_t(uint32_t (&r)[4], const void* p) { ldsm_x4_impl(r, p, true); }
inline void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  const int lane = static_cast<int>(threadIdx.x & 31), g = lane >> 2, t = lane & 3;
  // row g / g+8 of A: lanes 4g .. 4g+3 (k = 2t', 2t'+1 in a0/a1, 2t'+8.. in a2/a3); column n of B: lanes 4n .. 4n+3
  float acc[4] = {c[0], c[1], c[2], c[3]};
  for (int tp = 0; tp < 4; ++tp) {
    uint32_t A[4], B0[2], B1[2];
    for (int i = 0; i < 4; ++i) A[i] = __shfl_sync(0xffffffffu, a[i], 4 * g + tp);
    for (int n = 0; n < 2; ++n) {  // columns 2t and 2t+1
      B0[n] = __shfl_sync(0xffffffffu, b0, 4 * (2 * t + n) + tp);
      B1[n] = __shfl_sync(0xffffffffu, b1, 4 * (2 * t + n) + tp);
    }
    for (int n = 0; n < 2; ++n) {
      // k = 2tp, 2tp+1 (a0 / a1, b0) and 2tp+8, 2tp+9 (a2 / a3, b1)
      acc[n] += bf_lo(A[0]) * bf_lo(B0[n]) + bf_hi(A[0]) * bf_hi(B0[n]) + bf_lo(A[2]) * bf_lo(B1[n]) +
                bf_hi(A[2]) * bf_hi(B1[n]);
      acc[2 + n] += bf_lo(A[1]) * bf_lo(B0[n]) + bf_hi(A[1]) * bf_hi(B0[n]) + bf_lo(A[3]) * bf_lo(B1[n]) +
                    bf_hi(A[3]) * bf_hi(B1[n]);
    }
  }
  for (int i = 0; i < 4; ++i) c[i] = acc[i];
}

#endif

// A fragments of the 16 x 16 block at rows row0.., columns c0.. of a row-major bf16 tile in shared memory (row stride
// ld elements, rows 16-byte aligned).
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const bf16* tile, int ld, int row0, int c0, int lane) {
  ldsm_x4(a, tile + (row0 + (lane & 15)) * ld + c0 + (lane >> 4) * 8);
}
// A fragments of A = tile^T (tile stored [k][m]): the 16 x 16 block at rows (m) m0.., columns (k) k0.. of A.
__device__ __forceinline__ void load_at(uint32_t (&a)[4], const bf16* tile, int ld, int m0, int k0, int lane) {
  ldsm_x4_t(a, tile + (k0 + (lane & 7) + ((lane >> 4) & 1) * 8) * ld + m0 + ((lane >> 3) & 1) * 8);
}
// B fragments (k = columns c0..c0+15, n = rows n0..n0+15 as two 8-wide n tiles) of B = tile^T (tile stored [n][k],
// e.g. K [key][d] for S = Q K^T). r[0], r[1]: n tile n0; r[2], r[3]: n tile n0 + 8.
__device__ __forceinline__ void load_bt(uint32_t (&r)[4], const bf16* tile, int ld, int n0, int c0, int lane) {
  ldsm_x4(r, tile + (n0 + (lane & 7) + (lane >> 4) * 8) * ld + c0 + ((lane >> 3) & 1) * 8);
}
// B fragments (k = rows k0..k0+15, n = columns n0..n0+15 as two 8-wide n tiles) of B = tile (stored [k][n], e.g. V
// [key][d] for O = P V). r[0], r[1]: n tile n0; r[2], r[3]: n tile n0 + 8.
__device__ __forceinline__ void load_b(uint32_t (&r)[4], const bf16* tile, int ld, int k0, int n0, int lane) {
  ldsm_x4_t(r, tile + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * ld + n0 + (lane >> 4) * 8);
}

}  // namespace dflash::cuda::mma
