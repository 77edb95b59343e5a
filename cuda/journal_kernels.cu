#include "journal_kernels.h"

namespace torch_replay::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65535;

__device__ inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// One block per range (grid-strided), threads stride over its bytes.
__global__ void gather_kernel(
    const uint8_t* base,
    const int64_t* ranges,
    const int64_t* offsets,
    int64_t n,
    uint8_t* dst) {
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const int64_t begin = ranges[2 * r], len = ranges[2 * r + 1] - begin;
    uint8_t* out = dst + offsets[r];
    for (int64_t i = threadIdx.x; i < len; i += blockDim.x) {
      out[i] = base[begin + i];
    }
  }
}

__global__ void scatter_kernel(
    uint8_t* base,
    const int64_t* ranges,
    const int64_t* offsets,
    int64_t n,
    const uint8_t* src) {
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const int64_t begin = ranges[2 * r], len = ranges[2 * r + 1] - begin;
    const uint8_t* in = src + offsets[r];
    for (int64_t i = threadIdx.x; i < len; i += blockDim.x) {
      base[begin + i] = in[i];
    }
  }
}

__global__ void hash_kernel(
    const uint8_t* base,
    const int64_t* ranges,
    int64_t n,
    unsigned long long* out) {
  constexpr uint64_t k0 = 0xA0761D6478BD642FULL;
  constexpr uint64_t k1 = 0xE7037ED1A0B428DBULL;
  uint64_t lo = 0, hi = 0;
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const int64_t begin = ranges[2 * r], end = ranges[2 * r + 1];
    const int64_t words = (end - begin + 7) / 8;
    for (int64_t w = threadIdx.x; w < words; w += blockDim.x) {
      const int64_t p = begin + 8 * w;
      uint64_t word = 0;
      for (int b = 0; b < 8 && p + b < end;
           ++b) {  // little-endian, zero-padded
        word |= static_cast<uint64_t>(base[p + b]) << (8 * b);
      }
      lo += splitmix64(word ^ (static_cast<uint64_t>(p) * k0));
      hi += splitmix64(word + (static_cast<uint64_t>(p) * k1));
    }
  }
  atomicAdd(&out[0], static_cast<unsigned long long>(lo));
  atomicAdd(&out[1], static_cast<unsigned long long>(hi));
}

int blocks_for(int64_t n) {
  return static_cast<int>(n < 1 ? 1 : (n < kMaxBlocks ? n : kMaxBlocks));
}

// Launches `kernel` over n ranges on `stream` (nothing to do for n == 0) and
// returns the launch's error.
template <typename... Params, typename... Args>
cudaError_t launch(
    void (*kernel)(Params...), int64_t n, cudaStream_t stream, Args... args) {
  if (n == 0) {
    return cudaSuccess;
  }
  kernel<<<blocks_for(n), kThreads, 0, stream>>>(args...);
  return cudaGetLastError();
}

}  // namespace

cudaError_t gather_ranges(
    const uint8_t* base,
    const int64_t* ranges,
    const int64_t* offsets,
    int64_t n,
    uint8_t* dst,
    cudaStream_t stream) {
  return launch(gather_kernel, n, stream, base, ranges, offsets, n, dst);
}

cudaError_t scatter_ranges(
    uint8_t* base,
    const int64_t* ranges,
    const int64_t* offsets,
    int64_t n,
    const uint8_t* src,
    cudaStream_t stream) {
  return launch(scatter_kernel, n, stream, base, ranges, offsets, n, src);
}

cudaError_t hash_ranges(
    const uint8_t* base,
    const int64_t* ranges,
    int64_t n,
    unsigned long long* out,
    cudaStream_t stream) {
  return launch(hash_kernel, n, stream, base, ranges, n, out);
}

}  // namespace torch_replay::cuda
