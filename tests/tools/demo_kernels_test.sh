#!/usr/bin/env bash
# `hetmesh demo` runs an F instance's experts by the routes hetmesh/demo_experts.h describes: with
# F on asic_stub (memory the host cannot touch), through its kernel library
# libhetmesh-demo-asic_stub.so; without one, on the host through staging (saying so); and a
# library without the entry point is refused by name. Each run's result is verified by the demo.
#
#   demo_kernels_test.sh HETMESH CONFIG PLUGIN_FILE
set -uo pipefail
hetmesh=$1 config=$2 not_a_kernel_library=$3
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cd "$scratch" || exit 1
failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

echo "== the kernel library"
# At the default log level: the report says how each F ran its experts.
out=$("$hetmesh" demo --config "$config" 2>&1) || fail "the demo failed: $out"
grep -q "^ffn 0 on asic_stub:0: experts run by .*/libhetmesh-demo-asic_stub.so" <<<"$out" ||
  fail "the report does not say F on asic_stub:0 used libhetmesh-demo-asic_stub.so: $out"
grep -q "^ffn 1 on asic_stub:1: experts run by" <<<"$out" ||
  fail "the report does not say how F 1 ran its experts: $out"
grep -q "F on asic_stub:0, asic_stub:1," <<<"$out" || fail "the banner does not name both F devices: $out"
grep -q "^verified:" <<<"$out" || fail "the result was not verified: $out"

echo "== no kernel library: staged through the host"
mkdir empty
out=$(HETMESH_DEMO_KERNELS=$scratch/empty "$hetmesh" demo --config "$config" 2>&1) ||
  fail "the staged demo failed: $out"
grep -q "asic_stub:0: experts run on the host through staging: .*$scratch/empty/libhetmesh-demo-asic_stub.so" <<<"$out" ||
  fail "the fallback was not reported with the path it tried: $out"
grep -q "^ffn 0 on asic_stub:0: experts run on the host through staging" <<<"$out" ||
  fail "the report does not say the experts were staged: $out"
grep -q "^verified:" <<<"$out" || fail "the staged result was not verified: $out"

echo "== a library without $(echo hm_demo_experts_v1)"
mkdir wrong
cp "$not_a_kernel_library" wrong/libhetmesh-demo-asic_stub.so
if out=$(HETMESH_DEMO_KERNELS=$scratch/wrong timeout 120 "$hetmesh" demo --config "$config" 2>&1); then
  fail "a library without the entry point was accepted: $out"
fi
grep -q "libhetmesh-demo-asic_stub.so does not export hm_demo_experts_v1" <<<"$out" ||
  fail "the refusal does not name the library and the entry point: $out"

[[ $failures -eq 0 ]] && echo "demo_kernels_test: all routes behave"
exit $((failures > 0))
