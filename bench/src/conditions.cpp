// The conditions block: what machine and build produced the figures.
#include <omp.h>
#include <sched.h>

#include <chrono>
#include <ctime>
#include <thread>

#include "tessera/bench/bench.h"
#include "tessera/machine_probe.h"
#include "tessera_build_info.h"

namespace tessera::bench {

nlohmann::json machine_conditions(double probe_seconds) {
  cpu_set_t set;
  CPU_ZERO(&set);
  const int usable = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
  const ProbeResult bw = measure_read_bandwidth(probe_seconds);
  const ProbeResult fma = measure_fma_peak(probe_seconds);
  const ProbeResult trip = measure_core_round_trip();
  const std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return {{"cpu", {{"model", cpu_model_name()}, {"cores", std::thread::hardware_concurrency()}, {"usable_cores", usable}}},
          {"memory_bytes", total_memory_bytes()},
          {"build_type", TESSERA_BUILD_TYPE},
          {"git_commit", TESSERA_GIT_COMMIT},
          {"version", TESSERA_VERSION},
          {"compiler", __VERSION__},
          {"date", date},
          {"machine",
           {{"read_bandwidth_gbs", bw.value},
            {"read_bandwidth_method", bw.method},
            {"fma_peak_gflops", fma.value},
            {"fma_peak_method", fma.method},
            {"core_round_trip_ns", trip.value},
            {"core_round_trip_method", trip.method},
            {"probe_threads", omp_get_max_threads()},
            {"probe_seconds", bw.seconds + fma.seconds + trip.seconds}}}};
}

}  // namespace tessera::bench
