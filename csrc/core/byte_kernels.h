#pragma once

// Host kernels behind the host ByteDevice and the CPU registrations of the
// torch_replay::gather_ranges / scatter_ranges ops. Ranges are given as a
// flat array of int64 pairs (begin, end) in bytes, sorted and disjoint.
// The CUDA versions live in cuda/journal_kernels.cu with the same contract.

#include <cstdint>

#include "core/byte_device.h"

namespace torch_replay {

// dst must hold sum(end - begin) bytes.
void gather_ranges(
    const uint8_t* base, const int64_t* ranges, int64_t n, uint8_t* dst);
void scatter_ranges(
    uint8_t* base, const int64_t* ranges, int64_t n, const uint8_t* src);
// Like scatter_ranges, but range i reads from src + offsets[i].
void scatter_ranges_at(
    uint8_t* base,
    const int64_t* ranges,
    int64_t n,
    const uint8_t* src,
    const int64_t* offsets);

// Note [Range hash]
// hash = sum over 8-byte words w at byte offset p (the last word of a range
// zero-padded) of (mix(w ^ p * K0), mix(w + p * K1)) modulo 2^64 per lane,
// where mix is the splitmix64 finaliser. The sum makes it order-free, so a
// GPU computes the same value with atomic adds; the offset makes it
// position-dependent. It detects changes, it is not cryptographic.
Hash128 hash_ranges(const uint8_t* base, const int64_t* ranges, int64_t n);

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

}  // namespace torch_replay
