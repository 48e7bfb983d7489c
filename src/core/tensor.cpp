#include "core/tensor.h"

#include <cstdlib>
#include <cstring>
#include <sstream>

namespace dflash {

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << ']';
  return os.str();
}

Tensor Tensor::reshape(Shape s) const {
  Tensor t = *this;
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  DFLASH_CHECK(n == numel(), "reshape ", shape_str(shape), " -> ", shape_str(s), ": element counts differ");
  t.shape = std::move(s);
  return t;
}

Tensor Tensor::slice(int64_t begin, int64_t end) const {
  DFLASH_CHECK(ndim() >= 1 && begin >= 0 && begin <= end && end <= shape[0], "slice [", begin, ", ", end,
               ") of shape ", shape_str(shape));
  Tensor t = *this;
  const int64_t row = shape[0] ? numel() / shape[0] : 0;
  t.shape[0] = end - begin;
  t.data = static_cast<char*>(data) + static_cast<size_t>(begin * row) * dtype_size(dtype);
  return t;
}

Tensor cpu_empty(DType dt, Shape s) {
  Tensor t;
  t.dtype = dt;
  t.device = Device::CPU;
  t.shape = std::move(s);
  for (int64_t d : t.shape) DFLASH_CHECK(d >= 0, "negative dimension in shape ", shape_str(t.shape));
  size_t bytes = (t.nbytes() + 63) / 64 * 64;
  if (bytes == 0) bytes = 64;
  void* p = std::aligned_alloc(64, bytes);
  DFLASH_CHECK(p != nullptr, "host allocation of ", bytes, " bytes failed for shape ", shape_str(t.shape));
  t.owner = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  t.data = p;
  return t;
}

Tensor cpu_zeros(DType dt, Shape s) {
  Tensor t = cpu_empty(dt, std::move(s));
  std::memset(t.data, 0, t.nbytes());
  return t;
}

Tensor cpu_tensor(const std::vector<float>& v, Shape s) {
  Tensor t = cpu_empty(DType::F32, std::move(s));
  DFLASH_CHECK(static_cast<int64_t>(v.size()) == t.numel(), "cpu_tensor: ", v.size(), " values for shape ",
               shape_str(t.shape));
  std::memcpy(t.data, v.data(), t.nbytes());
  return t;
}

Tensor cpu_tensor_i32(const std::vector<int32_t>& v, Shape s) {
  Tensor t = cpu_empty(DType::I32, std::move(s));
  DFLASH_CHECK(static_cast<int64_t>(v.size()) == t.numel(), "cpu_tensor_i32: ", v.size(), " values for shape ",
               shape_str(t.shape));
  std::memcpy(t.data, v.data(), t.nbytes());
  return t;
}

Tensor cpu_clone(const Tensor& src) {
  DFLASH_CHECK(src.device == Device::CPU, "cpu_clone of a ", device_name(src.device), " tensor");
  Tensor t = cpu_empty(src.dtype, src.shape);
  if (src.nbytes()) std::memcpy(t.data, src.data, src.nbytes());
  return t;
}

std::vector<float> to_f32_vector(const Tensor& t) {
  DFLASH_CHECK(t.device == Device::CPU, "to_f32_vector of a ", device_name(t.device), " tensor");
  const size_t n = static_cast<size_t>(t.numel());
  std::vector<float> out(n);
  switch (t.dtype) {
    case DType::F32: if (n) std::memcpy(out.data(), t.data, n * 4); break;
    case DType::BF16: { auto* p = static_cast<const uint16_t*>(t.data); for (size_t i = 0; i < n; ++i) out[i] = bf16_to_f32(p[i]); break; }
    case DType::F16: { auto* p = static_cast<const uint16_t*>(t.data); for (size_t i = 0; i < n; ++i) out[i] = f16_to_f32(p[i]); break; }
    case DType::F64: { auto* p = static_cast<const double*>(t.data); for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(p[i]); break; }
    default: DFLASH_FAIL("to_f32_vector: dtype ", dtype_name(t.dtype), " is not a float type");
  }
  return out;
}

Tensor cpu_to_f32(const Tensor& t) {
  std::vector<float> v = to_f32_vector(t);
  return cpu_tensor(v, t.shape);
}

Tensor cpu_to_bf16(const Tensor& t) {
  DFLASH_CHECK(t.device == Device::CPU && t.dtype == DType::F32, "cpu_to_bf16 needs a host F32 tensor");
  Tensor o = cpu_empty(DType::BF16, t.shape);
  const float* s = t.ptr<float>();
  uint16_t* d = o.ptr<uint16_t>();
  for (int64_t i = 0; i < t.numel(); ++i) d[i] = f32_to_bf16(s[i]);
  return o;
}

}  // namespace dflash
