// core/tensor.h — a contiguous, row-major, typed view of memory on one device.
// defines: Device, Shape, Tensor, cpu_empty/cpu_zeros/cpu_tensor, to_f32_vector, shape_str
//
// A Tensor never owns a device-specific allocator: `owner` keeps whatever backs `data` alive (a heap
// buffer, a file mapping, a block of a Context's memory pool). Tensors are always contiguous; a kernel that
// needs strides gets them in its params struct. Copying a Tensor copies the view, not the data.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace dflash {

enum class Device : uint8_t { CPU, CUDA };
inline const char* device_name(Device d) { return d == Device::CPU ? "cpu" : "cuda"; }

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);  // "[2, 3]"

template <class T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::F32; };
template <> struct dtype_of<double> { static constexpr DType value = DType::F64; };
template <> struct dtype_of<int32_t> { static constexpr DType value = DType::I32; };
template <> struct dtype_of<int64_t> { static constexpr DType value = DType::I64; };
template <> struct dtype_of<uint8_t> { static constexpr DType value = DType::U8; };
template <> struct dtype_of<uint16_t> { static constexpr DType value = DType::BF16; };  // raw bf16 bits

struct Tensor {
  DType dtype = DType::F32;
  Device device = Device::CPU;
  Shape shape;
  void* data = nullptr;
  std::shared_ptr<void> owner;

  bool defined() const { return data != nullptr; }
  int ndim() const { return static_cast<int>(shape.size()); }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  // dim(-1) is the last dimension.
  int64_t dim(int i) const {
    const int n = ndim();
    if (i < 0) i += n;
    DFLASH_CHECK(i >= 0 && i < n, "tensor dim ", i, " out of range for shape ", shape_str(shape));
    return shape[static_cast<size_t>(i)];
  }
  // Product of all dims but the last: the number of rows of a [..., D] tensor.
  int64_t rows() const { return ndim() == 0 ? 1 : numel() / shape.back(); }

  // Typed pointer; throws if T does not match dtype (uint16_t is accepted for BF16 and F16, uint8_t for BOOL and the
  // F8_E4M3 codes).
  template <class T>
  T* ptr() const {
    if constexpr (std::is_same_v<T, uint16_t>) {
      DFLASH_CHECK(dtype == DType::BF16 || dtype == DType::F16, "tensor dtype ", dtype_name(dtype),
                   " accessed as 16-bit float");
    } else if constexpr (std::is_same_v<T, void>) {
    } else {
      DFLASH_CHECK(dtype == dtype_of<std::remove_const_t<T>>::value || ((dtype == DType::Bool || dtype == DType::F8E4M3) && std::is_same_v<std::remove_const_t<T>, uint8_t>),
                   "tensor dtype ", dtype_name(dtype), " accessed as ", dtype_name(dtype_of<std::remove_const_t<T>>::value));
    }
    return static_cast<T*>(data);
  }
  template <class T>
  std::span<T> span() const {
    DFLASH_CHECK(device == Device::CPU, "span() of a ", device_name(device), " tensor");
    return {ptr<T>(), static_cast<size_t>(numel())};
  }

  // Same storage, new shape with the same number of elements.
  Tensor reshape(Shape s) const;
  // Rows [begin, end) along dim 0 (a view).
  Tensor slice(int64_t begin, int64_t end) const;
};

// Host tensors, 64-byte aligned. cpu_empty leaves memory uninitialised.
Tensor cpu_empty(DType t, Shape s);
Tensor cpu_zeros(DType t, Shape s);
Tensor cpu_tensor(const std::vector<float>& v, Shape s);
Tensor cpu_tensor_i32(const std::vector<int32_t>& v, Shape s);
// Deep copy of a host tensor (same dtype).
Tensor cpu_clone(const Tensor& t);
// Host tensor of dtype F32 / BF16 / F16 read as floats (converted); throws for other dtypes or device.
std::vector<float> to_f32_vector(const Tensor& t);
// New host F32 tensor converted from a host F32 / BF16 / F16 tensor.
Tensor cpu_to_f32(const Tensor& t);
// New host BF16 tensor from a host F32 tensor (round to nearest even).
Tensor cpu_to_bf16(const Tensor& t);

}  // namespace dflash
