// backend/cuda/check.h — error checks for CUDA runtime and cuBLASLt calls (host code; usable from .cpp and .cu).
// defines: DFLASH_CUDA_CHECK(expr), DFLASH_CUBLAS_CHECK(expr): throw dflash::Error naming the call, file and line.
#pragma once
#include "backend/cuda/ops.h"
#include "core/error.h"

#define DFLASH_CUDA_CHECK(expr)                                                                              \
  do {                                                                                                       \
    const cudaError_t dflash_e_ = (expr);                                                                    \
    if (dflash_e_ != cudaSuccess)                                                                            \
      ::dflash::fail(::dflash::cat("CUDA error '", cudaGetErrorString(dflash_e_), "' from ", #expr, " at ", \
                                   __FILE__, ":", __LINE__));                                                \
  } while (0)

#define DFLASH_CUBLAS_CHECK(expr)                                                                                \
  do {                                                                                                           \
    const cublasStatus_t dflash_s_ = (expr);                                                                     \
    if (dflash_s_ != CUBLAS_STATUS_SUCCESS)                                                                      \
      ::dflash::fail(::dflash::cat("cuBLASLt error '", cublasLtGetStatusString(dflash_s_), "' from ", #expr, \
                                   " at ", __FILE__, ":", __LINE__));                                            \
  } while (0)
