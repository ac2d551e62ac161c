#!/usr/bin/env bash
# The SDK as an out-of-tree contributor gets it, end to end (ctest runs this as `sdk_check`):
#   1. cmake --install the build into a temporary prefix and check its layout;
#   2. configure and build examples/priority_fair against that prefix only (find_package(Tessera));
#   3. run the example's tests: its behaviour test and tessera-conformance --library on it;
#   4. the installed tessera lists it via TESSERA_PLUGIN_PATH and runs a pipeline that uses it,
#      with the same greedy tokens as the installed default pipeline;
#   5. installed into the prefix, it is found without TESSERA_PLUGIN_PATH.
# Usage: scripts/sdk_check.sh [BUILD_DIR]   (default: build; the build must be complete)
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$src/build}" && pwd)
work=$build/sdk_check
prefix=$work/prefix
example=$work/priority_fair
rm -rf "$work"
mkdir -p "$work"
unset TESSERA_PLUGIN_PATH

step() { echo "== $*"; }
fail() { echo "sdk_check: FAILED: $*" >&2; exit 1; }
cache_value() { sed -n "s/^$1:[A-Z]*=//p" "$build/CMakeCache.txt" | head -1; }

step "install $build into $prefix"
cmake --install "$build" --prefix "$prefix" >"$work/install.log" 2>&1 || { cat "$work/install.log"; fail "cmake --install"; }
for f in include/tessera/plugin.h include/tessera/scheduler.h lib/libtessera_core.so \
         lib/tessera/plugins/libtessera_kernels_cpu.so lib/tessera/plugins/libtessera_scheduler_fcfs.so \
         bin/tessera bin/tessera-conformance share/tessera/pipelines/default.yaml \
         lib/cmake/Tessera/TesseraConfig.cmake lib/cmake/Tessera/TesseraConfigVersion.cmake \
         lib/cmake/Tessera/TesseraTargets.cmake lib/cmake/Tessera/TesseraPlugin.cmake; do
  [ -e "$prefix/$f" ] || fail "the installed SDK lacks $f"
done
"$prefix/bin/tessera" --version

step "build examples/priority_fair against the installed SDK"
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
# The same compiler as the SDK's build: a plugin must share its C++ standard library (build identity).
cmake -S "$src/examples/priority_fair" -B "$example" "${generator[@]}" "${launcher[@]}" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER="$(cache_value CMAKE_CXX_COMPILER)" \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF >"$work/configure.log" 2>&1 \
  || { cat "$work/configure.log"; fail "configuring the example"; }
found=$(sed -n 's/^Tessera_DIR:PATH=//p' "$example/CMakeCache.txt")
[ "$found" = "$prefix/lib/cmake/Tessera" ] || fail "find_package(Tessera) found '$found', not the installed SDK"
cmake --build "$example" >"$work/build.log" 2>&1 || { cat "$work/build.log"; fail "building the example"; }
lib=$example/libtessera_priority_fair.so
[ -f "$lib" ] || fail "the example built no $lib"

step "the example's tests (behaviour + tessera-conformance --library)"
ctest --test-dir "$example" --output-on-failure || fail "the example's tests"
out=$("$prefix/bin/tessera-conformance" --library "$lib" --kind scheduler --gtest_brief=1) \
  || { echo "$out"; fail "tessera-conformance --library $lib"; }
grep -q "testing scheduler 'priority_fair' from $lib" <<<"$out" || { echo "$out"; fail "conformance did not test priority_fair"; }
grep -E "^\[  PASSED  \] [0-9]+ tests" <<<"$out" || { echo "$out"; fail "conformance reported no passed tests"; }
if out=$("$prefix/bin/tessera-conformance" --library "$prefix/lib/libtessera_core.so" 2>&1); then
  fail "tessera-conformance accepted a library that is not a plugin"
fi
grep -q "not a Tessera plugin" <<<"$out" || { echo "$out"; fail "no clear refusal for a non-plugin library"; }

step "the installed tessera loads it from TESSERA_PLUGIN_PATH"
listing=$(TESSERA_PLUGIN_PATH="$example" "$prefix/bin/tessera" plugins 2>&1)
grep -q "^scheduler priority_fair " <<<"$listing" || { echo "$listing"; fail "tessera plugins does not list priority_fair"; }
grep -q "library: $lib" <<<"$listing" || { echo "$listing"; fail "priority_fair is not loaded from $lib"; }
! grep -q "^warning:" <<<"$listing" || { echo "$listing"; fail "a plugin library was refused"; }

step "tessera run with a pipeline that uses it"
model=$(cache_value TESSERA_SHARED_DIR)/models/stories260K/stories260K-f32.gguf
[ -f "$model" ] || fail "no model at $model (TESSERA_SHARED_DIR)"
prompts=(--prompt "Once upon a time" --prompt "Lily and Ben went to the park" --prompt "The cat")
tokens() { grep -o '"completion_token_ids": *\[[^]]*\]' | tr -d ' \n'; }
fair=$(cd "$work" && TESSERA_PLUGIN_PATH="$example" "$prefix/bin/tessera" run --format json -n 24 \
  -p "$src/examples/priority_fair/priority_fair.yaml" -m "$model" "${prompts[@]}") || fail "tessera run with priority_fair"
base=$(cd "$work" && "$prefix/bin/tessera" run --format json -n 24 -m "$model" "${prompts[@]}") \
  || fail "tessera run with the installed default pipeline"
[ -n "$(echo "$fair" | tokens)" ] || { echo "$fair"; fail "no completion tokens from the priority_fair pipeline"; }
[ "$(echo "$fair" | tokens)" = "$(echo "$base" | tokens)" ] \
  || { echo "$fair"; echo "$base"; fail "priority_fair's greedy tokens differ from the default pipeline's"; }
echo "3 prompts, 24 tokens each: same greedy tokens as the default pipeline"

step "installed beside the SDK, it is found without TESSERA_PLUGIN_PATH"
cmake --install "$example" --prefix "$prefix" >/dev/null
listing=$("$prefix/bin/tessera" plugins 2>&1)
grep -q "library: $prefix/lib/tessera/plugins/libtessera_priority_fair.so" <<<"$listing" \
  || { echo "$listing"; fail "tessera does not find the plugin installed in $prefix/lib/tessera/plugins"; }

rm -rf "$work"
echo "sdk_check: OK"
