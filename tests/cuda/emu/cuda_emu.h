// tests/cuda/emu/cuda_emu.h — a CPU emulator for the subset of CUDA C++ the dflash kernels use, so that
// src/backend/cuda/*.cu can be compiled as plain C++ (-DDFLASH_CUDA_EMU) and run against the CPU ops on a
// machine without a GPU.
// defines: the runtime calls the op files make (memcpy/memset/2D copies, launch errors, function attributes),
//          __nv_bfloat16 and its conversions, a column-major cuBLASLt matmul with the real API's names, and the
//          kernel side: threadIdx/blockIdx/..., __syncthreads, __shfl_xor_sync, __any_sync, atomics, cp.async (emu::cp_async*,
//          wrapped by backend/cuda/async_copy.cuh), DFLASH_LAUNCH.
//
// Execution model: blocks run one after another; the threads of a block are fibers (ucontext) on one OS thread.
// A fiber runs until it reaches a barrier (__syncthreads, or the warp exchange inside a shuffle) or exits; when
// every live fiber waits, the barrier whose participants have all arrived is released. A __syncthreads reached
// by part of a block while the rest waits elsewhere is reported as a deadlock (divergent barrier). Running each
// fiber up to its next barrier before the next fiber starts makes a missing __syncthreads visible: the reads of
// one thread see the other threads' writes of the next phase, or none of them. DFLASH_EMU_ORDER = fwd | rev |
// rand picks the order fibers are resumed in, so both orders of a race get exercised.
// Shared memory: `__shared__` becomes `static thread_local` (blocks of one host thread never run concurrently);
// dynamic shared memory is a buffer poisoned with NaN bytes at every block start. The scheduler state is
// thread_local too, so contexts on several host threads (case C01) can each run kernels.
#pragma once
#include <ucontext.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

// ---- runtime --------------------------------------------------------------------------------------------------
struct CUstream_st;
typedef CUstream_st* cudaStream_t;
enum cudaError_t { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorMemoryAllocation = 2, cudaErrorLaunch = 719 };
enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4
};
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
};
struct uint3 {
  unsigned x = 0, y = 0, z = 0;
};

namespace emu {
inline cudaError_t& last_error() {
  static thread_local cudaError_t e = cudaSuccess;
  return e;
}
inline int& smem_limit() {  // the emulated device's opt-in shared memory per block
  static int v = 227 * 1024;
  return v;
}
}  // namespace emu

inline const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument (emu)";
    case cudaErrorMemoryAllocation: return "out of memory (emu)";
    default: return "launch failure (emu)";
  }
}
inline cudaError_t cudaGetLastError() {
  const cudaError_t e = emu::last_error();
  emu::last_error() = cudaSuccess;
  return e;
}
inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind, cudaStream_t) {
  if (n) std::memmove(dst, src, n);
  return cudaSuccess;
}
inline cudaError_t cudaMemsetAsync(void* dst, int v, size_t n, cudaStream_t) {
  if (n) std::memset(dst, v, n);
  return cudaSuccess;
}
inline cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                                     size_t height, cudaMemcpyKind, cudaStream_t) {
  if (width > dpitch || width > spitch) return cudaErrorInvalidValue;
  for (size_t r = 0; r < height; ++r)
    std::memmove(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch, width);
  return cudaSuccess;
}
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
template <class F>
cudaError_t cudaFuncSetAttribute(F*, cudaFuncAttribute, int) {
  return cudaSuccess;
}

// device, stream and stream-ordered pool: host memory (what context.cpp calls)
struct cudaDeviceProp {
  char name[256];
  int major, minor, multiProcessorCount;
};
enum cudaDeviceAttr { cudaDevAttrMaxSharedMemoryPerBlockOptin = 97 };
#define cudaStreamNonBlocking 0x01
enum cudaMemAllocationType { cudaMemAllocationTypePinned = 1 };
enum cudaMemAllocationHandleType { cudaMemHandleTypeNone = 0 };
enum cudaMemLocationType { cudaMemLocationTypeDevice = 1 };
struct cudaMemLocation {
  cudaMemLocationType type;
  int id;
};
struct cudaMemPoolProps {
  cudaMemAllocationType allocType;
  cudaMemAllocationHandleType handleTypes;
  cudaMemLocation location;
};
enum cudaMemPoolAttr { cudaMemPoolAttrReleaseThreshold = 4 };
struct CUmemPoolHandle_st {};
typedef CUmemPoolHandle_st* cudaMemPool_t;
namespace emu {
inline int64_t& device_bytes() {  // the emulated device's memory
  static int64_t v = int64_t{8} << 30;
  return v;
}
}  // namespace emu
inline cudaError_t cudaGetDeviceCount(int* n) {
  *n = 1;
  return cudaSuccess;
}
inline cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : cudaErrorInvalidValue; }
inline cudaError_t cudaGetDevice(int* d) {
  *d = 0;
  return cudaSuccess;
}
inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int) {
  std::memset(p, 0, sizeof(*p));
  std::strcpy(p->name, "emulated sm_90 (cuda_emu)");
  p->major = 9;
  p->minor = 0;
  p->multiProcessorCount = 4;
  return cudaSuccess;
}
inline cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr, int);
inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) {
  *s = reinterpret_cast<cudaStream_t>(new char[1]);
  return cudaSuccess;
}
inline cudaError_t cudaStreamDestroy(cudaStream_t s) {
  delete[] reinterpret_cast<char*>(s);
  return cudaSuccess;
}
inline cudaError_t cudaMemPoolCreate(cudaMemPool_t* p, const cudaMemPoolProps*) {
  *p = new CUmemPoolHandle_st;
  return cudaSuccess;
}
inline cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t, cudaMemPoolAttr, void*) { return cudaSuccess; }
inline cudaError_t cudaMemPoolDestroy(cudaMemPool_t p) {
  delete p;
  return cudaSuccess;
}
inline cudaError_t cudaMallocFromPoolAsync(void** p, size_t n, cudaMemPool_t, cudaStream_t) {
  if (static_cast<int64_t>(n) > emu::device_bytes()) return cudaErrorMemoryAllocation;
  *p = std::aligned_alloc(256, (n + 255) / 256 * 256);
  if (!*p) return cudaErrorMemoryAllocation;
  std::memset(*p, 0xff, n);  // NaN bytes: reads of memory never written show up
  return cudaSuccess;
}
inline cudaError_t cudaFreeAsync(void* p, cudaStream_t) {
  std::free(p);
  return cudaSuccess;
}
inline cudaError_t cudaMemGetInfo(size_t* f, size_t* t) {
  *f = *t = static_cast<size_t>(emu::device_bytes());
  return cudaSuccess;
}

// Events: work is done when a call returns (kernels run synchronously), so an event is complete when recorded;
// timing events carry the host clock. One device: peers never have access, pointers live on device 0.
struct CUevent_st {
  double ms = 0;
};
typedef CUevent_st* cudaEvent_t;
#define cudaEventDisableTiming 0x02
inline cudaError_t cudaEventCreate(cudaEvent_t* e) {
  *e = new CUevent_st;
  return cudaSuccess;
}
inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) { return cudaEventCreate(e); }
inline cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete e;
  return cudaSuccess;
}
inline cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t) {
  e->ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
  return cudaSuccess;
}
inline cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
inline cudaError_t cudaEventQuery(cudaEvent_t) { return cudaSuccess; }
inline cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
  *ms = static_cast<float>(b->ms - a->ms);
  return cudaSuccess;
}
inline cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned) { return cudaSuccess; }
struct cudaPointerAttributes {
  int device = 0;
};
inline cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* a, const void*) {
  a->device = 0;
  return cudaSuccess;
}
inline cudaError_t cudaMemcpyPeerAsync(void* dst, int, const void* src, int, size_t n, cudaStream_t) {
  std::memmove(dst, src, n);
  return cudaSuccess;
}
inline cudaError_t cudaDeviceCanAccessPeer(int* can, int, int) {
  *can = 0;
  return cudaSuccess;
}
inline cudaError_t cudaDeviceEnablePeerAccess(int, unsigned) { return cudaSuccess; }
constexpr cudaError_t cudaErrorPeerAccessAlreadyEnabled = static_cast<cudaError_t>(704);
enum cudaMemAccessFlags { cudaMemAccessFlagsProtNone = 0, cudaMemAccessFlagsProtReadWrite = 3 };
struct cudaMemAccessDesc {
  cudaMemLocation location;
  cudaMemAccessFlags flags;
};
inline cudaError_t cudaMemPoolSetAccess(cudaMemPool_t, const cudaMemAccessDesc*, size_t) { return cudaSuccess; }

// ---- bf16 -----------------------------------------------------------------------------------------------------
struct __nv_bfloat16 {
  uint16_t x;
};
inline __nv_bfloat16 __float2bfloat16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  __nv_bfloat16 h;
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    h.x = static_cast<uint16_t>((u >> 16) | 0x40);
    return h;
  }
  u += 0x7fffu + ((u >> 16) & 1u);
  h.x = static_cast<uint16_t>(u >> 16);
  return h;
}
inline float __bfloat162float(__nv_bfloat16 h) {
  const uint32_t u = static_cast<uint32_t>(h.x) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct __nv_bfloat162 {
  __nv_bfloat16 x, y;
};
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return {__float2bfloat16(a), __float2bfloat16(b)}; }
// bf16x2 multiply, round to nearest even (a product of two bf16 is exact in fp32, so one rounding is the hardware's)
inline __nv_bfloat162 __hmul2(__nv_bfloat162 a, __nv_bfloat162 b) {
  return __floats2bfloat162_rn(__bfloat162float(a.x) * __bfloat162float(b.x), __bfloat162float(a.y) * __bfloat162float(b.y));
}
// bf16x2 subtract, round to nearest even (the difference of two bf16 is exact in fp32 unless their exponents are far
// apart, where fp32's own rounding decides first; the callers subtract small integers, exactly)
inline __nv_bfloat162 __hsub2(__nv_bfloat162 a, __nv_bfloat162 b) {
  return __floats2bfloat162_rn(__bfloat162float(a.x) - __bfloat162float(b.x), __bfloat162float(a.y) - __bfloat162float(b.y));
}

// ---- vector types, read-only loads ----------------------------------------------------------------------------------
struct float4 {
  float x, y, z, w;
};
struct uint2 {
  uint32_t x, y;
};
struct uint4 {
  uint32_t x, y, z, w;
};
struct float2 {
  float x, y;
};
inline float2 __bfloat1622float2(__nv_bfloat162 h) { return {__bfloat162float(h.x), __bfloat162float(h.y)}; }
// Byte n of the result is byte (s >> 4n) & 7 of the 8 bytes {y, x} (x: bytes 0-3), as the CUDA math API documents.
inline uint32_t __byte_perm(uint32_t x, uint32_t y, uint32_t s) {
  const uint64_t b = (static_cast<uint64_t>(y) << 32) | x;
  uint32_t r = 0;
  for (int n = 0; n < 4; ++n) r |= static_cast<uint32_t>((b >> (8 * ((s >> (4 * n)) & 7u))) & 0xffu) << (8 * n);
  return r;
}
template <class T>
inline T __ldg(const T* p) {
  return *p;
}

// ---- device math and atomics ------------------------------------------------------------------------------------
inline float __uint_as_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline int64_t min(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t max(int64_t a, int64_t b) { return a > b ? a : b; }
inline int atomicOr(int* p, int v) {
  const int o = *p;
  *p = o | v;
  return o;
}
inline int atomicMax(int* p, int v) {
  const int o = *p;
  *p = o > v ? o : v;
  return o;
}
inline int atomicMin(int* p, int v) {
  const int o = *p;
  *p = o < v ? o : v;
  return o;
}
inline float atomicAdd(float* p, float v) {
  const float o = *p;
  *p = o + v;
  return o;
}
inline int atomicAdd(int* p, int v) {
  const int o = *p;
  *p = o + v;
  return o;
}

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static thread_local
#define DFLASH_UNROLL

// ---- the fiber scheduler ----------------------------------------------------------------------------------------
namespace emu {

enum class FState { Runnable, AtBlockBarrier, AtWarpBarrier, Done };

// One cp.async of this fiber in flight: its destination (an offset into dynamic shared memory) and its bytes (read
// from global memory at issue; zeros when zero-filled).
struct PendingCopy {
  uint32_t dst = 0;
  int n = 0;
  unsigned char bytes[16];
};

struct Fiber {
  ucontext_t ctx;
  uint3 tid;
  int linear = 0, warp = 0, lane = 0;
  FState state = FState::Runnable;
  std::vector<PendingCopy> open;                 // cp.async issued since the last commit_group
  std::vector<std::vector<PendingCopy>> groups;  // committed groups, oldest first
};

struct BlockRun {
  dim3 grid, block;
  uint3 block_idx;
  std::vector<Fiber> fibers;
  std::vector<std::vector<char>> stacks;
  std::vector<uint64_t> xch;  // warp exchange slots: [warp][32]
  std::vector<unsigned char> dyn;
  ucontext_t sched;
  int cur = 0;
  std::function<void()> body;
  uint64_t barrier_count = 0;
};

inline BlockRun*& run() {
  static thread_local BlockRun* r = nullptr;
  return r;
}
inline Fiber& me() { return run()->fibers[static_cast<size_t>(run()->cur)]; }

inline void land(const std::vector<PendingCopy>& g);

inline void entry() {
  run()->body();
  for (const auto& g : me().groups) land(g);  // copies still in flight at exit land all the same
  land(me().open);
  me().groups.clear();
  me().open.clear();
  me().state = FState::Done;
  // returning resumes uc_link (the scheduler)
}

inline void yield_to_scheduler() { swapcontext(&me().ctx, &run()->sched); }

inline void sync_block() {
  me().state = FState::AtBlockBarrier;
  yield_to_scheduler();
}
inline void sync_warp() {
  me().state = FState::AtWarpBarrier;
  yield_to_scheduler();
}

template <class T>
T shfl(T v, int src_lane) {
  static_assert(sizeof(T) <= 8, "shuffle of a type wider than 8 bytes");
  BlockRun& r = *run();
  Fiber& f = me();
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  r.xch[static_cast<size_t>(f.warp) * 32 + static_cast<size_t>(f.lane)] = bits;
  sync_warp();
  Fiber& f2 = me();
  const uint64_t got = r.xch[static_cast<size_t>(f2.warp) * 32 + static_cast<size_t>(src_lane & 31)];
  T out;
  std::memcpy(&out, &got, sizeof(T));
  sync_warp();  // nobody overwrites the slots before every lane has read
  return out;
}

// Warp vote: whether any lane of the warp passes pred (full warps, as shfl).
inline bool vote_any(bool pred) {
  BlockRun& r = *run();
  Fiber& f = me();
  r.xch[static_cast<size_t>(f.warp) * 32 + static_cast<size_t>(f.lane)] = pred ? 1 : 0;
  sync_warp();
  const size_t w = static_cast<size_t>(me().warp) * 32;
  bool any = false;
  for (size_t i = 0; i < 32; ++i) any = any || r.xch[w + i] != 0;
  sync_warp();  // nobody overwrites the slots before every lane has read
  return any;
}

inline const uint3& thread_idx() { return me().tid; }

inline const uint3& block_idx() { return run()->block_idx; }
inline const dim3& block_dim() { return run()->block; }
inline const dim3& grid_dim() { return run()->grid; }
inline unsigned char* dyn_smem() { return run()->dyn.data(); }

inline int order_mode() {  // 0 forward, 1 reverse, 2 random
  const char* e = std::getenv("DFLASH_EMU_ORDER");
  if (!e) return 0;
  if (std::strcmp(e, "rev") == 0) return 1;
  if (std::strcmp(e, "rand") == 0) return 2;
  return 0;
}

[[noreturn]] inline void die(const std::string& msg) {
  std::fprintf(stderr, "cuda_emu: %s\n", msg.c_str());
  std::abort();
}

// ---- cp.async (PTX ISA 9.7.9.25): a fiber's copies are held back until its cp.async.wait_group lets them land, and
// their destination bytes are poisoned (NaN) at issue, so that a read before the wait (and the barrier that publishes
// it) sees NaN instead of the data, and a copy issued while another thread still reads the destination spoils that
// read. Shared addresses (smem_u32) are offsets into dynamic shared memory.
inline uint32_t smem_offset(const void* p) {
  const unsigned char* b = dyn_smem();
  const unsigned char* q = static_cast<const unsigned char*>(p);
  if (q < b || q >= b + run()->dyn.size()) die("shared address outside dynamic shared memory");
  return static_cast<uint32_t>(q - b);
}
inline void cp_async(uint32_t dst, const void* src, int n, bool pred) {
  if (dst % static_cast<uint32_t>(n) != 0 || reinterpret_cast<uintptr_t>(src) % static_cast<uintptr_t>(n) != 0)
    die("cp.async of " + std::to_string(n) + " bytes at a misaligned address");
  if (dst + static_cast<uint32_t>(n) > run()->dyn.size()) die("cp.async past the end of dynamic shared memory");
  PendingCopy c;
  c.dst = dst;
  c.n = n;
  if (pred) std::memcpy(c.bytes, src, static_cast<size_t>(n));
  else std::memset(c.bytes, 0, static_cast<size_t>(n));
  std::memset(dyn_smem() + dst, 0xff, static_cast<size_t>(n));
  me().open.push_back(c);
}
inline void land(const std::vector<PendingCopy>& g) {
  for (const PendingCopy& c : g) std::memcpy(dyn_smem() + c.dst, c.bytes, static_cast<size_t>(c.n));
}
inline void cp_async_commit() {
  Fiber& f = me();
  f.groups.push_back(std::move(f.open));
  f.open.clear();
}
inline void cp_async_wait(int n) {  // until at most n committed groups are in flight (uncommitted copies stay)
  Fiber& f = me();
  while (static_cast<int>(f.groups.size()) > n) {
    land(f.groups.front());
    f.groups.erase(f.groups.begin());
  }
}

template <class... KArgs, class... Args>
void run_grid(dim3 grid, dim3 block, size_t smem, void (*kernel)(KArgs...), Args&&... args) {
  const int nthreads = static_cast<int>(block.x * block.y * block.z);
  if (nthreads <= 0 || nthreads > 1024) die("block of " + std::to_string(nthreads) + " threads");
  if (smem > static_cast<size_t>(smem_limit())) {
    last_error() = cudaErrorInvalidValue;
    return;
  }
  BlockRun r;
  r.grid = grid;
  r.block = block;
  const int nwarps = (nthreads + 31) / 32;
  r.xch.assign(static_cast<size_t>(nwarps) * 32, 0);
  r.fibers.resize(static_cast<size_t>(nthreads));
  r.stacks.resize(static_cast<size_t>(nthreads));
  for (auto& s : r.stacks) s.resize(256 * 1024);
  std::tuple<std::decay_t<KArgs>...> targs(std::forward<Args>(args)...);  // converted once, copied per thread
  r.body = [&]() { std::apply([&](auto... a) { kernel(a...); }, targs); };
  BlockRun* saved = run();
  run() = &r;
  const int mode = order_mode();
  std::mt19937 rng(12345);
  std::vector<int> order(static_cast<size_t>(nthreads));
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        r.block_idx = uint3{bx, by, bz};
        r.dyn.assign(smem + 16, 0xff);  // NaN bytes: uninitialised shared memory reads show up
        for (int t = 0; t < nthreads; ++t) {
          Fiber& f = r.fibers[static_cast<size_t>(t)];
          f.linear = t;
          f.tid = uint3{static_cast<unsigned>(t) % block.x, (static_cast<unsigned>(t) / block.x) % block.y,
                        static_cast<unsigned>(t) / (block.x * block.y)};
          f.warp = t / 32;
          f.lane = t % 32;
          f.state = FState::Runnable;
          f.open.clear();
          f.groups.clear();
          getcontext(&f.ctx);
          f.ctx.uc_stack.ss_sp = r.stacks[static_cast<size_t>(t)].data();
          f.ctx.uc_stack.ss_size = r.stacks[static_cast<size_t>(t)].size();
          f.ctx.uc_link = &r.sched;
          makecontext(&f.ctx, entry, 0);
        }
        for (int t = 0; t < nthreads; ++t) order[static_cast<size_t>(t)] = mode == 1 ? nthreads - 1 - t : t;
        for (;;) {
          if (mode == 2) std::shuffle(order.begin(), order.end(), rng);
          for (int t : order) {
            if (r.fibers[static_cast<size_t>(t)].state != FState::Runnable) continue;
            r.cur = t;
            swapcontext(&r.sched, &r.fibers[static_cast<size_t>(t)].ctx);
          }
          // every fiber is done or waiting: release what can be released
          bool all_done = true, any_block = false, any_warp = false;
          for (auto& f : r.fibers) {
            if (f.state != FState::Done) all_done = false;
            if (f.state == FState::AtBlockBarrier) any_block = true;
            if (f.state == FState::AtWarpBarrier) any_warp = true;
          }
          if (all_done) break;
          bool released = false;
          if (any_warp) {
            for (int w = 0; w < nwarps; ++w) {
              bool complete = true, some = false;
              for (int t = w * 32; t < std::min(nthreads, w * 32 + 32); ++t) {
                const FState s = r.fibers[static_cast<size_t>(t)].state;
                if (s == FState::AtWarpBarrier) some = true;
                else if (s != FState::Done) complete = false;
              }
              if (some && complete) {
                for (int t = w * 32; t < std::min(nthreads, w * 32 + 32); ++t)
                  if (r.fibers[static_cast<size_t>(t)].state == FState::AtWarpBarrier)
                    r.fibers[static_cast<size_t>(t)].state = FState::Runnable;
                released = true;
              }
            }
          } else if (any_block) {
            for (auto& f : r.fibers)
              if (f.state == FState::AtBlockBarrier) f.state = FState::Runnable;
            ++r.barrier_count;
            released = true;
          }
          if (!released) {
            std::string st;
            for (auto& f : r.fibers) st += std::to_string(static_cast<int>(f.state));
            die("deadlock (divergent barrier) in block (" + std::to_string(bx) + "," + std::to_string(by) + "," +
                std::to_string(bz) + "), fiber states " + st);
          }
        }
      }
  run() = saved;
}

template <class F>
struct Launcher {
  dim3 grid, block;
  size_t smem;
  F* kernel;
  template <class... Args>
  void operator()(Args&&... args) const {
    run_grid(grid, block, smem, kernel, std::forward<Args>(args)...);
  }
};
template <class... KArgs>
Launcher<void(KArgs...)> launch(dim3 grid, dim3 block, size_t smem, cudaStream_t, void (*kernel)(KArgs...)) {
  return Launcher<void(KArgs...)>{grid, block, smem, kernel};
}

}  // namespace emu

inline cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr, int) {
  *v = emu::smem_limit();
  return cudaSuccess;
}

#define threadIdx (::emu::thread_idx())
#define blockIdx (::emu::block_idx())
#define blockDim (::emu::block_dim())
#define gridDim (::emu::grid_dim())
#define __syncthreads() ::emu::sync_block()
#define __syncwarp(...) ::emu::sync_warp()
template <class T>
inline T __shfl_xor_sync(unsigned, T v, int mask) {
  return ::emu::shfl(v, (static_cast<int>(::emu::me().lane) ^ mask) & 31);
}
inline int __any_sync(unsigned, int pred) { return ::emu::vote_any(pred != 0) ? 1 : 0; }
template <class T>
inline T __shfl_sync(unsigned, T v, int src) {
  return ::emu::shfl(v, src & 31);
}
template <class T>
inline T __shfl_up_sync(unsigned, T v, int delta) {
  const int lane = static_cast<int>(::emu::me().lane);
  return ::emu::shfl(v, lane >= delta ? lane - delta : lane);
}
#define DFLASH_LAUNCH(grid, block, smem, stream, ...) ::emu::launch(dim3(grid), dim3(block), (smem), (stream), __VA_ARGS__)
#define DFLASH_DYN_SMEM(name) unsigned char* name = ::emu::dyn_smem()

// ---- cuBLASLt (column-major semantics of cublasLtMatmul, straight from its documentation) -----------------------
typedef int cublasStatus_t;
#define CUBLAS_STATUS_SUCCESS 0
#define CUBLAS_STATUS_INVALID_VALUE 7
#define CUBLAS_STATUS_NOT_SUPPORTED 15
enum cublasOperation_t { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 };
enum cublasComputeType_t { CUBLAS_COMPUTE_32F = 68 };
enum cudaDataType_t { CUDA_R_32F = 0, CUDA_R_16BF = 14 };
typedef cudaDataType_t cudaDataType;
enum cublasLtMatmulDescAttributes_t { CUBLASLT_MATMUL_DESC_TRANSA = 3, CUBLASLT_MATMUL_DESC_TRANSB = 4 };
enum cublasLtMatmulPreferenceAttributes_t {
  CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8
};
struct cublasLtContext {};
typedef cublasLtContext* cublasLtHandle_t;
struct EmuMatmulDesc {
  cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
  cublasComputeType_t compute;
  cudaDataType_t scale;
};
typedef EmuMatmulDesc* cublasLtMatmulDesc_t;
struct EmuLayout {
  cudaDataType_t type;
  uint64_t rows, cols;
  int64_t ld;
};
typedef EmuLayout* cublasLtMatrixLayout_t;
struct EmuPref {};
typedef EmuPref* cublasLtMatmulPreference_t;
struct cublasLtMatmulAlgo_t {
  uint64_t data[8];
};
struct cublasLtMatmulHeuristicResult_t {
  cublasLtMatmulAlgo_t algo;
  size_t workspaceSize;
  cublasStatus_t state;
  float wavesCount;
  int reserved[4];
};
inline const char* cublasLtGetStatusString(cublasStatus_t s) { return s == 0 ? "success" : "cublasLt emu error"; }
inline cublasStatus_t cublasLtCreate(cublasLtHandle_t* h) {
  *h = new cublasLtContext;
  return 0;
}
inline cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
  delete h;
  return 0;
}
inline cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* d, cublasComputeType_t c, cudaDataType_t s) {
  *d = new EmuMatmulDesc{CUBLAS_OP_N, CUBLAS_OP_N, c, s};
  return 0;
}
inline cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
  delete d;
  return 0;
}
inline cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a,
                                                     const void* buf, size_t n) {
  if (n != sizeof(cublasOperation_t)) return CUBLAS_STATUS_INVALID_VALUE;
  cublasOperation_t op;
  std::memcpy(&op, buf, n);
  if (a == CUBLASLT_MATMUL_DESC_TRANSA) d->ta = op;
  else if (a == CUBLASLT_MATMUL_DESC_TRANSB) d->tb = op;
  else return CUBLAS_STATUS_NOT_SUPPORTED;
  return 0;
}
inline cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* l, cudaDataType t, uint64_t rows,
                                                 uint64_t cols, int64_t ld) {
  if (ld < static_cast<int64_t>(rows)) return CUBLAS_STATUS_INVALID_VALUE;  // column-major: ld >= rows
  *l = new EmuLayout{t, rows, cols, ld};
  return 0;
}
inline cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
  delete l;
  return 0;
}
inline cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* p) {
  *p = new EmuPref;
  return 0;
}
inline cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
  delete p;
  return 0;
}
inline cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t, cublasLtMatmulPreferenceAttributes_t,
                                                           const void*, size_t) {
  return 0;
}
namespace emu {
// D (m x n) = op(A) (m x k) op(B) (k x n); A stored rows x cols = m x k (OP_N) or k x m (OP_T); likewise B.
inline bool lt_shapes(const EmuMatmulDesc& d, const EmuLayout& A, const EmuLayout& B, const EmuLayout& C, uint64_t* m,
                      uint64_t* n, uint64_t* k) {
  *m = d.ta == CUBLAS_OP_N ? A.rows : A.cols;
  *k = d.ta == CUBLAS_OP_N ? A.cols : A.rows;
  const uint64_t kb = d.tb == CUBLAS_OP_N ? B.rows : B.cols;
  *n = d.tb == CUBLAS_OP_N ? B.cols : B.rows;
  return kb == *k && C.rows == *m && C.cols == *n;
}
inline float lt_load(const void* p, cudaDataType_t t, int64_t i) {
  if (t == CUDA_R_32F) return static_cast<const float*>(p)[i];
  return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
}
}  // namespace emu
inline cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t A,
                                                     cublasLtMatrixLayout_t B, cublasLtMatrixLayout_t C,
                                                     cublasLtMatrixLayout_t D, cublasLtMatmulPreference_t, int req,
                                                     cublasLtMatmulHeuristicResult_t* res, int* found) {
  uint64_t m, n, k;
  if (req < 1 || !emu::lt_shapes(*d, *A, *B, *C, &m, &n, &k) || D->rows != m || D->cols != n ||
      A->type != CUDA_R_16BF || B->type != CUDA_R_16BF) {
    *found = 0;
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  std::memset(res, 0, sizeof(*res));
  res->state = CUBLAS_STATUS_SUCCESS;
  *found = 1;
  return 0;
}
inline cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t d, const void* alpha, const void* A,
                                     cublasLtMatrixLayout_t Ad, const void* B, cublasLtMatrixLayout_t Bd,
                                     const void* beta, const void* C, cublasLtMatrixLayout_t Cd, void* D,
                                     cublasLtMatrixLayout_t Dd, const cublasLtMatmulAlgo_t*, void*, size_t,
                                     cudaStream_t) {
  uint64_t m, n, k;
  if (!emu::lt_shapes(*d, *Ad, *Bd, *Cd, &m, &n, &k)) return CUBLAS_STATUS_INVALID_VALUE;
  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  std::vector<float> out(m * n);
  for (uint64_t j = 0; j < n; ++j)
    for (uint64_t i = 0; i < m; ++i) {
      float acc = 0.f;
      for (uint64_t l = 0; l < k; ++l) {
        const int64_t ai = d->ta == CUBLAS_OP_N ? static_cast<int64_t>(i + l * Ad->ld) : static_cast<int64_t>(l + i * Ad->ld);
        const int64_t bi = d->tb == CUBLAS_OP_N ? static_cast<int64_t>(l + j * Bd->ld) : static_cast<int64_t>(j + l * Bd->ld);
        acc += emu::lt_load(A, Ad->type, ai) * emu::lt_load(B, Bd->type, bi);
      }
      float v = al * acc;
      if (be != 0.f) v += be * emu::lt_load(C, Cd->type, static_cast<int64_t>(i + j * Cd->ld));
      out[i + j * m] = v;
    }
  for (uint64_t j = 0; j < n; ++j)
    for (uint64_t i = 0; i < m; ++i) {
      const int64_t di = static_cast<int64_t>(i + j * Dd->ld);
      if (Dd->type == CUDA_R_32F) static_cast<float*>(D)[di] = out[i + j * m];
      else static_cast<__nv_bfloat16*>(D)[di] = __float2bfloat16(out[i + j * m]);
    }
  return 0;
}
