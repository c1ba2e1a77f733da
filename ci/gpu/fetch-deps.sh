#!/usr/bin/env bash
# Runs HERE, on a machine with a Debian package registry: downloads the development packages the
# GPU machine lacks (it has no registry: cmake, ninja, gcc, CUDA and libibverbs are there, TOML++,
# fmt, CLI11, nlohmann-json, a matching GoogleTest and the HIP headers are not) and unpacks them into
# .deps/gpu (git-ignored), which the device `run` tool carries with `carry: [".deps/gpu"]`.
# ci/gpu/build-and-test.sh then builds against it with CMAKE_PREFIX_PATH=.deps/gpu/usr.
#
# The packages are Debian 12's, the same versions CI builds with (ci/install-deps.sh); their CMake
# package files are relocatable and the shared libraries (libfmt.so.9, libtomlplusplus.so.3) need
# only glibc and libstdc++, which any newer distribution provides.
#
# With STEPMESH_SRC=<a StepMesh checkout> (or a bare repository's worktree), its Python tests too.
set -euo pipefail
cd "$(dirname "$0")/../.."

dest=.deps/gpu
packages=(
  libtomlplusplus-dev libtomlplusplus3
  libfmt-dev libfmt9
  libcli11-dev nlohmann-json3-dev
  libssl-dev libssl3  # the job secret: libcrypto's HMAC and random bytes
  libgtest-dev libgmock-dev
  libamdhip64-dev libhsa-runtime-dev  # headers only: the rocm plugin and hip-on-cuda build there
  libze-dev libze1  # the level_zero plugin's headers, and the loader that loads ze-on-cuda there
  libdlpack-dev  # the Python package (ci/gpu/python.sh); pybind11 comes with the torch wheel there
  ucx-utils libucx0 libnuma1  # ucx_perftest, the same-run baseline of bench transport over ipc
)

download=$(mktemp -d)
trap 'rm -rf "$download"' EXIT
chmod a+rwx "$download"  # apt's sandbox user (_apt) writes the files
(cd "$download" && apt-get download -q "${packages[@]}")

rm -rf "$dest"
mkdir -p "$dest"
for deb in "$download"/*.deb; do
  dpkg -x "$deb" "$dest"
  dpkg-deb --show --showformat='${Package} ${Version}\n' "$deb" >>"$dest/PACKAGES"
done
rm -rf "$dest/usr/share/doc" "$dest/usr/share/lintian" "$dest/usr/share/man"
find "$dest" -xtype l -delete  # development symlinks to runtime libraries not carried (libamdhip64.so)

# StepMesh's own Python tests, run unmodified there against hetmesh's fserver_lib
# (ci/gpu/stepmesh.sh): copied from a StepMesh checkout the caller names, never committed here.
if [ -n "${STEPMESH_SRC:-}" ]; then
  mkdir -p "$dest/stepmesh"
  cp "$STEPMESH_SRC"/tests/fserver/test_fserver*.py "$dest/stepmesh/"
  echo "stepmesh tests $(git -C "$STEPMESH_SRC" rev-parse --short HEAD 2>/dev/null || echo '?')" \
    >>"$dest/PACKAGES"
fi

echo "fetch-deps: unpacked into $dest ($(du -sh "$dest" | cut -f1)):"
sed 's/^/  /' "$dest/PACKAGES"
