// Bindings of the steady-heap setting (Note [Steady heap]).
#include "core/heap_policy.h"
#include "python/bindings.h"

TORCH_REPLAY_BINDINGS(heap) {
  m.def(
      "steady_heap",
      &torch_replay::steady_heap,
      "Set glibc's mmap and trim thresholds to 32 and 64 MiB, once per "
      "process, "
      "unless the user chose them or malloc is not glibc's; returns what was "
      "done.");
  m.def(
      "steady_heap_outcome",
      &torch_replay::steady_heap_outcome,
      "What the first steady_heap() call did, or '' before it.");
}
