#include "core/dtype.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace dflash {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
    case DType::U8: return "U8";
    case DType::Bool: return "BOOL";
    case DType::F64: return "F64";
    case DType::F8E4M3: return "F8_E4M3";
  }
  return "?";
}

bool dtype_from_name(std::string_view n, DType* out) {
  static constexpr struct { const char* name; DType t; } kNames[] = {
      {"F32", DType::F32}, {"BF16", DType::BF16}, {"F16", DType::F16}, {"I32", DType::I32},
      {"I64", DType::I64}, {"U8", DType::U8},     {"BOOL", DType::Bool}, {"F64", DType::F64},
      {"F8_E4M3", DType::F8E4M3}};
  for (const auto& e : kNames)
    if (n == e.name) {
      *out = e.t;
      return true;
    }
  return false;
}

uint16_t f32_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t absx = x & 0x7fffffffu;
  if (absx > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow (after rounding) -> inf
  if (absx < 0x38800000u) {  // subnormal or zero in f16
    if (absx < 0x33000000u) return static_cast<uint16_t>(sign);  // rounds to 0 (<= 2^-25)
    const uint32_t e = absx >> 23;
    const uint32_t m = (absx & 0x7fffffu) | 0x800000u;
    const uint32_t s = 126 - e;  // value / 2^-24 = m * 2^(e-150) * 2^24 = m >> (126 - e), s in [14, 24]
    uint32_t r = m >> s;
    const uint32_t rem = m & ((1u << s) - 1);
    const uint32_t half = 1u << (s - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return static_cast<uint16_t>(sign | r);
  }
  uint32_t r = ((absx - 0x38000000u) >> 13);  // rebias exponent 127 -> 15
  const uint32_t rem = absx & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
  return static_cast<uint16_t>(sign | r);
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu;
  uint32_t m = h & 0x3ffu;
  uint32_t u;
  if (e == 0) {
    if (m == 0) {
      u = sign;
    } else {  // subnormal: normalise
      int ee = -1;
      do { ++ee; m <<= 1; } while (!(m & 0x400u));
      u = sign | static_cast<uint32_t>(127 - 15 - ee) << 23 | (m & 0x3ffu) << 13;
    }
  } else if (e == 31) {
    u = sign | 0x7f800000u | (m << 13);
  } else {
    u = sign | (e - 15 + 127) << 23 | (m << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

float f8e4m3_to_f32(uint8_t v) {
  const int e = (v >> 3) & 15, m = v & 7;
  const float sign = (v & 0x80) ? -1.f : 1.f;
  if (e == 15 && m == 7) return std::numeric_limits<float>::quiet_NaN();
  if (e == 0) return sign * std::ldexp(static_cast<float>(m), -9);
  return sign * std::ldexp(static_cast<float>(8 + m), e - 10);
}

uint8_t f32_to_f8e4m3(float f) {
  if (std::isnan(f)) return 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  float a = std::fabs(f);
  if (a >= 448.f) return sign | 0x7e;  // 448 = 1.75 * 2^8, the largest finite
  // the spacing of e4m3 around a: 2^(floor(log2 a) - 3), and 2^-9 among the subnormals (a < 2^-6)
  int ex;
  std::frexp(a, &ex);  // a = f * 2^ex, f in [0.5, 1)
  const int step_exp = std::max(ex - 1, -6) - 3;
  const float q = std::nearbyint(std::ldexp(a, -step_exp));  // round half to even (the default rounding mode)
  a = std::ldexp(q, step_exp);
  if (a >= 448.f) return sign | 0x7e;
  if (a == 0.f) return sign;
  std::frexp(a, &ex);
  if (ex - 1 < -6) return sign | static_cast<uint8_t>(std::ldexp(a, 9));  // subnormal: m * 2^-9
  const int e = ex - 1 + 7;
  const int m = static_cast<int>(std::ldexp(a, -(ex - 1) + 3)) - 8;
  return sign | static_cast<uint8_t>(e << 3) | static_cast<uint8_t>(m);
}

}  // namespace dflash
