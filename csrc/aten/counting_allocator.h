#pragma once

// Note [Counting CPU allocator]
// The Inductor pass (inductor_pass/stages/guard.py) must measure the exact live
// and peak bytes of one run of a generated wrapper on CPU, to the byte, and
// check them against its modelled peak (design.md §3.1, Theorem 1). Inductor's
// CPU wrapper allocates through empty_strided_cpu and torch.empty_strided, and
// kernels such as extern_kernels.convolution allocate their results and
// workspaces internally: all of them go through c10::GetCPUAllocator(). A
// counting window installs a wrapper around that allocator with
// c10::SetCPUAllocator(alloc, kCountingPriority) and restores the previous
// allocator when it stops. Every block allocated inside the window is
// recorded in a table (data pointer -> requested size); its DataPtr keeps the
// data pointer as context (so raw_allocate / raw_deleter keep working) and
// its deleter removes the record, subtracts the size from the live count when
// the block belongs to the current window, and frees the block through the
// original allocator's DataPtr. Blocks allocated before the window are not
// counted (their frees do not touch the counters), so live bytes are relative
// to the start of the window and can go negative when the program frees an
// input. Requested sizes are counted (the default CPU allocator allocates
// exactly the requested size, padding aside).

#include <cstdint>

namespace torch_replay::aten {

struct CountingStats {
  int64_t live = 0;  // bytes allocated in the window and not yet freed
  int64_t peak = 0;  // max of live since the start (or the last reset_peak)
  int64_t allocated = 0;  // total bytes allocated in the window
  int64_t num_allocs = 0;
  int64_t num_frees = 0;  // frees of blocks allocated in the window
};

// Starts a counting window: installs the counting allocator as the CPU
// allocator and zeroes the counters.
// Precondition: no window is active (TORCH_CHECK).
void counting_start();

// Stops the window, restores the previous CPU allocator and returns the final
// counters. Blocks allocated in the window may be freed later; that is safe.
// Precondition: a window is active (TORCH_CHECK).
CountingStats counting_stop();

// Counters of the active (or last) window.
CountingStats counting_stats();

// Sets peak = live, to measure the peak of a part of the window.
void counting_reset_peak();

// True while a window is active.
bool counting_active();

}  // namespace torch_replay::aten
