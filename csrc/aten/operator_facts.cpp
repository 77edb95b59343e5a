#include "aten/operator_facts.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "aten/callback_thread.h"
#include "aten/tensor_bytes.h"

namespace torch_replay::aten {

namespace {

OpInfo make_info(const at::RecordFunction& fn) {
  OpInfo info;
  std::optional<c10::FunctionSchema> schema = fn.operator_schema();
  if (!schema.has_value()) {
    info.op = false;
    info.skip = true;
    return info;
  }
  const std::string& name = schema->name();
  std::optional<c10::OperatorHandle> op =
      c10::Dispatcher::singleton().findOp(schema->operator_name());
  const bool inplace_view = op.has_value() && op->hasTag(at::Tag::inplace_view);
  info.random = op.has_value() && op->hasTag(at::Tag::nondeterministic_seeded);
  // Operators whose "writes" change metadata or identity only, never bytes.
  const bool metadata_only =
      inplace_view || name == "aten::set_" || name == "aten::resize_" ||
      name == "aten::resize_as_" || name == "aten::detach_";
  bool view = false;
  for (const auto& arg : schema->arguments()) {
    const c10::TypePtr& type = arg.type();
    info.takes_generator |=
        type->kind() == c10::TypeKind::GeneratorType ||
        (type->kind() == c10::TypeKind::OptionalType &&
         type->containedType(0)->kind() == c10::TypeKind::GeneratorType);
    const c10::AliasInfo* alias = arg.alias_info();
    const bool write = alias != nullptr && alias->isWrite();
    view |= alias != nullptr && !alias->isWrite();
    info.writes.push_back(write && !metadata_only);
    info.may_write |= write && !metadata_only;
    info.metadata_write |= write && metadata_only;
    bool returned = false;
    for (const auto& ret : schema->returns()) {
      const c10::AliasInfo* r = ret.alias_info();
      if (alias == nullptr || r == nullptr) {
        continue;
      }
      for (const auto& set : alias->beforeSets()) {
        returned |= r->beforeSets().count(set) > 0;
      }
    }
    info.returned.push_back(returned);
  }
  info.skip = view;
  info.differentiable = name != "aten::detach";
  // (An in-place view, t_ or unsqueeze_, changes argument 0's sizes and
  // strides: its start metadata must be put back for the re-run too.)
  info.reshapes = inplace_view || name == "aten::set_" ||
                  name == "aten::resize_" || name == "aten::resize_as_" ||
                  name == "aten::_resize_output_";
  std::string display = name;
  const size_t sep = display.find("::");
  if (sep != std::string::npos) {
    display.replace(sep, 2, ".");
  }
  const std::string& overload = schema->overload_name();
  info.display = display + "." + (overload.empty() ? "default" : overload);
  if (name == "aten::native_batch_norm" || name == "aten::cudnn_batch_norm" ||
      name == "aten::miopen_batch_norm" || name == "aten::batch_norm" ||
      name == "aten::_batch_norm_impl_index" || name == "aten::instance_norm") {
    // (instance_norm: argument 5 is use_input_stats.)
    info.training_arg = 5;
    info.extra = {3, 4};
    info.may_write = true;
  }
  return info;
}

}  // namespace

OperatorFacts& OperatorFacts::thread() {
  return thread_instance<OperatorFacts>();
}

__attribute__((noinline)) const OpInfo& OperatorFacts::of_uncached(
    const at::RecordFunction& fn, const char* key, CachedInfo& slot) {
  auto it = infos_.find(key);
  if (it == infos_.end()) {
    OpInfo info = make_info(fn);
    if (!info.op) {
      // A range named by a string (the autograd engine's "evaluate_function:
      // ..." of every node), whose name lives in the RecordFunction itself:
      // its address is no key (one entry per address would accumulate).
      static const OpInfo kNotAnOperator = info;
      return kNotAnOperator;
    }
    it = infos_.emplace(key, std::make_unique<OpInfo>(std::move(info))).first;
  }
  slot = {key, it->second.get()};
  return *it->second;
}

const OpInfo& operator_info(const at::RecordFunction& fn) {
  return OperatorFacts::thread().of(fn);
}

void flatten_tensors(
    const c10::IValue& v,
    bool write,
    std::vector<at::Tensor>* tensors,
    std::vector<bool>* writes) {
  if (v.isTensor()) {
    tensors->push_back(v.toTensor());
    writes->push_back(write);
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList().vec()) {
      tensors->push_back(t);
      writes->push_back(write);
    }
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) {
      if (e.isTensor()) {
        tensors->push_back(e.toTensor());
        writes->push_back(write);
      }
    }
  }
}

void collect_arguments(
    const OpInfo& info,
    c10::ArrayRef<const c10::IValue> inputs,
    bool writes_only,
    std::vector<at::Tensor>* tensors,
    std::vector<bool>* writes,
    std::optional<at::Generator>* generator,
    std::vector<bool>* returned) {
  bool training = false;
  if (info.training_arg >= 0 &&
      static_cast<size_t>(info.training_arg) < inputs.size()) {
    const c10::IValue& t = inputs[info.training_arg];
    training = t.isBool() && t.toBool();
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    const c10::IValue& v = inputs[i];
    bool write = i < info.writes.size() && info.writes[i];
    if (training) {
      for (int e : info.extra) {
        write |= static_cast<size_t>(e) == i;
      }
    }
    if (v.isGenerator()) {
      if (generator != nullptr) {
        *generator = v.toGenerator();
      }
    } else if (write || !writes_only) {
      const size_t before = tensors->size();
      flatten_tensors(v, write, tensors, writes);
      if (returned != nullptr) {  // (kept one per tensor, as `writes`)
        const bool r = i < info.returned.size() && info.returned[i];
        for (size_t k = before; k < tensors->size(); ++k) {
          returned->push_back(r);
        }
      }
    }
  }
}

bool observable_key(const at::Tensor& t, StorageKey* key) {
  if (!t.defined() || t.layout() != at::kStrided || !t.has_storage() ||
      t.is_meta() || t.unsafeGetTensorImpl()->is_wrapped_number()) {
    return false;
  }
  *key = storage_key(t);
  return true;
}

void top_level_keys(
    const std::vector<at::Tensor>& tensors,
    const std::vector<bool>& writes,
    std::vector<StorageKey>* keys,
    std::vector<StorageKey>* written) {
  keys->clear();
  written->clear();
  for (size_t i = 0; i < tensors.size(); ++i) {
    StorageKey key = 0;
    if (observable_key(tensors[i], &key)) {
      keys->push_back(key);
      if (writes[i]) {
        written->push_back(key);
      }
    }
  }
}

size_t keep_nested_writes(
    std::vector<at::Tensor>* tensors,
    std::vector<bool>* writes,
    const std::vector<StorageKey>& top_keys,
    const std::vector<StorageKey>& top_written,
    const std::function<bool(StorageKey)>& known) {
  auto has = [](const std::vector<StorageKey>& v, StorageKey k) {
    return std::find(v.begin(), v.end(), k) != v.end();
  };
  size_t kept = 0;
  for (size_t i = 0; i < tensors->size(); ++i) {
    StorageKey key = 0;
    if ((*writes)[i] && observable_key((*tensors)[i], &key) &&
        ((has(top_keys, key) && !has(top_written, key)) ||
         (known && !has(top_written, key) && known(key)))) {
      (*tensors)[kept] = (*tensors)[i];
      (*writes)[kept] = (*writes)[i];
      ++kept;
    }
  }
  tensors->resize(kept);
  writes->resize(kept);
  return kept;
}

c10::Device first_device(const std::vector<at::Tensor>& tensors) {
  for (const at::Tensor& t : tensors) {
    if (t.defined()) {
      return t.device();
    }
  }
  return c10::Device(c10::kCPU);
}

at::CallbackHandle add_operator_callback(
    at::RecordFunctionCallback::StartCallback start,
    at::RecordFunctionCallback::EndCallback end) {
  return at::addThreadLocalCallback(
      at::RecordFunctionCallback(start, end)
          .needsInputs(true)
          .needsOutputs(true)
          .scopes({at::RecordScope::FUNCTION}));
}

}  // namespace torch_replay::aten
