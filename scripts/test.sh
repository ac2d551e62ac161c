#!/usr/bin/env bash
# Set up (packages + build) and run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
# chromium: the bench report's HTML is rendered headless in a test (skipped without it).
TESSERA_EXTRA_PACKAGES="chromium" scripts/setup.sh
ctest --test-dir "${TESSERA_BUILD_DIR:-build}" --output-on-failure -j "$(nproc)" --timeout 600
