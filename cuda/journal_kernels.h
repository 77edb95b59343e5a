#pragma once

// CUDA versions of the journal's byte kernels (csrc/core/byte_kernels.h).
// Torch-free: raw device pointers and sizes only, so `nvcc` compiles this
// file anywhere; the ATen binding is csrc/aten/cuda/cuda_byte_device.cpp.
//
// `ranges` is a device array of n (begin, end) int64 pairs, sorted and
// disjoint; `offsets` a device array of n int64 prefix sums of the range
// lengths (where range i starts in the packed buffer).

#include <cuda_runtime_api.h>

#include <cstdint>

namespace torch_replay::cuda {

cudaError_t gather_ranges(
    const uint8_t* base,
    const int64_t* ranges,
    const int64_t* offsets,
    int64_t n,
    uint8_t* dst,
    cudaStream_t stream);

cudaError_t scatter_ranges(
    uint8_t* base,
    const int64_t* ranges,
    const int64_t* offsets,
    int64_t n,
    const uint8_t* src,
    cudaStream_t stream);

// Accumulates the range hash of Note [Range hash] into out[0] (lo) and out[1]
// (hi), two device uint64 the caller zeroes first. Same value as the host
// hash_ranges for the same bytes.
cudaError_t hash_ranges(
    const uint8_t* base,
    const int64_t* ranges,
    int64_t n,
    unsigned long long* out,
    cudaStream_t stream);

}  // namespace torch_replay::cuda
