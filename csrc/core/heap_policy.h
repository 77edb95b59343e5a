#pragma once

// Note [Steady heap]
// What a step of torch_replay costs beyond torch's checkpoint was, on the
// 2-core CPU machine, mostly not instructions but minor page faults: glibc's
// malloc returned a few MiB at the top of its heap to the system after each
// step (trimming) and faulted them back in during the next one
// (benchmarks/results/replay_speed_allocator.md). torch's tensors and
// torch_replay's bookkeeping share that heap; the RecordFunction callbacks of
// the observer and the write watch make PyTorch allocate thousands of small
// blocks per step (boxed argument lists, node names, callback caches), which
// land between the step's tensor blocks, so the heap's top rises a few MiB
// higher than under torch's checkpoint and crosses glibc's trim threshold.
//
// glibc adjusts its thresholds itself: freeing an mmapped block of S bytes
// (S <= 32 MiB on 64-bit) sets the mmap threshold to S and the trim threshold
// to 2 S, so a process that ever frees a 32 MiB tensor runs with 32 MiB and
// 64 MiB. A small model (a few MiB per tensor) keeps them low (4-8 MiB of
// trim threshold), and there a few MiB of fragmentation decide whether every
// step faults. steady_heap() sets both thresholds to that ceiling (mallopt
// M_MMAP_THRESHOLD 32 MiB, M_TRIM_THRESHOLD 64 MiB) once per process, at the
// first checkpoint call (tr.config.heap, "steady" by default), unless:
//   * the user already chose glibc's malloc settings (MALLOC_MMAP_THRESHOLD_,
//     MALLOC_TRIM_THRESHOLD_, MALLOC_TOP_PAD_ or MALLOC_MMAP_MAX_ in the
//     environment, or a glibc.malloc tunable of the same four in
//     GLIBC_TUNABLES): their choice stands;
//   * malloc is not glibc's (jemalloc, tcmalloc, mimalloc preloaded; not
//     Linux/glibc): there is nothing to set.
// What it changes for the process: up to 64 MiB of free memory at the top of
// the heap stays mapped instead of going back to the system, and blocks of up
// to 32 MiB come from the heap from the start instead of after glibc's first
// adjustment; any mallopt call also ends glibc's dynamic adjustment, which
// would at most have reached the same values. Nothing is allocated, freed or
// moved. Peak-RSS figures taken above the level at a step's start
// (tr.step_peak's physical_peak, the calibration's physical_peak_delta) then
// count only what a step needs beyond the heap it kept from the step before.
// tr.config.heap = "system" (TORCH_REPLAY_HEAP=system) leaves glibc
// alone; the figures with and without it are in
// benchmarks/results/replay_speed.md.

#include <cstddef>
#include <string>

namespace torch_replay {

inline constexpr size_t kSteadyMmapThreshold = size_t{32} << 20;
inline constexpr size_t kSteadyTrimThreshold = size_t{64} << 20;

// The glibc malloc setting the user chose, as they spelled it
// ("MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES=glibc.malloc.top_pad"), or ""
// when they chose none of the four that steady_heap() would set or freeze.
// `env` looks a variable up (std::getenv in the process; tests pass a map).
std::string user_malloc_setting(const char* (*env)(const char*));

// Sets the thresholds once per process (later calls return the first
// outcome). Returns what was done, in words: "set: ..." or "left: <why>".
std::string steady_heap();

// The outcome of the first steady_heap() call, or "" if none was made.
std::string steady_heap_outcome();

}  // namespace torch_replay
