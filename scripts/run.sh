#!/usr/bin/env bash
# Set up (packages + the build `tessera run` needs) and run the default pipeline on the default model:
#   scripts/run.sh "Once upon a time"
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh run >&2
exec "${TESSERA_BUILD_DIR:-build}/bin/tessera" run "$@"
