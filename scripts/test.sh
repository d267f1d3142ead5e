#!/usr/bin/env bash
# Checks the size limits of include/ (scripts/check_size.py), then builds hetmesh and runs its tests: the
# default build (Release, -Werror; unit, multi-rank on loopback and under mpirun, examples, package
# consumers: build tree, install tree, an install of a tree that was only configured consumed with no
# components and with all, add_subdirectory; heavy sweeps; GPU tests skip without a device), the API
# reference (doxygen, warnings as errors), the fuzz targets, then the ThreadSanitizer tests (label tsan)
# and the ASan+UBSan build.
# Compiles through ccache where it is installed.
# Prints the wall and CPU seconds of each stage as it ends and a table of all of them at the end (also
# when a stage fails), and writes them to build/ci-times.json (CPU: user + sys of the stage's commands
# and their children, from bash's `times`).
# Usage: bash scripts/test.sh [--no-sanitize]
set -euo pipefail
cd "$(dirname "$0")/.."

# --- stage timing -------------------------------------------------------------------------------------
stage_names=()
stage_walls=()
stage_cpus=()
stage_current=""
run_start=$(date +%s.%N)
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
# Children's user + sys CPU seconds so far (second line of `times`: "0m1.234s 0m0.567s").
# `times` runs in this shell (in a $(...) subshell it would count only the subshell's children): it writes
# to a file, children_cpu prints the file's second line summed; callers run `times > "$times_file"` first.
times_file=$(mktemp)
children_cpu() {
  tail -n 1 "$times_file" | awk '{ s = 0; for (i = 1; i <= 2; ++i) { split($i, a, /[ms]/); s += a[1] * 60 + a[2] } printf "%.1f", s }'
}
stage_end() {
  [ -n "$stage_current" ] || return 0
  local wall cpu
  times > "$times_file"
  wall=$(awk -v a="$stage_t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  cpu=$(awk -v a="$stage_c0" -v b="$(children_cpu)" 'BEGIN { printf "%.1f", b - a }')
  stage_names+=("$stage_current")
  stage_walls+=("$wall")
  stage_cpus+=("$cpu")
  echo "== stage $stage_current: ${wall} s wall, ${cpu} s CPU (load $(cut -d' ' -f1-3 /proc/loadavg))"
  stage_current=""
}
stage() {
  stage_end
  stage_current="$1"
  stage_t0=$(date +%s.%N)
  times > "$times_file"
  stage_c0=$(children_cpu)
  echo "== $1${2:+ ($2)} =="
}
stage_summary() {
  local status=$? total i json="build/ci-times.json" failed=""
  [ "$status" = 0 ] || failed="$stage_current"
  stage_end
  times > "$times_file"
  total=$(awk -v a="$run_start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  echo
  echo "== CI times ($(nproc) cores; load at start $load_start, at end $(cut -d' ' -f1-3 /proc/loadavg))"
  printf '%-26s %10s %10s\n' stage "wall s" "CPU s"
  for i in "${!stage_names[@]}"; do
    printf '%-26s %10s %10s\n' "${stage_names[$i]}" "${stage_walls[$i]}" "${stage_cpus[$i]}"
  done
  printf '%-26s %10s %10s\n' total "$total" "$(children_cpu)"
  [ -z "$failed" ] || echo "(stage '$failed' failed, exit status $status)"
  mkdir -p build
  {
    printf '{\n  "nproc": %s,\n  "loadavg_start": "%s",\n  "loadavg_end": "%s",\n' \
      "$(nproc)" "$load_start" "$(cut -d' ' -f1-3 /proc/loadavg)"
    printf '  "exit_status": %s,\n  "total_wall_s": %s,\n  "total_cpu_s": %s,\n  "stages": [' \
      "$status" "$total" "$(children_cpu)"
    for i in "${!stage_names[@]}"; do
      [ "$i" = 0 ] || printf ','
      printf '\n    {"name": "%s", "wall_s": %s, "cpu_s": %s}' "${stage_names[$i]}" "${stage_walls[$i]}" "${stage_cpus[$i]}"
    done
    printf '\n  ]\n}\n'
  } > "$json"
  echo "(written to $json)"
  rm -f "$times_file"
  exit "$status"
}
trap stage_summary EXIT
# -------------------------------------------------------------------------------------------------------

stage setup
bash scripts/setup.sh

# No header over 500 lines, no function over 120 (design.md: files stay short); no build needed.
stage "size check" "include/: files <= 500 lines, functions <= 120 lines"
python3 scripts/check_size.py

jobs=$(nproc)
# ccache keys on paths relative to the checkout, so a fresh clone in another folder (CI) reuses what a
# build of the same sources elsewhere on this machine compiled; the Debug (ASan) flags' -g would
# otherwise hash the build directory too.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}"
export CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-true}"
[ -x /usr/local/cuda/bin/nvcc ] && export PATH="/usr/local/cuda/bin:$PATH"

stage "default build" "Release: configure and build"
cmake --preset default
cmake --build --preset default -j "$jobs"
stage "default ctest"
ctest --preset default -j "$jobs"

stage docs "API reference (doxygen; a warning, e.g. an undocumented public name, fails)"
cmake --build --preset default --target docs

# libFuzzer targets (fuzz/, clang only): each parser of untrusted input for a bounded time; a finding fails.
fuzz_seconds="${HETMESH_FUZZ_SECONDS:-20}"
if [ "$fuzz_seconds" != 0 ] && { command -v clang++-14 || command -v clang++; } > /dev/null; then
  stage fuzz "libFuzzer + ASan + UBSan, ${fuzz_seconds}s per target"
  JOBS="$jobs" bash scripts/fuzz.sh "$fuzz_seconds"
fi

if [ "${1:-}" != "--no-sanitize" ]; then
  # ThreadSanitizer on the threaded tests only (label tsan: loopback comm, data loaders and service,
  # training system): just their three binaries are built, at -O1.
  stage tsan "ThreadSanitizer: build and run the tests labelled tsan"
  cmake --preset tsan
  cmake --build --preset tsan -j "$jobs" --target test_comm test_data test_train
  ctest --preset tsan -j "$jobs"

  # ASan + UBSan on every test and example source once: the heavy binaries (tests/heavy: the same planner
  # sources again at assertion level 3, over a third compiled part) run in the default build only, and
  # the torch component is off (libtorch is not instrumented).
  stage asan "ASan + UBSan: build and test"
  cmake --preset asan
  cmake --build --preset asan -j "$jobs"
  ctest --preset asan -j "$jobs"
fi
stage_end
