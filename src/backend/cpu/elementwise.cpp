// cpu/elementwise.cpp — embedding gather, y += a*x, column copies, row gathers, row argmax, row scaling, sum of
// squares.
#include <cstring>

#include "backend/cpu/ops.h"

namespace dflash::cpu {

void embedding(ThreadPool& tp, const Tensor& table, const Tensor& ids, const Tensor& out) {
  const int64_t V = table.dim(0), H = table.dim(1), T = ids.numel();
  const int32_t* id = ids.ptr<int32_t>();
  for (int64_t t = 0; t < T; ++t)
    DFLASH_CHECK(id[t] >= 0 && id[t] < V, "embedding: token id ", id[t], " at position ", t, " outside [0, ", V, ")");
  const size_t rb = static_cast<size_t>(H) * dtype_size(table.dtype);
  tp.parallel_for(T, 64, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t)
      std::memcpy(static_cast<char*>(out.data) + t * rb, static_cast<const char*>(table.data) + id[t] * rb, rb);
  });
}

void add(ThreadPool& tp, const Tensor& y, const Tensor& x, float alpha) {
  dispatch_float("add", y.dtype, [&](auto tag) {
    using T = decltype(tag);
    check_float("add", y, "y", float_dtype<T>());
    check_float("add", x, "x", float_dtype<T>());
    T* yp = y.ptr<T>();
    const T* xp = x.ptr<T>();
    const T al = static_cast<T>(alpha);
    tp.parallel_for(y.numel(), 8192, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) yp[i] += al * xp[i];
    });
  });
}

namespace {
void strided_copy(const Tensor& dst, const Tensor& src, int64_t R, int64_t C, int64_t dst_ld, int64_t dst_off,
                  int64_t src_ld, int64_t src_off) {
  const size_t es = dtype_size(src.dtype);
  for (int64_t r = 0; r < R; ++r)
    std::memcpy(static_cast<char*>(dst.data) + (r * dst_ld + dst_off) * es,
                static_cast<const char*>(src.data) + (r * src_ld + src_off) * es, C * es);
}
}  // namespace

void copy_columns(const Tensor& dst, const Tensor& src, int64_t col0) {
  DFLASH_CHECK(dst.dtype == src.dtype && dst.device == Device::CPU && src.device == Device::CPU,
               "copy_columns: host tensors of one dtype");
  const int64_t R = src.rows(), C = src.dim(-1), Ct = dst.dim(-1);
  strided_copy(dst, src, R, C, Ct, col0, C, 0);
}

void gather_columns(const Tensor& dst, const Tensor& src, int64_t col0) {
  DFLASH_CHECK(dst.dtype == src.dtype && dst.device == Device::CPU && src.device == Device::CPU,
               "gather_columns: host tensors of one dtype");
  const int64_t R = dst.rows(), C = dst.dim(-1), Ct = src.dim(-1);
  strided_copy(dst, src, R, C, C, 0, Ct, col0);
}

void gather_rows(const Tensor& dst, const Tensor& src, const Tensor& rows) {
  const int64_t R = rows.numel(), C = src.dim(-1), Rs = src.rows();
  const int32_t* ix = rows.ptr<int32_t>();
  const size_t rb = static_cast<size_t>(C) * dtype_size(src.dtype);
  for (int64_t r = 0; r < R; ++r) {
    DFLASH_CHECK(ix[r] >= 0 && ix[r] < Rs, "gather_rows: row ", ix[r], " outside [0, ", Rs, ")");
    std::memcpy(static_cast<char*>(dst.data) + r * rb, static_cast<const char*>(src.data) + ix[r] * rb, rb);
  }
}

void argmax(ThreadPool& tp, const Tensor& x, const Tensor& out) {
  dispatch_float("argmax", x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const int64_t V = x.dim(-1);
    tp.parallel_for(x.rows(), 1, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const T* row = x.ptr<T>() + r * V;
        int64_t best = 0;
        for (int64_t i = 1; i < V; ++i)
          if (row[i] > row[best]) best = i;
        out.ptr<int32_t>()[r] = static_cast<int32_t>(best);
      }
    });
  });
}

void scale_rows(ThreadPool& tp, const Tensor& x, const Tensor& rows, const Tensor& scale) {
  const int64_t Rs = rows.numel(), R = x.rows(), D = x.dim(-1);
  const int32_t* ix = rows.ptr<int32_t>();
  for (int64_t r = 0; r < Rs; ++r)
    DFLASH_CHECK(ix[r] >= 0 && ix[r] < R && (r == 0 || ix[r] > ix[r - 1]), "scale_rows: rows[", r, "] = ", ix[r],
                 r > 0 ? cat(" after ", ix[r - 1]) : std::string(), ": rows must be strictly ascending in [0, ", R, ")");
  dispatch_float("scale_rows", x.dtype, [&](auto tag) {
    using T = decltype(tag);
    check_float("scale_rows", x, "x", float_dtype<T>());
    check_float("scale_rows", scale, "scale", float_dtype<T>());
    const T* sp = scale.ptr<T>();
    tp.parallel_for(Rs, 16, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        T* row = x.ptr<T>() + ix[r] * D;
        for (int64_t c = 0; c < D; ++c) row[c] *= sp[r];
      }
    });
  });
}

double sum_squares(const Tensor& x) {
  double s = 0;
  dispatch_float("sum_squares", x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* p = x.ptr<T>();
    for (int64_t i = 0; i < x.numel(); ++i) s += static_cast<double>(p[i]) * p[i];
  });
  return s;
}

}  // namespace dflash::cpu
