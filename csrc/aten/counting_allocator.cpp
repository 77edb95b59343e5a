// See Note [Counting CPU allocator] in counting_allocator.h.
#include "aten/counting_allocator.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <mutex>
#include <unordered_map>
#include <utility>

namespace torch_replay::aten {
namespace {

// Higher than any allocator torch registers for CPU by default (0), so that
// the swap always takes effect; restoring uses the same priority.
constexpr uint8_t kCountingPriority = 200;

class CountingCPUAllocator final : public c10::Allocator {
 public:
  CountingCPUAllocator() = default;
  CountingCPUAllocator(const CountingCPUAllocator&) = delete;
  CountingCPUAllocator& operator=(const CountingCPUAllocator&) = delete;

  static CountingCPUAllocator& instance() {
    // Leaked on purpose: blocks may be freed during static destruction.
    static auto* alloc = new CountingCPUAllocator();
    return *alloc;
  }

  c10::DataPtr allocate(size_t n) override {
    c10::Allocator* base = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      base = base_;
    }
    TORCH_INTERNAL_ASSERT(base != nullptr);
    c10::DataPtr inner = base->allocate(n);
    void* ptr = inner.get();
    if (ptr == nullptr) {
      return inner;  // zero-byte allocation: nothing to count
    }
    const c10::Device device = inner.device();
    std::lock_guard<std::mutex> lock(mu_);
    const auto bytes = static_cast<int64_t>(n);
    auto it = blocks_.find(ptr);
    if (it != blocks_.end()) {
      // A raw block of ours was freed through another allocator's
      // raw_deleter (after the window): the address is free again. Forget the
      // stale record without freeing it twice.
      it->second.inner.release_context();
      blocks_.erase(it);
    }
    blocks_.emplace(ptr, Block{std::move(inner), bytes, epoch_});
    if (active_) {
      stats_.live += bytes;
      stats_.allocated += bytes;
      stats_.num_allocs += 1;
      stats_.peak = std::max(stats_.peak, stats_.live);
    }
    return c10::DataPtr(ptr, ptr, &CountingCPUAllocator::free_block, device);
  }

  c10::DeleterFnPtr raw_deleter() const override {
    return &CountingCPUAllocator::free_block;
  }

  void copy_data(
      void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  void start() {
    std::lock_guard<std::mutex> lock(mu_);
    TORCH_CHECK(
        !active_,
        "a counting window is already active; stop it before starting another");
    base_ = c10::GetCPUAllocator();
    TORCH_INTERNAL_ASSERT(base_ != this);
    epoch_ += 1;
    stats_ = CountingStats{};
    active_ = true;
    c10::SetCPUAllocator(this, kCountingPriority);
  }

  CountingStats stop() {
    std::lock_guard<std::mutex> lock(mu_);
    TORCH_CHECK(active_, "no counting window is active; call start() first");
    c10::SetCPUAllocator(base_, kCountingPriority);
    active_ = false;
    return stats_;
  }

  CountingStats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

  void reset_peak() {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.peak = stats_.live;
  }

  bool active() {
    std::lock_guard<std::mutex> lock(mu_);
    return active_;
  }

 private:
  struct Block {
    c10::DataPtr inner;  // frees the memory through the original allocator
    int64_t bytes;
    uint64_t epoch;
  };

  static void free_block(void* ptr) {
    instance().release(ptr);
  }

  void release(void* ptr) {
    c10::DataPtr inner;
    c10::DeleterFnPtr foreign = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = blocks_.find(ptr);
      if (it == blocks_.end()) {
        // A raw block allocated before the window (e.g. oneDNN's cache) freed
        // through our raw_deleter: hand it to the allocator that made it.
        foreign = base_ != nullptr ? base_->raw_deleter() : nullptr;
      }
    }
    if (foreign != nullptr || ptr == nullptr) {
      if (foreign != nullptr) {
        foreign(ptr);
      }
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = blocks_.find(ptr);
      TORCH_INTERNAL_ASSERT(it != blocks_.end(), "unknown block freed");
      if (active_ && it->second.epoch == epoch_) {
        stats_.live -= it->second.bytes;
        stats_.num_frees += 1;
      }
      inner = std::move(it->second.inner);
      blocks_.erase(it);
    }
    // `inner` frees the memory here, outside the lock.
  }

  std::mutex mu_;
  c10::Allocator* base_ = nullptr;
  std::unordered_map<void*, Block> blocks_;
  CountingStats stats_;
  uint64_t epoch_ = 0;
  bool active_ = false;
};

}  // namespace

void counting_start() {
  CountingCPUAllocator::instance().start();
}

CountingStats counting_stop() {
  return CountingCPUAllocator::instance().stop();
}

CountingStats counting_stats() {
  return CountingCPUAllocator::instance().stats();
}

void counting_reset_peak() {
  CountingCPUAllocator::instance().reset_peak();
}

bool counting_active() {
  return CountingCPUAllocator::instance().active();
}

}  // namespace torch_replay::aten
