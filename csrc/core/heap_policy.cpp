#include "core/heap_policy.h"

#include <cstdlib>
#include <mutex>
#include <string>

#if defined(__GLIBC__)
#include <dlfcn.h>
#include <malloc.h>
#endif

namespace torch_replay {

namespace {

constexpr const char* kEnvSettings[] = {
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_TOP_PAD_",
    "MALLOC_MMAP_MAX_",
};

constexpr const char* kTunables[] = {
    "glibc.malloc.mmap_threshold",
    "glibc.malloc.trim_threshold",
    "glibc.malloc.top_pad",
    "glibc.malloc.mmap_max",
};

struct Outcome {
  std::once_flag once;
  std::string text;
};

Outcome& outcome() {
  static Outcome o;
  return o;
}

std::string mib(size_t bytes) {
  return std::to_string(bytes >> 20) + " MiB";
}

#if defined(__GLIBC__)
// Whether the malloc the process calls is glibc's own (not an allocator
// preloaded in front of it).
bool malloc_is_glibc() {
  void* libc = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
  if (libc == nullptr) {
    return false;
  }
  const bool same = dlsym(libc, "malloc") == dlsym(RTLD_DEFAULT, "malloc");
  dlclose(libc);
  return same;
}
#endif

std::string apply() {
#if defined(__GLIBC__)
  const std::string user = user_malloc_setting(
      [](const char* name) -> const char* { return std::getenv(name); });
  if (!user.empty()) {
    return "left: " + user +
           " is set (the user's choice of glibc's thresholds stands)";
  }
  if (!malloc_is_glibc()) {
    return "left: malloc is not glibc's (an allocator is preloaded); nothing "
           "to set";
  }
  // The mmap threshold first: setting either one ends glibc's dynamic
  // adjustment, and a trim threshold alone would freeze the mmap threshold
  // wherever it is (128 KiB in a fresh process: every tensor of more than
  // that would then be mapped and faulted in afresh).
  if (mallopt(M_MMAP_THRESHOLD, static_cast<int>(kSteadyMmapThreshold)) != 1 ||
      mallopt(M_TRIM_THRESHOLD, static_cast<int>(kSteadyTrimThreshold)) != 1) {
    return "left: glibc refused mallopt";
  }
  return "set: glibc's mmap threshold " + mib(kSteadyMmapThreshold) +
         ", trim threshold " + mib(kSteadyTrimThreshold);
#else
  return "left: malloc is not glibc's (this platform); nothing to set";
#endif
}

}  // namespace

std::string user_malloc_setting(const char* (*env)(const char*)) {
  for (const char* name : kEnvSettings) {
    if (env(name) != nullptr) {
      return name;
    }
  }
  const char* tunables = env("GLIBC_TUNABLES");
  if (tunables == nullptr) {
    return "";
  }
  // name=value pairs separated by ':'.
  const std::string all = tunables;
  size_t start = 0;
  while (start <= all.size()) {
    size_t end = all.find(':', start);
    if (end == std::string::npos) {
      end = all.size();
    }
    const std::string item = all.substr(start, end - start);
    const std::string name = item.substr(0, item.find('='));
    for (const char* t : kTunables) {
      if (name == t) {
        return std::string("GLIBC_TUNABLES=") + t;
      }
    }
    start = end + 1;
  }
  return "";
}

std::string steady_heap() {
  Outcome& o = outcome();
  std::call_once(o.once, [&] { o.text = apply(); });
  return o.text;
}

std::string steady_heap_outcome() {
  Outcome& o = outcome();
  // Written once under call_once; read after it (the binding runs under the
  // GIL).
  return o.text;
}

}  // namespace torch_replay
