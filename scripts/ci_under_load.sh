#!/usr/bin/env bash
# Runs CI (`.ci/run`), or the command given after `--`, with a stated extra CPU load beside it:
# BUSY processes that spin at nice level NICE, started before the command and ended after it
# (on failure and Ctrl-C too; each also ends by itself once this script is gone). CI machines
# are shared: a suite that passes only on a quiet machine fails there.
#
#   scripts/ci_under_load.sh                        # .ci/run beside one spinning process a core
#   scripts/ci_under_load.sh --busy 2 --nice 0 -- python -m pytest tests/integration/launch
#
# Prints the load it used (processes, nice level, the cores they took on average) and exits
# with the command's own code.
set -euo pipefail
cd "$(dirname "$0")/.."

busy="$(nproc)"
nice_level=0
while [ $# -gt 0 ]; do
    case "$1" in
        --busy) busy="$2"; shift 2 ;;
        --nice) nice_level="$2"; shift 2 ;;
        --) shift; break ;;
        *) echo "usage: $0 [--busy N] [--nice LEVEL] [-- command ...]" >&2; exit 2 ;;
    esac
done
if [ $# -eq 0 ]; then
    set -- bash .ci/run
fi
case "$busy" in ''|*[!0-9]*) echo "--busy takes a number of processes, not '$busy'" >&2; exit 2 ;; esac

hogs=()
started=$(date +%s.%N)

cpu_ticks() {  # user + system time of the spinning processes so far, in clock ticks
    local total=0 pid fields stat
    for pid in "${hogs[@]+"${hogs[@]}"}"; do
        if fields=$(cut -d')' -f2 "/proc/$pid/stat" 2>/dev/null); then
            read -r -a stat <<<"$fields"
            total=$((total + stat[11] + stat[12]))  # utime and stime: fields 14 and 15
        fi
    done
    echo "$total"
}

end_load() {
    local code=$? ticks
    trap - EXIT
    ticks=$(cpu_ticks)
    for pid in "${hogs[@]+"${hogs[@]}"}"; do
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    awk -v n="$busy" -v level="$nice_level" -v ticks="$ticks" -v hz="$(getconf CLK_TCK)" \
        -v started="$started" -v now="$(date +%s.%N)" -v code="$code" 'BEGIN {
            elapsed = now - started
            printf "ci_under_load: %d spinning process(es) at nice %s took %.2f cores on average over %.0f s; the command exited with %d\n", n, level, ticks / hz / elapsed, elapsed, code
        }'
    exit "$code"
}
# the command runs in the foreground (Ctrl-C reaches it); the spinners end with this script
trap end_load EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

for _ in $(seq 1 "$busy"); do
    # spins while this script lives: even a SIGKILLed script leaves no spinner behind
    nice -n "$nice_level" sh -c 'while kill -0 "$1" 2>/dev/null; do :; done' spin $$ &
    hogs+=($!)
done
# a spinner is this shell's fork, then `nice`, then `sh`: on a busy machine a nice 19 one may
# not have been scheduled yet, so the command waits until every one runs `sh` (10 s at most)
for pid in "${hogs[@]+"${hogs[@]}"}"; do
    for _ in $(seq 1 200); do
        tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "^sh -c .* spin " && break
        sleep 0.05
    done
done
echo "ci_under_load: $busy spinning process(es) at nice $nice_level (this shell at nice $(nice)," \
    "$(nproc) cores) beside: $*"
"$@"
