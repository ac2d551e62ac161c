#!/usr/bin/env bash
# Set up (packages + the whole build: tests, benchmarks, GPU backends where their compilers are) and
# run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh all
ctest --test-dir "${TESSERA_BUILD_DIR:-build}" --output-on-failure -j "$(nproc)" --timeout 600
