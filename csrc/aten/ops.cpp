// Tensor-level ops over byte ranges of a storage: the journal's gather /
// scatter / hash kernels, exposed as torch.ops.torch_replay.* so they can be
// used (and opchecked) on their own. `data` is a 1-D uint8 tensor (typically a
// byte view of a whole storage), `ranges` an int64 CPU tensor of shape [n, 2]
// holding sorted disjoint byte ranges [begin, end) into it.
#include <torch/library.h>

#include <ATen/ATen.h>

#include "core/byte_kernels.h"

namespace torch_replay::aten {
namespace {

void check_args(const at::Tensor& data, const at::Tensor& ranges) {
  TORCH_CHECK(
      data.dim() == 1 && data.scalar_type() == at::kByte &&
          data.is_contiguous(),
      "torch_replay: data must be a contiguous 1-D uint8 tensor");
  TORCH_CHECK(
      ranges.device().is_cpu() && ranges.scalar_type() == at::kLong &&
          ranges.dim() == 2 && ranges.size(1) == 2 && ranges.is_contiguous(),
      "torch_replay: ranges must be a contiguous int64 CPU tensor of shape "
      "[n, 2]");
  const int64_t* r = ranges.const_data_ptr<int64_t>();
  int64_t prev_end = 0;
  for (int64_t i = 0; i < ranges.size(0); ++i) {
    TORCH_CHECK(
        r[2 * i] >= prev_end && r[2 * i] <= r[2 * i + 1] &&
            r[2 * i + 1] <= data.numel(),
        "torch_replay: ranges must be sorted, disjoint and inside data (range ",
        i,
        " is [",
        r[2 * i],
        ", ",
        r[2 * i + 1],
        "))");
    prev_end = r[2 * i + 1];
  }
}

int64_t total_bytes(const at::Tensor& ranges) {
  const int64_t* r = ranges.const_data_ptr<int64_t>();
  int64_t total = 0;
  for (int64_t i = 0; i < ranges.size(0); ++i) {
    total += r[2 * i + 1] - r[2 * i];
  }
  return total;
}

at::Tensor gather_cpu(
    const at::Tensor& data, const at::Tensor& ranges, int64_t total) {
  check_args(data, ranges);
  TORCH_CHECK(
      total == total_bytes(ranges),
      "torch_replay.gather_ranges: total must equal the bytes in ranges");
  at::Tensor out = at::empty({total}, data.options());
  gather_ranges(
      data.const_data_ptr<uint8_t>(),
      ranges.const_data_ptr<int64_t>(),
      ranges.size(0),
      out.mutable_data_ptr<uint8_t>());
  return out;
}

void scatter_cpu(
    const at::Tensor& data, const at::Tensor& ranges, const at::Tensor& src) {
  check_args(data, ranges);
  TORCH_CHECK(
      src.dim() == 1 && src.scalar_type() == at::kByte && src.is_contiguous() &&
          src.numel() == total_bytes(ranges) && src.device() == data.device(),
      "torch_replay.scatter_ranges_: src must be a contiguous uint8 tensor on "
      "data's device holding exactly the bytes of ranges");
  scatter_ranges(
      data.mutable_data_ptr<uint8_t>(),
      ranges.const_data_ptr<int64_t>(),
      ranges.size(0),
      src.const_data_ptr<uint8_t>());
}

at::Tensor hash_cpu(const at::Tensor& data, const at::Tensor& ranges) {
  check_args(data, ranges);
  Hash128 h = hash_ranges(
      data.const_data_ptr<uint8_t>(),
      ranges.const_data_ptr<int64_t>(),
      ranges.size(0));
  at::Tensor out = at::empty({2}, ranges.options());
  out.mutable_data_ptr<int64_t>()[0] = static_cast<int64_t>(h.lo);
  out.mutable_data_ptr<int64_t>()[1] = static_cast<int64_t>(h.hi);
  return out;
}

at::Tensor gather_meta(
    const at::Tensor& data, const at::Tensor& ranges, c10::SymInt total) {
  (void)ranges;
  return at::empty_symint({std::move(total)}, data.options());
}

void scatter_meta(
    const at::Tensor& data, const at::Tensor& ranges, const at::Tensor& src) {
  (void)data;
  (void)ranges;
  (void)src;
}

at::Tensor hash_meta(const at::Tensor& data, const at::Tensor& ranges) {
  (void)data;
  return at::empty({2}, ranges.options());
}

}  // namespace

TORCH_LIBRARY(torch_replay, m) {
  m.def("gather_ranges(Tensor data, Tensor ranges, SymInt total) -> Tensor");
  m.def("scatter_ranges_(Tensor(a!) data, Tensor ranges, Tensor src) -> ()");
  m.def("hash_ranges(Tensor data, Tensor ranges) -> Tensor");
}

TORCH_LIBRARY_IMPL(torch_replay, CPU, m) {
  m.impl(
      "gather_ranges",
      [](const at::Tensor& d, const at::Tensor& r, int64_t total) {
        return gather_cpu(d, r, total);
      });
  m.impl("scatter_ranges_", &scatter_cpu);
  m.impl("hash_ranges", &hash_cpu);
}

TORCH_LIBRARY_IMPL(torch_replay, Meta, m) {
  m.impl("gather_ranges", &gather_meta);
  m.impl("scatter_ranges_", &scatter_meta);
  m.impl("hash_ranges", &hash_meta);
}

}  // namespace torch_replay::aten
