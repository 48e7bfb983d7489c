// core/dtype.h — element types, their sizes and names, and bf16/f16 <-> f32 conversion.
// defines: DType, dtype_size, dtype_name, dtype_from_name, bf16/f16/fp8 (e4m3) conversions
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace dflash {

// F8E4M3: OCP FP8 E4M3 ("e4m3fn": bias 7, no infinities, S.1111.111 = NaN, largest finite 448), the element of
// FP8 checkpoints (safetensors "F8_E4M3"); it holds no value alone, its scales travel beside it (backend/context.h
// LinearWeight).
enum class DType : uint8_t { F32, BF16, F16, I32, I64, U8, Bool, F64, F8E4M3 };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::F16: return 2;
    case DType::I32: return 4;
    case DType::I64: return 8;
    case DType::U8: return 1;
    case DType::Bool: return 1;
    case DType::F64: return 8;
    case DType::F8E4M3: return 1;
  }
  return 0;
}

// Names as written in safetensors headers: "F32", "BF16", "F16", "I32", "I64", "U8", "BOOL", "F64", "F8_E4M3".
const char* dtype_name(DType t);
// Returns false for a name not in the list above.
bool dtype_from_name(std::string_view name, DType* out);

// bf16: the upper 16 bits of an IEEE f32. Conversion rounds to nearest even; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// Rounds f to the nearest bf16 value and back (what a bf16 store followed by a load gives).
inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

// IEEE binary16, round to nearest even, with subnormals, inf and NaN.
uint16_t f32_to_f16(float f);
float f16_to_f32(uint16_t h);

// FP8 E4M3 (e4m3fn) -> f32, exact (subnormals 2^-9 .. 7 * 2^-9; NaN for the two NaN codes).
float f8e4m3_to_f32(uint8_t v);
// f32 -> FP8 E4M3, round to nearest even, saturating to +-448 (CUDA's __NV_SATFINITE; a scaled quantiser keeps
// |f| <= 448 anyway); NaN -> NaN.
uint8_t f32_to_f8e4m3(float f);

}  // namespace dflash
