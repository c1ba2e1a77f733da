#!/usr/bin/env bash
# Builds the plugin template (sdk/template) out of tree from an installed hetmesh SDK only, as a
# vendor would, installs it, and checks that hetmesh loads it and it passes the conformance kit.
# Then checks the rest of the install as its users meet it: the pkg-config files (a plugin source
# and an application built with them alone), the example configs and docs, the Python package.
#
#   ci/test-template.sh [PREFIX [WORKDIR]]
#
#   PREFIX   hetmesh install prefix (default build/ci-install, from
#            `cmake --preset ci && cmake --build --preset ci && cmake --install build/ci`)
#   WORKDIR  scratch folder, emptied first (default build/template-ci)
set -euo pipefail

prefix=$(realpath -m "${1:-build/ci-install}")
work=$(realpath -m "${2:-build/template-ci}")
template="$prefix/share/hetmesh/template"

die() {
  echo "test-template: $*" >&2
  exit 1
}

[[ -f "$template/CMakeLists.txt" ]] || die "$template/CMakeLists.txt is missing: is $prefix a hetmesh install?"
[[ -x "$prefix/bin/hetmesh" ]] || die "$prefix/bin/hetmesh is missing"

# The loader honours these; HETMESH_PLUGINS would even hide --plugin. Test only what we name.
unset HETMESH_PLUGINS HETMESH_PLUGIN_PATH

rm -rf "$work"
mkdir -p "$work"

echo "== the SDK stands on the installed files alone"
# Nothing installed for a plugin author points into the source tree this was built from, and every
# relative link of the installed guides leads to an installed file.
src=$(realpath -m "$(dirname "$0")/..")
for dir in "$template" "$prefix/lib/cmake/hetmesh" "$prefix/share/doc/hetmesh" "$prefix/include/hetmesh"; do
  if grep -rlF -e "$src/sdk" -e "$src/docs" -e "$src/cmake" "$dir"; then
    die "the files above, installed in $dir, name the source tree $src"
  fi
done
for md in "$prefix"/share/doc/hetmesh/*.md "$template/README.md"; do
  while read -r target; do
    target=${target%%#*}
    [[ -z $target || $target == *://* ]] && continue
    [[ -e "$(dirname "$md")/$target" ]] || die "$md links to $target, which is not installed"
  done < <(grep -o '\]([^) ]*)' "$md" | sed 's/^](//; s/)$//')
done
grep -q 'share/doc/hetmesh/writing-a-plugin.md' "$template/README.md" ||
  die "the template's README does not name the installed guide"

echo "== configure, build and install $template (with no fmt or toml++ to find: a plugin needs neither)"
cmake -S "$template" -B "$work/build" -G Ninja \
  -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_INSTALL_PREFIX="$work/install" \
  -DCMAKE_DISABLE_FIND_PACKAGE_fmt=ON -DCMAKE_DISABLE_FIND_PACKAGE_tomlplusplus=ON \
  -DCMAKE_CXX_FLAGS=-Werror
cmake --build "$work/build"
cmake --install "$work/build"

so="$work/install/lib/hetmesh/plugins/libhetmesh-device-mychip.so"
[[ -f "$so" ]] || die "the plugin was not installed at $so"
[[ -f "$so.cts-expected" ]] || die "the expectations file was not installed at $so.cts-expected"

echo "== exported symbols"
exports=$(nm -D --defined-only "$so" | awk '{print $NF}')
echo "$exports"
[[ "$exports" == "hm_device_plugin_v1" ]] || die "the plugin must export exactly hm_device_plugin_v1"

echo "== hetmesh info"
"$prefix/bin/hetmesh" info --plugin "$so" | tee "$work/info.txt"
grep -Eq '^ +mychip:0 ' "$work/info.txt" || die "hetmesh info does not list mychip:0"

# ---- conformance: hetmesh-cts ------------------------------------------------------------------
# Runs the whole kit on the template; known failures would go in the installed
# libhetmesh-device-mychip.so.cts-expected (the template ships it empty).
# The installed cpu plugin comes along so the pair tests cross plugins (mychip <-> cpu).
[[ -x "$prefix/bin/hetmesh-cts" ]] || die "$prefix/bin/hetmesh-cts is not installed"
echo "== hetmesh-cts"
"$prefix/bin/hetmesh-cts" --plugin "$so" --plugin "$prefix/lib/hetmesh/plugins/libhetmesh-device-cpu.so" \
  --junit "$work/cts-mychip.xml" --gtest_brief=1
# -------------------------------------------------------------------------------------------------

# ---- the demo with F on the new plugin, as docs/writing-a-plugin.md "Running the demo on your
# device" says ------------------------------------------------------------------------------------
echo "== hetmesh demo: A on cpu:0, F on mychip:0"
cat >"$work/mychip-job.toml" <<TOML
[job]
attention = 1
ffn = 1
[devices]
attention = "cpu:0"
ffn = "mychip:0"
[plugins]
paths = ["$so"]
TOML
(cd "$work" && "$prefix/bin/hetmesh" demo --config "$work/mychip-job.toml") | tee "$work/demo.txt"
grep -q '^verified: ' "$work/demo.txt" || die "the demo with F on mychip:0 was not verified"

echo "== hetmesh bench transport --plugin: the template's memory between two processes"
"$prefix/bin/hetmesh" bench transport --transport ipc --plugin "$so" --memory mychip \
  --sizes 4K 64K --iterations 20 --json "$work/bench-mychip.json" | tee "$work/bench.txt"
grep -q 'mychip -> mychip memory' "$work/bench.txt" || die "bench transport did not measure mychip's memory"

# ---- the rest of the install ---------------------------------------------------------------------
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
echo "== pkg-config hetmesh-sdk: a plugin source compiles with its flags alone"
printf '#include <hetmesh/device_plugin.h>\nint abi_major(void) { return HM_DEVICE_PLUGIN_ABI_MAJOR; }\n' >"$work/abi.c"
# shellcheck disable=SC2046 # pkg-config's words are separate flags
cc -Werror -c $(pkg-config --cflags hetmesh-sdk) "$work/abi.c" -o "$work/abi.o"
[[ $(pkg-config --variable=plugindir hetmesh-sdk) == "$prefix/lib/hetmesh/plugins" ]] ||
  die "hetmesh-sdk.pc names another plugin folder: $(pkg-config --variable=plugindir hetmesh-sdk)"

echo "== pkg-config hetmesh: an application builds and finds the installed plugins"
cat >"$work/app.cc" <<'APP'
#include <hetmesh/core/device.hpp>
#include <cstdio>
int main() {
  for (const auto& d : hetmesh::PluginRegistry::load().devices()) std::printf("%s\n", d.selector().c_str());
}
APP
# shellcheck disable=SC2046
c++ -Werror "$work/app.cc" -o "$work/app" $(pkg-config --cflags --libs hetmesh) -Wl,-rpath,"$prefix/lib"
"$work/app" | tee "$work/app.txt"
grep -qx 'cpu:0' "$work/app.txt" || die "the application built with pkg-config found no cpu:0"

echo "== find_package(hetmesh COMPONENTS libraries): an application links the core library"
mkdir -p "$work/app-cmake"
cp "$work/app.cc" "$work/app-cmake/app.cc"
cat >"$work/app-cmake/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.25)
project(hetmesh_app LANGUAGES CXX)
find_package(hetmesh REQUIRED COMPONENTS libraries)
add_executable(app app.cc)
target_link_libraries(app PRIVATE hetmesh::hetmesh)
CMAKE
cmake -S "$work/app-cmake" -B "$work/app-cmake/build" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_BUILD_RPATH="$prefix/lib" -DCMAKE_CXX_FLAGS=-Werror >/dev/null
cmake --build "$work/app-cmake/build" >/dev/null
"$work/app-cmake/build/app" | grep -qx 'cpu:0' || die "the application built with find_package found no cpu:0"
if cmake -S "$work/app-cmake" -B "$work/app-cmake/no-fmt" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_DISABLE_FIND_PACKAGE_fmt=ON >"$work/app-cmake/no-fmt.txt" 2>&1; then
  die "COMPONENTS libraries was found without fmt"
fi
grep -q "need fmt and toml++" "$work/app-cmake/no-fmt.txt" ||
  die "COMPONENTS libraries without fmt does not say what is missing: $(cat "$work/app-cmake/no-fmt.txt")"

echo "== example configs and docs"
[[ -f $prefix/share/hetmesh/examples/configs/2a2f-cpu-tcp.toml ]] || die "the example configs are not installed"
[[ -f $prefix/share/hetmesh/examples/python/moe_layer.py ]] || die "the Python example is not installed"
[[ -f $prefix/share/doc/hetmesh/python.md ]] || die "the docs are not installed"

if [[ -d $prefix/lib/python3/dist-packages/hetmesh ]]; then
  echo "== the installed Python package"
  PYTHONPATH="$prefix/lib/python3/dist-packages" /usr/bin/python3 -c \
    "import hetmesh; print(hetmesh.__version__, [d['selector'] for d in hetmesh.devices()])" | tee "$work/python.txt"
  grep -q "'cpu:0'" "$work/python.txt" || die "the installed Python package found no cpu:0"
fi

echo "test-template: ok"
