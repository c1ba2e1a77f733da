#include "entry_probe.hpp"

#include <hetmesh/device_plugin.h>

#include <dirent.h>
#include <dlfcn.h>

#include <cstdio>

namespace hetmesh::cts {
namespace {

int thread_count() {
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return -1;
  int count = 0;
  while (dirent* entry = readdir(dir))
    if (entry->d_name[0] != '.') ++count;
  closedir(dir);
  return count;
}

}  // namespace

int run_entry_probe(int argc, char** argv) {
  if (argc != 3) {
    std::printf("usage: --cts-entry-probe PLUGIN\n");
    return 2;
  }
  const int before = thread_count();
  void* handle = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    std::printf("dlopen failed: %s\n", dlerror());
    return 2;
  }
  auto entry =
      reinterpret_cast<hm_device_plugin_entry_fn>(dlsym(handle, HM_DEVICE_PLUGIN_ENTRY_V1));
  if (entry == nullptr) {
    std::printf("no %s\n", HM_DEVICE_PLUGIN_ENTRY_V1);
    return 2;
  }
  const hm_device_plugin_api* first = entry();
  const hm_device_plugin_api* second = entry();
  const int after = thread_count();
  std::printf("threads %d -> %d, same table %s\n", before, after, first == second ? "Y" : "N");
  return before == after && first == second ? 0 : 1;
}

}  // namespace hetmesh::cts
