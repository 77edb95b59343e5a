// Standalone check of the CUDA byte kernels against a host reference
// (no torch). Built by scripts/run_tests.sh wherever nvcc exists; run only
// where a GPU is present (exit code 77 = skipped, no device).
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "journal_kernels.h"

namespace {

uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

#define CHECK(x)                                                          \
  do {                                                                    \
    cudaError_t e = (x);                                                  \
    if (e != cudaSuccess) {                                               \
      std::printf(                                                        \
          "CUDA error %s at line %d\n", cudaGetErrorString(e), __LINE__); \
      return 1;                                                           \
    }                                                                     \
  } while (0)

}  // namespace

int main() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("no CUDA device: skipped\n");
    return 77;
  }
  std::mt19937 rng(0);
  int failures = 0;
  for (int trial = 0; trial < 50; ++trial) {
    const int64_t size = 1 + rng() % 100000;
    std::vector<uint8_t> host(size);
    for (auto& b : host)
      b = static_cast<uint8_t>(rng());
    std::vector<int64_t> ranges, offsets;
    int64_t pos = rng() % 7, total = 0;
    while (pos < size) {
      int64_t len = 1 + rng() % 5000;
      int64_t end = pos + len < size ? pos + len : size;
      ranges.push_back(pos);
      ranges.push_back(end);
      offsets.push_back(total);
      total += end - pos;
      pos = end + 1 + rng() % 3000;
    }
    const int64_t n = static_cast<int64_t>(offsets.size());
    uint8_t *d_base, *d_packed;
    int64_t *d_ranges, *d_offsets;
    unsigned long long* d_hash;
    CHECK(cudaMalloc(&d_base, size));
    CHECK(cudaMalloc(&d_packed, total > 0 ? total : 1));
    CHECK(cudaMalloc(&d_ranges, sizeof(int64_t) * (2 * n + 1)));
    CHECK(cudaMalloc(&d_offsets, sizeof(int64_t) * (n + 1)));
    CHECK(cudaMalloc(&d_hash, 16));
    CHECK(cudaMemcpy(d_base, host.data(), size, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(
        d_ranges,
        ranges.data(),
        sizeof(int64_t) * 2 * n,
        cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(
        d_offsets,
        offsets.data(),
        sizeof(int64_t) * n,
        cudaMemcpyHostToDevice));
    CHECK(cudaMemset(d_hash, 0, 16));
    CHECK(
        torch_replay::cuda::gather_ranges(
            d_base, d_ranges, d_offsets, n, d_packed, nullptr));
    CHECK(
        torch_replay::cuda::hash_ranges(d_base, d_ranges, n, d_hash, nullptr));
    std::vector<uint8_t> packed(total);
    unsigned long long hash[2];
    CHECK(cudaMemcpy(packed.data(), d_packed, total, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(hash, d_hash, 16, cudaMemcpyDeviceToHost));
    // Host reference.
    uint64_t lo = 0, hi = 0;
    int64_t off = 0;
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t i = ranges[2 * r]; i < ranges[2 * r + 1]; ++i) {
        if (packed[off++] != host[i])
          ++failures;
      }
      for (int64_t p = ranges[2 * r]; p < ranges[2 * r + 1]; p += 8) {
        uint64_t w = 0;
        int64_t len = ranges[2 * r + 1] - p < 8 ? ranges[2 * r + 1] - p : 8;
        std::memcpy(&w, host.data() + p, len);
        lo += mix(w ^ (static_cast<uint64_t>(p) * 0xA0761D6478BD642FULL));
        hi += mix(w + (static_cast<uint64_t>(p) * 0xE7037ED1A0B428DBULL));
      }
    }
    if (hash[0] != lo || hash[1] != hi)
      ++failures;
    // Scatter zeros back, then the packed bytes: must restore the buffer.
    CHECK(cudaMemset(d_base, 0, size));
    CHECK(
        torch_replay::cuda::scatter_ranges(
            d_base, d_ranges, d_offsets, n, d_packed, nullptr));
    std::vector<uint8_t> back(size);
    CHECK(cudaMemcpy(back.data(), d_base, size, cudaMemcpyDeviceToHost));
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t i = ranges[2 * r]; i < ranges[2 * r + 1]; ++i) {
        if (back[i] != host[i])
          ++failures;
      }
    }
    cudaFree(d_base);
    cudaFree(d_packed);
    cudaFree(d_ranges);
    cudaFree(d_offsets);
    cudaFree(d_hash);
  }
  std::printf(
      "%d passed, %d failed\n", failures == 0 ? 50 : 0, failures == 0 ? 0 : 1);
  return failures == 0 ? 0 : 1;
}
