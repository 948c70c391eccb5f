#!/usr/bin/env bash
# `phase.sh NAME COMMAND...`: print the command, run it, then `== NAME: N s` (its wall time),
# and exit with its status. `make test` and .ci/run time their phases with it.
name=$1
shift
echo "$*"
start=$SECONDS
"$@"
status=$?
echo "== $name: $((SECONDS - start)) s (exit $status, load $(cut -d' ' -f1 /proc/loadavg))"
exit $status
