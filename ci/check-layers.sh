#!/usr/bin/env bash
# Checks that includes follow the layers (shared design, docs/architecture.md "Layers"):
#   sdk/include < core < backends < afd < tools and python (the Python package), and plugins/<name> see only sdk/include, their
#   own public header and their vendor's headers. Also: no vendor header outside plugins/, each
#   library's public headers under its own hetmesh/<library>/ folder, and nothing built from
#   examples/ (it holds configs and scripts, never a library).
# Usage: ci/check-layers.sh [ROOT]   (ROOT defaults to the repository; tests plant violations in
# a copy). Prints every violation as FILE:LINE: text and exits 1 if there is any.
set -uo pipefail
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$root" || exit 2

violations=0
report() {  # report RULE < lines: counts each line as a violation
  local rule=$1 line
  while IFS= read -r line; do
    printf '%s: %s\n' "$line" "$rule"
    violations=$((violations + 1))
  done
}
sources() {  # C and C++ files under the given folders (those that exist)
  local dirs=()
  for d in "$@"; do [[ -d $d ]] && dirs+=("$d"); done
  ((${#dirs[@]})) || return 0
  find "${dirs[@]}" -type f \( -name '*.h' -o -name '*.hpp' -o -name '*.c' -o -name '*.cc' \
    -o -name '*.cu' \) -print0
}
includes() {  # includes PATTERN FOLDER...: include lines of "..." or <...> matching PATTERN
  local pattern=$1
  shift
  sources "$@" | xargs -0 -r grep -nHE "^[[:space:]]*#[[:space:]]*include[[:space:]]*[<\"]($pattern)"
}
includes_all() {  # includes_all PATTERN FOLDER...: PATTERN gives the opening < or " itself
  local pattern=$1
  shift
  sources "$@" | xargs -0 -r grep -nHE "^[[:space:]]*#[[:space:]]*include[[:space:]]*$pattern"
}

# Vendor headers come in angle brackets. The demo's per-device expert kernels (tools/demo/<vendor>/,
# built by the vendor's compiler) are the one place outside plugins/ that may include them.
vendor='<(cuda|hip/|hsa/|level_zero|ze_api|nccl|rccl|nvml)'
report "vendor header outside plugins/" < <(includes_all "$vendor" sdk core backends afd tools python |
  grep -vE '^tools/demo/(cuda|rocm|level_zero)/')

report "sdk/include (layer 0) includes only itself" \
  < <(includes 'hetmesh/(core|transport|afd|plugins)/' sdk/include)
report "core (layer 1) includes a higher layer" < <(includes 'hetmesh/(transport|afd)/' core)
report "backends (layer 2) includes the AFD engine (layer 3)" < <(includes 'hetmesh/afd/' backends)
# Relative includes that climb out of a folder reach into another layer's private files.
report "relative include out of its folder" < <(includes '\.\./' sdk core backends afd plugins python)
report "a plugin includes the host's libraries (plugins see only sdk/include)" \
  < <(includes 'hetmesh/(core|transport|afd)/' plugins)

# Each library's public headers live under hetmesh/<library>/.
for pair in core:core backends:transport afd:afd; do
  folder=${pair%%:*} lib=${pair#*:}
  [[ -d $folder/include/hetmesh ]] || continue
  report "public header outside hetmesh/$lib/" \
    < <(find "$folder/include/hetmesh" -mindepth 1 -maxdepth 1 ! -name "$lib" | sed 's/$/:1/')
done

# Build files link only downwards: a library never names a target or a folder of a higher layer.
report "core's build links a higher layer" \
  < <(grep -nHE 'hetmesh(_|::)(transport|afd|demo)|PROJECT_SOURCE_DIR}/(backends|afd|tools)' core/CMakeLists.txt 2>/dev/null)
report "backends' build links a higher layer" \
  < <(grep -nHE 'hetmesh(_|::)(afd|demo)|PROJECT_SOURCE_DIR}/(afd|tools)' backends/CMakeLists.txt 2>/dev/null)
report "afd's build links the tools" \
  < <(grep -nHE 'hetmesh_demo|hetmesh-cli|PROJECT_SOURCE_DIR}/tools' afd/CMakeLists.txt 2>/dev/null)

# examples/ is a leaf: nothing is built from it and no build file reaches into it for code.
report "examples/ holds no library" < <(find examples -name CMakeLists.txt 2>/dev/null | sed 's/$/:1/')
report "a build file compiles code from examples/" \
  < <(find . -path ./build -prune -o -path ./.git -prune -o -name CMakeLists.txt -print0 |
    xargs -0 -r grep -nHE '(add_subdirectory|target_sources|add_library|add_executable)[^#]*examples/' |
    sed 's#^\./##')

if ((violations)); then
  echo "check-layers: $violations violation(s) in $root" >&2
  exit 1
fi
echo "check-layers: includes follow the layers in $root"
