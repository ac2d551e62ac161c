#!/usr/bin/env bash
# Where a CPU run's wall time goes between parallel regions (the GEMMs, attention: the thread team of
# tessera/thread_team.h, and OpenMP where code still uses it) and the serial code between them (norms,
# ropes, sampling, the engine), and how long each thread of a region works in it. Wraps
# tessera::team_run_raw and GOMP_parallel through LD_PRELOAD; the command runs unchanged otherwise.
#   scripts/omp_regions.sh build/bin/tessera run -m MODEL -p pipelines/int8.yaml -n 64 --ignore-eos "Once upon a time"
# Prints at exit, per region (the function that encloses it): calls, wall seconds, the seconds threads 0 and 1
# worked in it (the rest is fork latency and waiting at the join), and over the calls that ran as a
# team, the mean fork (from the call to thread 1's start), uneven (between the two threads' ends) and
# join (from the later end to the return), in microseconds; then the gaps between regions.
# Load time is included: compare runs of the same command, or subtract a run with -n 1.
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: $0 COMMAND [ARGS...]" >&2; exit 2; }
dir=$(mktemp -d)
trap "rm -rf \"$dir\"" EXIT
cat >"$dir/shim.c" <<'EOF'
#define _GNU_SOURCE
#include <dlfcn.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

enum { kSites = 64 };
struct Site { void* fn; long calls, teamed; double wall, busy[2], fork, uneven, join; };
static struct Site sites[kSites];
static double gap_total, gap_short, last_end;  // gap_short: gaps under 10 us (inside a step)

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

// One region: the function it runs (OpenMP's outlined one, or the thread team's), its data.
struct Call { void* fn; void* data; struct Site* site; double start[2], end[2]; };
static void record(struct Call* c, int t, double t0, double t1) {
  if (t < 2) {  // each thread its own slots
    c->site->busy[t] += t1 - t0;
    c->start[t] = t0;
    c->end[t] = t1;
  }
}
static void timed_omp(void* p) {
  struct Call* c = p;
  const double t0 = now();
  ((void (*)(void*))c->fn)(c->data);
  record(c, omp_get_thread_num(), t0, now());
}
static void timed_team(void* p, int t, int n) {
  struct Call* c = p;
  const double t0 = now();
  ((void (*)(void*, int, int))c->fn)(c->data, t, n);
  record(c, t, t0, now());
}

static struct Call begin(void* fn, void* data) {
  int s = 0;
  while (s < kSites - 1 && sites[s].fn && sites[s].fn != fn) ++s;
  sites[s].fn = fn;
  struct Call c = {fn, data, &sites[s], {0, 0}, {0, 0}};
  return c;
}
static void end(struct Call* c, double t0) {
  struct Site* site = c->site;
  if (last_end > 0 && t0 - last_end < 1e-3) {  // longer gaps: loading, prompts, idle
    gap_total += t0 - last_end;
    if (t0 - last_end < 1e-5) gap_short += t0 - last_end;
  }
  last_end = now();
  site->wall += last_end - t0;
  ++site->calls;
  if (c->start[1] > 0) {  // a team of two or more: the second thread's start, the ends' spread, the return
    ++site->teamed;
    site->fork += c->start[1] - t0;
    const double first = c->end[0] < c->end[1] ? c->end[0] : c->end[1], last = c->end[0] + c->end[1] - first;
    site->uneven += last - first;
    site->join += last_end - last;
  }
}

void GOMP_parallel(void (*fn)(void*), void* data, unsigned threads, unsigned flags) {
  static void (*real)(void (*)(void*), void*, unsigned, unsigned);
  if (!real) real = (void (*)(void (*)(void*), void*, unsigned, unsigned))dlsym(RTLD_NEXT, "GOMP_parallel");
  struct Call c = begin((void*)fn, data);
  const double t0 = now();
  real(timed_omp, &c, threads, flags);
  end(&c, t0);
}

// tessera::team_run_raw(void (*)(void*, int, int), void*) (tessera/thread_team.h)
void _ZN7tessera12team_run_rawEPFvPviiES0_(void (*fn)(void*, int, int), void* data) {
  static void (*real)(void (*)(void*, int, int), void*);
  if (!real) real = (void (*)(void (*)(void*, int, int), void*))dlsym(RTLD_NEXT, "_ZN7tessera12team_run_rawEPFvPviiES0_");
  struct Call c = begin((void*)fn, data);
  const double t0 = now();
  real(timed_team, &c);
  end(&c, t0);
}

__attribute__((destructor)) static void report(void) {
  FILE* out = fopen(getenv("OMP_REGIONS_REPORT"), "w");
  if (!out) return;
  double wall = 0;
  for (int s = 0; s < kSites && sites[s].fn; ++s) {
    Dl_info info;
    const int named = dladdr((void*)sites[s].fn, &info) && info.dli_fname;
    const double us = sites[s].teamed > 0 ? 1e6 / sites[s].teamed : 0;  // per call that ran as a team
    fprintf(out, "site %s 0x%lx %ld %.4f %.4f %.4f %.2f %.2f %.2f\n", named ? info.dli_fname : "?",
            named ? (unsigned long)((char*)sites[s].fn - (char*)info.dli_fbase) : 0UL, sites[s].calls, sites[s].wall,
            sites[s].busy[0], sites[s].busy[1], sites[s].fork * us, sites[s].uneven * us, sites[s].join * us);
    wall += sites[s].wall;
  }
  fprintf(out, "total %.4f %.4f %.4f\n", wall, gap_total, gap_short);
  fclose(out);
}
EOF
cc -O2 -shared -fPIC -fopenmp -o "$dir/shim.so" "$dir/shim.c" -ldl
status=0
OMP_REGIONS_REPORT="$dir/report" LD_PRELOAD="$dir/shim.so${LD_PRELOAD:+:$LD_PRELOAD}" "$@" || status=$?
grep -q "^site" "$dir/report" 2>/dev/null || { echo "omp_regions: no parallel region ran" >&2; exit "$status"; }
{
  printf '%-48s %7s %8s %8s %8s %8s %8s %8s\n' "region (enclosing function)" calls "wall s" "busy0 s" "busy1 s" \
    "fork us" "uneven us" "join us"
  while read -r kind lib offset calls wall busy0 busy1 fork uneven join; do
    if [ "$kind" = site ]; then
      # A team region's function is team_run's invoker for a lambda: named by the function around it.
      name=$(nm -C "$lib" 2>/dev/null | awk -v a="$(printf '%016x' "$offset")" '$1 == a { $1 = ""; $2 = ""; print; exit }' |
        sed -E 's/^ *//; s/^tessera::team_run<//; s/\(anonymous namespace\):://g; s/\(.*//' || true)
      printf '%-48.48s %7d %8.3f %8.3f %8.3f %8s %8s %8s\n' "${name:-$(basename "$lib")+$offset}" "$calls" "$wall" "$busy0" \
        "$busy1" "$fork" "$uneven" "$join"
    else
      # total: wall in regions, gaps between them (under 1 ms), the part of the gaps under 10 us
      python3 -c 'import sys; w, g, s = map(float, sys.argv[1:]); print(f"in regions {w:.3f} s; between regions {g:.3f} s ({100 * g / (w + g):.1f}%), {s:.3f} s of it in gaps under 10 us")' "$lib" "$offset" "$calls"
    fi
  done <"$dir/report"
} >&2
exit "$status"
