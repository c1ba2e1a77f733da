// hetmesh-plugin-probe PATH [OPTIONS]: loads and initializes one plugin in a throwaway process, so
// the parent can refuse a plugin that crashes or hangs instead of dying with it.
// Exit 0 and "ok <name>" when it loads; exit 1 and the refusal reason otherwise.
//
// It leaves with _exit(): the answer is already written, and exit handlers (a vendor runtime's,
// or LeakSanitizer's, whose own tracer sometimes crashes: google/sanitizers#1353) could only turn
// a good answer into a crash.
#include <hetmesh/core/plugin.hpp>

#include <unistd.h>

#include <cstdio>

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: hetmesh-plugin-probe PLUGIN_PATH [OPTIONS]\n");
    return 2;
  }
  std::string refusal;
  auto plugin = hetmesh::load_plugin_file(argv[1], argc == 3 ? argv[2] : "", &refusal);
  if (!plugin) {
    std::printf("%s\n", refusal.c_str());
    std::fflush(stdout);
    _exit(1);
  }
  std::printf("ok %s\n", plugin->name().c_str());
  std::fflush(stdout);
  _exit(0);
}
