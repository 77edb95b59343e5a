#include "core/exhaustive_schedule.h"

#include <algorithm>
#include <limits>

namespace torch_replay::schedule {

ExhaustiveResult solve_exhaustive(const Problem& problem) {
  const int n = problem.num_units();
  if (n > kMaxExhaustiveUnits) {
    throw ReplayException(
        ErrorKind::kInvalidArgument,
        "the exhaustive solver handles at most " +
            std::to_string(kMaxExhaustiveUnits) + " units, got " +
            std::to_string(n) + "; use solve() instead");
  }
  const int m = problem.num_buffers();
  std::vector<uint32_t> pred_mask(n, 0);
  for (int u = 0; u < n; ++u) {
    for (int p : problem.preds(u)) {
      pred_mask[u] |= uint32_t{1} << p;
    }
  }
  std::vector<uint32_t> consumer_mask(m, 0);
  for (int b = 0; b < m; ++b) {
    for (int c : problem.consumers(b)) {
      consumer_mask[b] |= uint32_t{1} << c;
    }
  }
  auto resident = [&](uint32_t mask) {
    int64_t total = 0;
    for (int b = 0; b < m; ++b) {
      const int p = problem.producer(b);
      if (p >= 0 && !((mask >> p) & 1u)) {
        continue;
      }
      if (problem.is_output(b) || (consumer_mask[b] & ~mask) != 0) {
        total += problem.size(b);
      }
    }
    return total;
  };
  constexpr int64_t kUnreached = std::numeric_limits<int64_t>::max();
  const size_t states = size_t{1} << n;
  std::vector<int64_t> best(states, kUnreached);
  std::vector<int8_t> last(states, -1);
  best[0] = 0;
  ExhaustiveResult result;
  for (size_t s = 0; s < states; ++s) {
    if (best[s] == kUnreached) {
      continue;
    }
    ++result.num_downsets;
    const uint32_t mask = static_cast<uint32_t>(s);
    const int64_t res = resident(mask);
    for (int u = 0; u < n; ++u) {
      if (((mask >> u) & 1u) || (pred_mask[u] & ~mask) != 0) {
        continue;
      }
      const int64_t value = std::max(best[s], res + problem.out_bytes(u));
      const size_t next = s | (size_t{1} << u);
      if (value < best[next]) {
        best[next] = value;
        last[next] = static_cast<int8_t>(u);
      }
    }
  }
  size_t s = states - 1;
  result.peak = best[s];
  while (s != 0) {
    const int u = last[s];
    result.order.push_back(u);
    s &= ~(size_t{1} << u);
  }
  std::reverse(result.order.begin(), result.order.end());
  return result;
}

}  // namespace torch_replay::schedule
