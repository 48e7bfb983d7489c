// cuda/fill_normal.cu — Context::fill_normal on the device: the values of core/rng.cpp fill_normal, one thread per
// value. Value i of the tensor is in chunk c = i / 2^16, whose stream is Rng(seed, purpose, stream, c); inside the
// chunk, value k = i mod 2^16 consumes Philox4x32-10 block k (four 32-bit words: two 53-bit uniforms u1, u2), and
// out = float(std * sqrt(-2 log u1) cos(2 pi u2)) (Box-Muller in double, as Rng::normal). The Philox rounds and the
// splitmix64 stream derivation repeat core/rng.cpp's (integer arithmetic: bit-identical); log and cos are the
// device's double-precision functions (within an ulp of the host's).
#include "backend/cuda/common.cuh"

namespace dflash::cuda {

namespace {

// splitmix64 of core/rng.cpp (the stream derivation of Rng), on both sides
__host__ __device__ inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

template <class T>
__global__ void k_fill_normal(T* __restrict__ out, int64_t n, double stdev, uint32_t key0, uint32_t key1,
                              uint64_t base) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint64_t chunk = static_cast<uint64_t>(i) >> 16, k = static_cast<uint64_t>(i) & 0xFFFFu;
    const uint64_t stream = splitmix64(base ^ chunk);
    uint32_t c0 = static_cast<uint32_t>(k), c1 = static_cast<uint32_t>(k >> 32);
    uint32_t c2 = static_cast<uint32_t>(stream), c3 = static_cast<uint32_t>(stream >> 32);
    uint32_t k0 = key0, k1 = key1;
    for (int r = 0; r < 10; ++r) {  // Philox4x32-10 (Salmon et al. 2011), as core/rng.cpp
      const uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * c0;
      const uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * c2;
      const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
      const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
      const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
      c1 = lo1;
      c3 = lo0;
      c0 = n0;
      c2 = n2;
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    const uint64_t a = static_cast<uint64_t>(c0) | static_cast<uint64_t>(c1) << 32;
    const uint64_t b = static_cast<uint64_t>(c2) | static_cast<uint64_t>(c3) << 32;
    double u1 = static_cast<double>(a >> 11) * (1.0 / 9007199254740992.0);
    const double u2 = static_cast<double>(b >> 11) * (1.0 / 9007199254740992.0);
    if (u1 < 1e-300) u1 = 1e-300;
    const double z = sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
    out[i] = static_cast<T>(static_cast<float>(z * stdev));
  }
}

}  // namespace

void fill_normal(Env& e, const Tensor& out, double stdev, uint64_t seed, RngPurpose purpose, uint64_t stream) {
  check_on_dev("fill_normal", out, "out");
  DFLASH_CHECK(out.dtype == DType::F32, "fill_normal (cuda): out has dtype ", dtype_name(out.dtype), ", expected F32");
  const int64_t n = out.numel();
  if (n == 0) return;
  // Rng(seed, purpose, stream, c): stream_c = splitmix64(splitmix64(splitmix64(purpose) ^ stream) ^ c)
  const uint64_t base = splitmix64(splitmix64(static_cast<uint64_t>(purpose)) ^ stream);
  const unsigned g = grid_for(n, 256, e.num_sms);
  DFLASH_LAUNCH(g, 256, 0, e.stream, k_fill_normal<float>)(out.ptr<float>(), n, stdev, static_cast<uint32_t>(seed),
                                                           static_cast<uint32_t>(seed >> 32), base);
  check_launch("fill_normal");
}

}  // namespace dflash::cuda
