#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds hetmesh's libFuzzer targets (fuzz/, clang 14 with address and undefined-behaviour sanitizers)
# and runs each for a bounded time over its committed seed corpus. CI calls it; a finding fails it.
#   scripts/fuzz.sh [seconds per target, default 20] [target ...]
# FUZZ_FLAGS: extra libFuzzer flags (a run outside CI: FUZZ_FLAGS=-runs=1000000 with a large time).
# Environment: BUILD_DIR (default build/fuzz), CXX_FUZZ (default clang++-14 or clang++), JOBS (build jobs, and
# how many targets run at once; default 1),
# TMPDIR (scratch files of the file-reading targets; default /dev/shm where writable),
# FUZZ_WORK (where new corpus entries and crash reproducers go; default $BUILD_DIR/work).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-20}"
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(checkpoint mixture_json wds_tar indexed_idx pipeline_csv args plan_args json_bounded files)
build="${BUILD_DIR:-build/fuzz}"
cxx="${CXX_FUZZ:-$(command -v clang++-14 || command -v clang++)}"
work="${FUZZ_WORK:-$build/work}"
# The tar and .idx targets feed their readers through a file: on tmpfs that costs microseconds, on a
# disk it bounds them at a few hundred executions per second.
if [ -z "${TMPDIR:-}" ] && [ -d /dev/shm ] && [ -w /dev/shm ]; then export TMPDIR=/dev/shm; fi

cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER="$cxx" \
  -DHETMESH_BUILD_FUZZ=ON -DHETMESH_BUILD_TESTS=OFF -DHETMESH_BUILD_EXAMPLES=OFF -DHETMESH_BUILD_BENCH=OFF \
  -DHETMESH_BUILD_TOOLS=OFF -DHETMESH_INSTALL=OFF -DHETMESH_WITH_NCCL=OFF -DHETMESH_WERROR=ON > "$build.configure.log" \
  || { cat "$build.configure.log"; exit 1; }
ninja -C "$build" -j "${JOBS:-1}" "${targets[@]/#/fuzz_}"

# The targets run JOBS at a time (each on one core, for the same number of seconds as alone); the report
# below lists them in order once all have finished.
fuzz_one() {
  local t="$1"
  mkdir -p "$work/$t/corpus" "$work/$t/artifacts"
  # A target may come with a libFuzzer dictionary (fuzz/$t.dict) of tokens that reach deep inputs quickly.
  local dict=()
  [ -f "fuzz/$t.dict" ] && dict=(-dict="fuzz/$t.dict")
  # New inputs go to the work folder; the committed seeds (fuzz/corpus/$t) are read, never written.
  # shellcheck disable=SC2086 # FUZZ_FLAGS is a list of flags
  if "$build/fuzz/fuzz_$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
       -print_final_stats=1 "${dict[@]}" ${FUZZ_FLAGS:-} -artifact_prefix="$work/$t/artifacts/" \
       "$work/$t/corpus" "fuzz/corpus/$t" 2> "$work/$t/log"; then
    echo 0 > "$work/$t/status"
  else
    echo 1 > "$work/$t/status"
  fi
}
parallel="${JOBS:-1}"
running=0
for t in "${targets[@]}"; do
  rm -f "$work/$t/status"
  echo "== fuzz_$t: ${seconds}s"
  fuzz_one "$t" &
  running=$((running + 1))
  if [ "$running" -ge "$parallel" ]; then
    wait -n || true
    running=$((running - 1))
  fi
done
wait

status=0
for t in "${targets[@]}"; do
  echo "== fuzz_$t"
  if [ "$(cat "$work/$t/status" 2> /dev/null)" != 0 ]; then
    status=1
    echo "fuzz_$t: FOUND A FAILURE (reproducers in $work/$t/artifacts)"
    tail -n 40 "$work/$t/log"
  fi
  grep -E "stat::number_of_executed_units|stat::average_exec_per_sec|stat::peak_rss_mb" "$work/$t/log" || true
done
exit $status
