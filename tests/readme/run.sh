#!/usr/bin/env bash
# Runs the README's commands in order, as a newcomer pastes them into a shell
# on a fresh clone: every command of its ```sh blocks (lines joined at a
# trailing backslash; comment lines left out) and every "$ " line of its
# ```text blocks (transcripts), each in a fresh bash from the repository's
# root (so a command that only changes its shell, cd or export or activate,
# fails the check: the next command would not get it), each bounded in time
# (600 s, or the block's "<!-- readme-check: timeout SECS -->").
#
# Skipped, with the reason printed: blocks marked
# "<!-- readme-check: skip: REASON -->" (a second shell's session, your own
# crate), kubectl (needs a Kubernetes cluster), sbatch (needs a Slurm
# cluster), and mpirun where it is not installed.
#
# Usage: tests/readme/run.sh [--list] [--except REGEX] [README]
#   --list          print the commands and what would be skipped, run nothing
#   --except REGEX  skip the commands matching REGEX (to re-run the rest
#                   quickly, e.g. --except 'cargo test')
# Prints one PASS/FAIL/SKIP line per command and "N passed, N failed,
# N skipped"; exits 1 if any command failed.
set -uo pipefail
cd "$(dirname "$0")/../.."

LIST=0 EXCEPT="" README=README.md
while [ $# -gt 0 ]; do
    case $1 in
        --list) LIST=1 ;;
        --except) EXCEPT=$2; shift ;;
        -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) README=$1 ;;
    esac
    shift
done
[ -f "$README" ] || { echo "no $README" >&2; exit 2; }

DEFAULT_TIMEOUT=600

# One line per command: README line, time bound, skip reason (or -), command.
commands() {
    awk -v default="$DEFAULT_TIMEOUT" '
        function emit(at, text) {
            printf "%d\t%s\t%s\t%s\n", at, (timeout == "" ? default : timeout), (skip == "" ? "-" : skip), text
        }
        /^[ \t]*<!-- readme-check: / {
            directive = $0
            sub(/^[ \t]*<!-- readme-check: /, "", directive)
            sub(/ *-->[ \t]*$/, "", directive)
            if (directive ~ /^skip: /) { sub(/^skip: /, "", directive); next_skip = directive }
            else if (directive ~ /^timeout [0-9]+$/) { sub(/^timeout /, "", directive); next_timeout = directive }
            else { printf "README line %d: unknown directive %s\n", NR, directive > "/dev/stderr"; bad = 1 }
            next
        }
        /^[ \t]*```/ {
            if (!inside) {
                inside = 1
                lang = $0
                sub(/^[ \t]*```/, "", lang)
                skip = next_skip; timeout = next_timeout; next_skip = ""; next_timeout = ""
                command = ""; start = 0
            } else {
                inside = 0
            }
            next
        }
        inside && lang == "sh" {
            text = $0
            sub(/^[ \t]+/, "", text)
            if (command == "" && (text == "" || text ~ /^#/)) next
            if (start == 0) start = NR
            if (text ~ /\\$/) { sub(/\\$/, "", text); command = command text " "; next }
            emit(start, command text)
            command = ""; start = 0
            next
        }
        inside && lang == "text" {
            text = $0
            sub(/^[ \t]+/, "", text)
            if (text ~ /^\$ /) emit(NR, substr(text, 3))
        }
        END { exit bad }
    ' "$README"
}

# Each command runs in a fresh shell, as it does when pasted into a new
# terminal: one that only changes its shell's state (cd, export, source,
# activate) would leave the next command without it. Says why, or "".
shell_state() {
    case " $1" in
        " cd "* | " export "* | " . "* | " source "* | *"&& . "* | *"; . "* | *activate*)
            echo "changes only its shell's state (cd, export, source, activate), which the next command does not get: give each command what it needs (full paths, VAR=value before it)" ;;
    esac
}

# Why a command cannot run here ("" if it can).
why_skip() {
    local command=$1 words program
    read -ra words <<< "$command"
    # The program: the first word that is not a VAR=value assignment.
    for program in "${words[@]}"; do
        [[ $program == *=* ]] || break
    done
    case $program in
        kubectl) echo "needs a Kubernetes cluster (kubectl apply)" ;;
        sbatch) echo "needs a Slurm cluster (sbatch)" ;;
        mpirun) command -v mpirun > /dev/null || echo "needs mpirun (Debian: openmpi-bin)" ;;
    esac
}

PASSED=0 FAILED=0 SKIPPED=0
plan=$(commands) || exit 2
# Stopped (Ctrl-C, SIGTERM): the running command goes too (`timeout` leads
# a process group of its own).
CHILD=
trap '[ -n "$CHILD" ] && kill -TERM -- "-$CHILD" 2> /dev/null; exit 130' INT TERM
while IFS=$'\t' read -r at limit skip command; do
    [ "$skip" = - ] && skip=$(why_skip "$command")
    if [ -z "$skip" ] && [ -n "$EXCEPT" ] && [[ $command =~ $EXCEPT ]]; then
        skip="--except $EXCEPT"
    fi
    if [ -n "$skip" ]; then
        echo "SKIP README line $at: $command ($skip)"
        SKIPPED=$((SKIPPED + 1))
        continue
    fi
    state=$(shell_state "$command")
    if [ -n "$state" ]; then
        echo "FAIL README line $at: $command: $state"
        FAILED=$((FAILED + 1))
        continue
    fi
    if [ "$LIST" -eq 1 ]; then
        echo "RUN  README line $at (up to $limit s): $command"
        continue
    fi
    echo "==== README line $at (up to $limit s): $command"
    started=$(date +%s)
    rc=0
    timeout -k 10 "$limit" bash -c "$command" < /dev/null &
    CHILD=$!
    wait "$CHILD" || rc=$?
    CHILD=
    took=$(($(date +%s) - started))
    if [ "$rc" -eq 0 ]; then
        echo "PASS README line $at (${took} s): $command"
        PASSED=$((PASSED + 1))
    elif [ "$rc" -eq 124 ]; then
        echo "FAIL README line $at: did not finish within $limit s: $command"
        FAILED=$((FAILED + 1))
    else
        echo "FAIL README line $at: exit $rc after ${took} s: $command"
        FAILED=$((FAILED + 1))
    fi
done <<< "$plan"

[ "$LIST" -eq 1 ] && [ "$FAILED" -eq 0 ] && exit 0
line="$PASSED passed, $FAILED failed"
[ "$SKIPPED" -gt 0 ] && line+=", $SKIPPED skipped"
echo "$line"
[ "$FAILED" -eq 0 ]
