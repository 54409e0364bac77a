#!/bin/sh
# The whole suite as CI runs it (`docker compose run --rm test`), in two phases:
#   1. the pure tests spread over the machine's cores (pytest-xdist): half the wall time on 2 cores;
#   2. the emulation tests one at a time: each needs the cores to itself, since the emulator's headroom
#      verdict measures what the machine carries (another test beside it would make it "overloaded").
# Both phases always run; the exit status is the first failing phase's (5, "no tests collected", counts
# as a failure: a filter that selects nothing is not a pass).  Extra arguments go to both pytest runs.
set -u
workers="${FABRICLAB_TEST_WORKERS:-$(nproc)}"
python -m pytest -q -m "not emulation" -n "$workers" "$@"
pure=$?
python -m pytest -q -m emulation "$@"
emulated=$?
echo "suite: pure tests exit $pure, emulation tests exit $emulated"
if [ "$pure" -ne 0 ]; then exit "$pure"; fi
exit "$emulated"
