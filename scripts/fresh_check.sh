#!/usr/bin/env bash
# The README's two commands on a fresh Debian 12: builds a minimal Debian 12 root with debootstrap
# (from the Debian archive this machine's apt uses), copies a clean clone of the project (HEAD, so
# commit first) and ../shared into it, and runs inside it (chroot, as root, nothing cached):
#   scripts/run.sh "Once upon a time"     then     scripts/test.sh
# printing each one's exit status and time. Not part of CI (it takes the better part of an hour on
# 2 cores); run it whenever a change touches set-up, CMake dependencies or the README's commands.
#   scripts/fresh_check.sh [--root DIR] [--only run|test] [--keep]
# Needs root (debootstrap, chroot, mounts). Logs: DIR/run.log, DIR/test.log.
set -euo pipefail
cd "$(dirname "$0")/.."
project=$(pwd)
shared=$(cd .. && pwd)/shared
root=/var/tmp/tessera-fresh
only=""
keep=0
while [ $# -gt 0 ]; do
  case "$1" in
    --root) root=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    *) echo "usage: scripts/fresh_check.sh [--root DIR] [--only run|test] [--keep]" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" -eq 0 ] || { echo "fresh_check.sh: needs root (debootstrap, chroot, mount)" >&2; exit 2; }
[ -d "$shared/models" ] || { echo "fresh_check.sh: no ../shared beside the project ($shared)" >&2; exit 2; }
command -v debootstrap >/dev/null || {
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
}

# The mirror this machine's apt reads (deb822 or one-line sources), else Debian's own.
mirror=$( (grep -rhoE '^(URIs:|deb) +https?://[^ ]+/debian/?( |$)' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null || true) |
         awk '{print $2}' | head -n 1)
mirror=${mirror:-http://deb.debian.org/debian}

mounted=()
cleanup() {
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[$i]}" 2>/dev/null || true; done
  if [ "$keep" -eq 0 ]; then rm -rf --one-file-system "$root"; fi
}
trap cleanup EXIT

if [ ! -x "$root/bin/bash" ]; then
  rm -rf --one-file-system "$root"
  echo "== debootstrap bookworm (minbase) from $mirror into $root"
  start=$(date +%s)
  debootstrap --variant=minbase bookworm "$root" "$mirror" >"$root.debootstrap.log" 2>&1 ||
    { tail -20 "$root.debootstrap.log"; exit 1; }
  echo "   $(($(date +%s) - start)) s"
fi
# The same package sources as this machine (updates and security included), and name resolution.
cp /etc/resolv.conf "$root/etc/resolv.conf"
rm -f "$root/etc/apt/sources.list"
cp -r /etc/apt/sources.list.d/. "$root/etc/apt/sources.list.d/"
find "$root/etc/apt/sources.list.d" -name '*disabled*' -delete
[ -f /etc/apt/sources.list ] && cp /etc/apt/sources.list "$root/etc/apt/sources.list"

for m in proc sys dev dev/pts; do
  mkdir -p "$root/$m"
  mount --bind "/$m" "$root/$m"
  mounted+=("$root/$m")
done

echo "== a clean clone of $(git rev-parse --short HEAD) and ../shared into $root/work"
rm -rf "$root/work"
mkdir -p "$root/work"
git clone -q "$project" "$root/work/main"
cp -r "$shared" "$root/work/shared"

status=0
run_in_root() {  # name, command
  local start rc
  start=$(date +%s)
  set +e
  chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8 bash -c "cd /work/main && $2" >"$root/$1.log" 2>&1
  rc=$?
  set -e
  printf '%-6s exit %d  %4d s  (%s; log %s)\n' "$1" "$rc" "$(($(date +%s) - start))" "$2" "$root/$1.log"
  [ "$rc" -eq 0 ] || { tail -30 "$root/$1.log"; status=1; }
}
if [ "$only" != test ]; then
  run_in_root run 'scripts/run.sh "Once upon a time"'
  echo "-- its last lines:"
  tail -5 "$root/run.log"
fi
if [ "$only" != run ]; then
  run_in_root test 'scripts/test.sh'
  grep -E "tests passed|tests failed|Total Test time" "$root/test.log" || true
fi
exit $status
