#!/usr/bin/env bash
# The prepared device check for the CUDA backend (sized to finish within 8 minutes on an H200):
# builds, runs the GPU tests (every op against the CPU backend, golden stories260K tokens on the
# device), then prints one short table: op correctness, and gemm and embedding per weight type (float,
# int4, every GGUF block type); single-stream and 64-concurrent decode on a
# synthetic `1b` model in f16 and int8; device copy bandwidth and the decode figure as a share of that
# roofline; prefill TFLOP/s against the measured GEMM ceiling (cuBLAS through the backend).
#
#   scripts/gpu_check.sh                  build in build-gpu/ (needs the project's build dependencies)
#                                         and check
#   scripts/gpu_check.sh --pack [DIR]     NO GPU needed: build here and pack everything the check needs
#                                         (binaries, plugins, the libraries they link, stories260K and
#                                         golden files) into DIR (default build-gpu-bundle/, git-ignored)
#   scripts/gpu_check.sh --bundle [DIR]   check with a DIR made by --pack, on a GPU machine that cannot
#                                         build (no C++ dependencies there, e.g. the lent H200):
#                                           run(command="scripts/gpu_check.sh --bundle",
#                                               carry=["build-gpu-bundle"], timeout_s=540)
#
# The bundle also holds engine_bench, for the engine benchmarks on the device (e.g. the speculative
# sweep: TESSERA_BENCH_BACKEND=cuda engine_bench --benchmark_filter='BM_SpeculativeSweep/0/').
#
# TESSERA_GPU_PROFILE=1 adds, after the table, where a 1b decode step's GPU time goes, per kernel
# (Nsight Compute's per-launch durations summed by scripts/ncu_steps.py), for f16 and int8 weights.
#
# Exit status: 0 when the checks ran and passed, and also when there is no CUDA device (it prints
# "no CUDA device: nothing to check" and checks nothing, so a CPU-only CI step stays green);
# 1 when a build step, a GPU test or the benchmark failed. Logs go to $OUT (when set) or build-gpu-logs/.
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
MODE=build
BUNDLE=$ROOT/build-gpu-bundle
case "${1:-}" in
  --pack) MODE=pack; BUNDLE=$(realpath -m "${2:-$BUNDLE}") ;;
  --bundle) MODE=bundle; BUNDLE=$(realpath -m "${2:-$BUNDLE}") ;;
  "") ;;
  *) echo "usage: $0 [--pack [DIR] | --bundle [DIR]]" >&2; exit 64 ;;
esac
LOGS=${OUT:-$ROOT/build-gpu-logs}
mkdir -p "$LOGS"
START=$(date +%s)
elapsed() { echo "$(( $(date +%s) - START ))s"; }

have_cuda_device() {
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then return 0; fi
  ls /dev/nvidia[0-9]* >/dev/null 2>&1
}

configure_and_build() {  # $1 = build dir, $2 = CUDA architectures
  local build=$1 archs=$2
  export CCACHE_BASEDIR=$ROOT
  cmake -S "$ROOT" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTESSERA_CUDA=ON -DTESSERA_HIP=OFF \
    -DCMAKE_CUDA_ARCHITECTURES="$archs" >"$LOGS/configure.log" 2>&1 || { tail -30 "$LOGS/configure.log"; return 1; }
  cmake --build "$build" -j"$(nproc)" --target tessera gpu_backend_tests conformance_tests gpu_bench engine_bench \
    >"$LOGS/build.log" 2>&1 || { grep -E "error|FAILED" "$LOGS/build.log" | head -30; return 1; }
}

if [[ $MODE == pack ]]; then
  BUILD=$ROOT/build-gpu
  echo "== building the CUDA backend, tests and gpu_bench in $BUILD (sm_80, sm_90)"
  configure_and_build "$BUILD" "80;90" || exit 1
  rm -rf "$BUNDLE"
  mkdir -p "$BUNDLE/build/bin" "$BUNDLE/build/lib/tessera/plugins" "$BUNDLE/build/lib/ext" "$BUNDLE/shared"
  cp "$BUILD"/bin/{tessera,gpu_backend_tests,conformance_tests,gpu_bench,engine_bench} "$BUNDLE/build/bin/"
  cp -P "$BUILD"/lib/libtessera_core.so* "$BUNDLE/build/lib/"
  cp "$BUILD"/lib/tessera/plugins/*.so "$BUNDLE/build/lib/tessera/plugins/"
  rm -f "$BUNDLE"/build/lib/tessera/plugins/libtessera_kernels_hip.so
  strip --strip-unneeded "$BUNDLE"/build/bin/* "$BUNDLE"/build/lib/*.so* "$BUNDLE"/build/lib/tessera/plugins/*.so 2>/dev/null
  # Libraries outside glibc that the binaries link, used on the target only where it lacks them.
  for f in "$BUNDLE"/build/bin/* "$BUNDLE"/build/lib/*.so* "$BUNDLE"/build/lib/tessera/plugins/*.so; do
    ldd "$f" 2>/dev/null | awk '$3 ~ /^\// {print $3}'
  done | sort -u | grep -v -E '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*)\.so' | grep -v "$BUILD" |
    while read -r lib; do cp -L "$lib" "$BUNDLE/build/lib/ext/"; done
  # The paths the test binaries were built with, recreated as links on the target.
  echo "$BUILD" >"$BUNDLE/BUILD_DIR"
  grep '^TESSERA_SHARED_DIR:' "$BUILD/CMakeCache.txt" | cut -d= -f2- >"$BUNDLE/SHARED_DIR"
  SHARED=$(realpath -m "$(cat "$BUNDLE/SHARED_DIR")")
  mkdir -p "$BUNDLE/shared/models"
  cp -r "$SHARED/models/stories260K" "$SHARED/models/aidreams260K" "$BUNDLE/shared/models/"
  cp -r "$SHARED/golden" "$BUNDLE/shared/"
  rm -f "$BUNDLE"/shared/models/*/*.bin
  du -sh "$BUNDLE"
  SIZE=$(du -sm "$BUNDLE" | cut -f1)
  if (( SIZE > 60 )); then echo "warning: the bundle is ${SIZE} MiB; the device tool carries at most 64 MiB" >&2; fi
  echo "packed: on the GPU machine run scripts/gpu_check.sh --bundle $(realpath --relative-to="$ROOT" "$BUNDLE")"
  exit 0
fi

if ! have_cuda_device; then
  echo "no CUDA device: nothing to check"
  exit 0
fi
nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader 2>/dev/null

if [[ $MODE == bundle ]]; then
  [[ -x $BUNDLE/build/bin/gpu_backend_tests ]] || { echo "no bundle at $BUNDLE (make one with --pack)" >&2; exit 1; }
  BUILD=$(cat "$BUNDLE/BUILD_DIR")
  SHARED_LITERAL=$(cat "$BUNDLE/SHARED_DIR")
  # The tests find plugins and models through paths compiled into them: point those at the bundle.
  if [[ ! -e $BUILD ]]; then mkdir -p "$(dirname "$BUILD")" && ln -s "$BUNDLE/build" "$BUILD"; fi
  mkdir -p "$SHARED_LITERAL" 2>/dev/null || true  # creates the directories before any '..'
  SHARED=$(realpath -m "$SHARED_LITERAL")
  if [[ ! -e $SHARED/models/stories260K ]]; then rm -rf "$SHARED" && ln -s "$BUNDLE/shared" "$SHARED"; fi
  if ldd "$BUILD/bin/gpu_backend_tests" | grep -q "not found"; then
    export LD_LIBRARY_PATH=$BUILD/lib:$BUILD/lib/ext${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  fi
else
  BUILD=$ROOT/build-gpu
  CAP=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '.')
  echo "== build ($(elapsed)): sm_${CAP:-90} into $BUILD"
  configure_and_build "$BUILD" "${CAP:-90}" || exit 1
fi
echo "== built ($(elapsed))"
# The backend opens libcublas with dlopen; make the toolkit's copy findable if the loader's path lacks it.
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  if ls "$d"/libcublas.so.1[0-9] >/dev/null 2>&1; then export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d; break; fi
done

FAILED=0
# ---- op correctness ----------------------------------------------------------------------------------
echo "== GPU tests ($(elapsed))"
timeout 240 "$BUILD/bin/gpu_backend_tests" --gtest_filter='*/cuda' --gtest_brief=1 \
  --gtest_output="json:$LOGS/gpu_tests.json" >"$LOGS/gpu_tests.log" 2>&1
GPU_RC=$?
timeout 120 "$BUILD/bin/conformance_tests" --gtest_filter='*/cuda' --gtest_brief=1 \
  --gtest_output="json:$LOGS/conformance.json" >"$LOGS/conformance.log" 2>&1
CONF_RC=$?
grep -E "^\[  FAILED|Failure|TESSERA_TEST_SEED" "$LOGS/gpu_tests.log" "$LOGS/conformance.log" | head -40
(( GPU_RC != 0 || CONF_RC != 0 )) && FAILED=1

# ---- performance -------------------------------------------------------------------------------------
MODEL=${TMPDIR:-/tmp}/tessera-1b-f16.gguf
echo "== synthetic 1b f16 model ($(elapsed))"
[[ -s $MODEL ]] || timeout 180 "$BUILD/bin/tessera" synth --preset 1b --dtype f16 -o "$MODEL" >"$LOGS/synth.log" 2>&1 ||
  { cat "$LOGS/synth.log"; FAILED=1; }
echo "== gpu_bench ($(elapsed))"
timeout 240 "$BUILD/bin/gpu_bench" --backend cuda --model "$MODEL" --quantizers none,int8 --prompt 1024 \
  --tokens 128 --concurrent 64 --json "$LOGS/gpu_bench.json" >"$LOGS/gpu_bench.log" 2>&1
BENCH_RC=$?
(( BENCH_RC != 0 )) && FAILED=1

# ---- the table ---------------------------------------------------------------------------------------
summary() {  # pass/fail/skip counts of a gtest json file
  python3 - "$1" <<'PY' 2>/dev/null || echo "(no result)"
import json, sys
d = json.load(open(sys.argv[1]))
p = f = s = 0
for suite in d.get("testsuites", []):
    for t in suite.get("testsuite", []):
        if t.get("result") == "SKIPPED" or t.get("status") == "NOTRUN": s += 1
        elif t.get("failures"): f += 1
        else: p += 1
print(f"{p} passed, {f} failed, {s} skipped")
PY
}
echo
echo "================ tessera gpu_check ($(elapsed)) ================"
printf "%-34s %s\n" "gpu_backend_tests (ops, golden)" "$(summary "$LOGS/gpu_tests.json") (exit $GPU_RC)"
printf "%-34s %s\n" "conformance_tests (cuda)" "$(summary "$LOGS/conformance.json") (exit $CONF_RC)"
python3 - "$LOGS/gpu_tests.json" <<'PY' 2>/dev/null  # per weight type, as gpu_backend_tests records them
import json, sys
gemm, emb = {}, {}
for suite in json.load(open(sys.argv[1])).get("testsuites", []):
    for t in suite.get("testsuite", []):
        for k, v in t.items():
            if k.startswith("gemm_"): gemm[k[5:]] = v
            elif k.startswith("embedding_"): emb[k[10:]] = v
names = list(dict.fromkeys(list(gemm) + list(emb)))
if names:
    print(f"{'weight type':<14}{'gemm':<8}embedding")
    for n in names: print(f"  {n:<12}{gemm.get(n, '-'):<8}{emb.get(n, '-')}")
PY
sed -n '/^measurement/,$p' "$LOGS/gpu_bench.log"
(( BENCH_RC != 0 )) && { echo "gpu_bench failed (exit $BENCH_RC):"; tail -20 "$LOGS/gpu_bench.log"; }
if [[ ${TESSERA_GPU_PROFILE:-0} == 1 ]]; then
  NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  for pipeline in default int8; do
    echo
    echo "== decode step by kernel, $pipeline weights ($(elapsed))"
    timeout 90 "$NCU" --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv --page raw \
      "$BUILD/bin/tessera" run -p "$ROOT/pipelines/$pipeline.yaml" -m "$MODEL" --backend cuda -n 4 --ignore-eos \
      "Once" >"$LOGS/ncu_$pipeline.csv" 2>"$LOGS/ncu_$pipeline.err" &&
      python3 "$ROOT/scripts/ncu_steps.py" "$LOGS/ncu_$pipeline.csv" | head -25 ||
      { echo "ncu failed:"; tail -5 "$LOGS/ncu_$pipeline.err"; }
  done
fi
echo "logs: $LOGS"
exit $FAILED
