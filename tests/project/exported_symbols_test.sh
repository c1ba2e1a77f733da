#!/usr/bin/env bash
# The shared libraries export only their public headers' declarations: nothing of hetmesh::detail
# (the transports' private namespace) and none of a few private functions declared only in
# core/src/*.hpp and afd/src/*.hpp. Usage: exported_symbols_test.sh LIBRARY...
# Prints how many symbols each library exports; fails naming each symbol that should be hidden.
set -euo pipefail

if [[ $# -eq 0 ]]; then
  echo "usage: $0 LIBRARY..." >&2
  exit 2
fi

# Private functions (demangled names, up to their argument list): core/src/suggest.hpp,
# core/src/store_wire.hpp, afd/src/peer.hpp, join.hpp, this_host.hpp. All but store_wire's are
# in public namespaces, so only the visibility (not cmake/library.map) hides them.
private_functions=(
  'hetmesh::edit_distance'
  'hetmesh::closest_name'
  'hetmesh::store_wire::decode_request'
  'hetmesh::afd::peer_name'
  'hetmesh::afd::decode_regions'
  'hetmesh::afd::is_this_host'
)
# Must stay exported: the core's exception, caught by type in every other library and program.
required_in_core='typeinfo for hetmesh::Error'

failed=0
for library in "$@"; do
  name=$(basename "$library")
  if ! symbols=$(nm -DC --defined-only "$library" | sed -E 's/^[0-9a-fA-F]* *[A-Za-z] //'); then
    echo "$name: nm cannot read $library"
    failed=1
    continue
  fi
  count=$(grep -c . <<<"$symbols" || true)
  echo "$name: $count exported symbols"
  if [[ $count -eq 0 ]]; then
    echo "$name: exports nothing: not a hetmesh library?"
    failed=1
  fi
  while IFS= read -r symbol; do
    [[ -z $symbol ]] && continue
    if [[ $symbol == *hetmesh::detail::* ]]; then
      echo "$name: exports a hetmesh::detail symbol: $symbol"
      failed=1
      continue
    fi
    for function in "${private_functions[@]}"; do
      if [[ $symbol == "${function}("* || $symbol == "${function}["* ]]; then
        echo "$name: exports the private function $function: $symbol"
        failed=1
      fi
    done
  done <<<"$symbols"
  if [[ $name == libhetmesh.so* ]] && ! grep -qxF "$required_in_core" <<<"$symbols"; then
    echo "$name: does not export '$required_in_core'"
    failed=1
  fi
done
if [[ $failed -ne 0 ]]; then
  echo "FAILED: see above (a library exports what its public headers do not declare)"
fi
exit $failed
