#!/usr/bin/env bash
# Installs the Debian packages Tessera builds with (only those missing), then configures and builds
# into build/. Used by scripts/run.sh, scripts/test.sh and CI.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(build-essential cmake ninja-build pkg-config
          libyaml-cpp-dev libboost-dev nlohmann-json3-dev libcli11-dev
          libgtest-dev libgmock-dev libbenchmark-dev
          libcpp-httplib-dev libdnnl-dev hipcc libamdhip64-dev ccache)
# Extra packages a caller needs (scripts/test.sh: the browser that renders the bench report).
read -r -a extra <<< "${TESSERA_EXTRA_PACKAGES:-}"
packages+=("${extra[@]}")
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Checkouts of the tree in other directories share compiled objects.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$(pwd)}
build_dir=${TESSERA_BUILD_DIR:-build}
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=${CMAKE_BUILD_TYPE:-Release} ${TESSERA_CMAKE_ARGS:-} >/dev/null
cmake --build "$build_dir" -j "$(nproc)"
