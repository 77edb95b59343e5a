// user_malloc_setting: which of the user's glibc malloc settings keeps
// steady_heap() from changing the thresholds (Note [Steady heap]).
#include "core/heap_policy.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace torch_replay {
namespace {

std::map<std::string, std::string>* g_env = nullptr;

const char* lookup(const char* name) {
  auto it = g_env->find(name);
  return it == g_env->end() ? nullptr : it->second.c_str();
}

std::string setting(std::map<std::string, std::string> env) {
  g_env = &env;
  return user_malloc_setting(&lookup);
}

TEST(HeapPolicy, NothingSet) {
  EXPECT_EQ(setting({}), "");
  EXPECT_EQ(setting({{"MALLOC_ARENA_MAX", "2"}, {"PATH", "/bin"}}), "");
}

TEST(HeapPolicy, EnvironmentVariables) {
  EXPECT_EQ(
      setting({{"MALLOC_TRIM_THRESHOLD_", "0"}}), "MALLOC_TRIM_THRESHOLD_");
  EXPECT_EQ(
      setting({{"MALLOC_MMAP_THRESHOLD_", "131072"}}),
      "MALLOC_MMAP_THRESHOLD_");
  EXPECT_EQ(setting({{"MALLOC_TOP_PAD_", ""}}), "MALLOC_TOP_PAD_");
  EXPECT_EQ(setting({{"MALLOC_MMAP_MAX_", "0"}}), "MALLOC_MMAP_MAX_");
  // Without the trailing underscore glibc does not read it.
  EXPECT_EQ(setting({{"MALLOC_TRIM_THRESHOLD", "0"}}), "");
}

TEST(HeapPolicy, Tunables) {
  EXPECT_EQ(
      setting({{"GLIBC_TUNABLES", "glibc.malloc.trim_threshold=1048576"}}),
      "GLIBC_TUNABLES=glibc.malloc.trim_threshold");
  EXPECT_EQ(
      setting(
          {{"GLIBC_TUNABLES",
            "glibc.malloc.tcache_count=0:glibc.malloc.mmap_threshold=4096"}}),
      "GLIBC_TUNABLES=glibc.malloc.mmap_threshold");
  EXPECT_EQ(
      setting(
          {{"GLIBC_TUNABLES",
            "glibc.malloc.top_pad=0:glibc.malloc.arena_max=1"}}),
      "GLIBC_TUNABLES=glibc.malloc.top_pad");
  // Other tunables, and names that only start like one, are not a choice of
  // these.
  EXPECT_EQ(
      setting(
          {{"GLIBC_TUNABLES",
            "glibc.malloc.tcache_count=0:glibc.malloc.arena_max=1"}}),
      "");
  EXPECT_EQ(
      setting({{"GLIBC_TUNABLES", "glibc.malloc.mmap_threshold_x=1"}}), "");
  EXPECT_EQ(setting({{"GLIBC_TUNABLES", ""}}), "");
}

}  // namespace
}  // namespace torch_replay
