#!/usr/bin/env bash
# Set up (packages + build) and run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
ctest --test-dir "${TESSERA_BUILD_DIR:-build}" --output-on-failure -j "$(nproc)" --timeout 600
