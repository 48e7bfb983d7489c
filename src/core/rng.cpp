#include "core/rng.h"

#include <algorithm>
#include <cmath>
#include <thread>
#include <vector>

namespace dflash {

namespace {
constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u, kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
}  // namespace

std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  for (int r = 0; r < 10; ++r) {
    const uint64_t p0 = static_cast<uint64_t>(kM0) * c[0];
    const uint64_t p1 = static_cast<uint64_t>(kM1) * c[2];
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
    k[0] += kW0;
    k[1] += kW1;
  }
  return c;
}

Rng::Rng(uint64_t seed, RngPurpose purpose, uint64_t a, uint64_t b) {
  key_ = {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
  stream_ = splitmix64(splitmix64(splitmix64(static_cast<uint64_t>(purpose)) ^ a) ^ b);
}

uint32_t Rng::next_u32() {
  const uint64_t block = pos_ >> 2;
  const auto out = philox4x32_10({static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                                  static_cast<uint32_t>(stream_), static_cast<uint32_t>(stream_ >> 32)},
                                 key_);
  return out[pos_++ & 3];
}

uint64_t Rng::next_u64() {
  const uint64_t lo = next_u32();
  return lo | static_cast<uint64_t>(next_u32()) << 32;
}

float Rng::uniform() { return static_cast<float>(next_u32() >> 8) * (1.0f / 16777216.0f); }

double Rng::uniform_double() { return static_cast<double>(next_u64() >> 11) * (1.0 / 9007199254740992.0); }

uint64_t Rng::below(uint64_t n) {
  const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  uint64_t x;
  do x = next_u64();
  while (x >= limit);
  return x % n;
}

double Rng::normal() {
  double u1 = uniform_double();
  const double u2 = uniform_double();
  if (u1 < 1e-300) u1 = 1e-300;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

void fill_normal(float* out, int64_t n, double std, uint64_t seed, RngPurpose purpose, uint64_t stream,
                 int threads) {
  constexpr int64_t kChunk = int64_t{1} << 16;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  const int64_t hw = std::max(1u, std::thread::hardware_concurrency());
  const int64_t nt = std::min<int64_t>(threads > 0 ? threads : hw, chunks);
  auto work = [&](int64_t t) {
    for (int64_t c = t; c < chunks; c += nt) {
      Rng rng(seed, purpose, stream, static_cast<uint64_t>(c));
      const int64_t e = std::min(n, (c + 1) * kChunk);
      for (int64_t i = c * kChunk; i < e; ++i) out[i] = static_cast<float>(rng.normal() * std);
    }
  };
  if (nt <= 1) {
    if (chunks > 0) work(0);
    return;
  }
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < nt; ++t) pool.emplace_back(work, t);
  work(0);
  for (auto& th : pool) th.join();
}

}  // namespace dflash
