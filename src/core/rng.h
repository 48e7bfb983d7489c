// core/rng.h — counter-based random numbers (Philox4x32-10, Salmon et al. SC'11; the generator of cuRAND
// and PyTorch's CUDA RNG). A stream is named by (seed, purpose, a, b), e.g. (seed, kAnchors, step, sequence),
// so the numbers a sequence gets do not depend on how many workers run, in what order, or on a resume:
// there is no hidden state to save beyond the position inside a stream.
// defines: philox4x32_10, Rng, RngPurpose
#pragma once
#include <array>
#include <cstdint>

namespace dflash {

std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

// Purposes keep streams of different uses apart.
enum class RngPurpose : uint64_t { Init = 1, DataOrder = 2, Anchors = 3, Sampling = 4, RandomTarget = 5, Test = 99 };

class Rng {
 public:
  Rng(uint64_t seed, RngPurpose purpose, uint64_t a = 0, uint64_t b = 0);
  uint32_t next_u32();
  uint64_t next_u64();
  // Uniform in [0, 1) with 24 random bits (float) / 53 bits (double).
  float uniform();
  double uniform_double();
  // Uniform integer in [0, n), unbiased (rejection). n > 0.
  uint64_t below(uint64_t n);
  // Standard normal (Box-Muller on two doubles).
  double normal();
  // Position inside the stream (number of 32-bit words consumed); set it to resume a stream.
  uint64_t position() const { return pos_; }
  void set_position(uint64_t p) { pos_ = p; }

 private:
  std::array<uint32_t, 2> key_;
  uint64_t stream_;
  uint64_t pos_ = 0;
};

// out[i] = std * N(0,1), filled in chunks of 2^16 values, chunk c from Rng(seed, purpose, stream, c), on up to
// `threads` threads (0 = hardware concurrency). The values do not depend on the thread count.
void fill_normal(float* out, int64_t n, double std, uint64_t seed, RngPurpose purpose, uint64_t stream,
                 int threads = 0);

}  // namespace dflash
