#!/usr/bin/env bash
# The structure issue 31 asks for, checked (run by .ci/run; needs only
# python3 and grep, no build):
# - core.rs and van.rs at most 600 lines, and no product file over 700 (issue 42)
#   (tests do not count: tests.rs, *_tests.rs, tests/ folders, and what
#   follows an inline `#[cfg(test)] mod tests {`);
# - no clock read (Instant::now, SystemTime::now) in the socket-free crate
#   van/core/src outside its tests and the harness's origin of virtual time;
# - no two modules of van/src or of van/core/src import each other,
#   directly or round a loop (imports.py prints the edges);
# - no environment read (env::var, var_os, vars) outside the settings table,
#   postoffice/src/settings.rs, in product code (tests and examples may);
# - KVWorker::send, which runs a request's stages
#   (apps/src/kv_worker/stages.rs), at most 80 lines (issue 42);
# - the apps use only the Van's and the Postoffice's public API (issue 42):
#   apps/Cargo.toml has no pslite-van in [dependencies] (dev-dependencies
#   may: the raw ZeroMQ bench), and no file of apps/src names `pslite_van`
#   outside a string literal or a comment (a log target such as
#   "pslite_van::van" is a string): what the apps need of the driver is
#   re-exported by pslite_postoffice (postoffice/src/lib.rs).
# - the core's components (Scheduler, NodeTable, Liveness, Barriers,
#   replica, resender, effects, Core, Output...) are not re-exported by
#   van/src/lib.rs (issue 42).
# - one style of component in the core (issue 42): no product code of
#   van/core/src (tests, the harness and inline test modules aside) declares
#   a fn returning `Vec<Effect>` or a `fn take_output`: components emit
#   into the `Effects` (or `Cx`) passed in. Three exceptions, none a
#   component: `Core::take_output` (van/core/src/core.rs) and
#   `Admin::take_output` (van/core/src/admin.rs, the admin client's
#   machine), each a whole machine's interface to its driver (what
#   raft-rs's `ready()` is to its application), and `Effects::take`
#   (van/core/src/effects.rs), the sink itself, which the core drains.
set -euo pipefail
cd "$(dirname "$0")/../.."
fail=0

product_lines() { # a file's lines before its inline test module
    awk '/^#\[cfg\(test\)\]$/ { t = NR; next } t == NR - 1 && /^mod [a-z_]+ \{$/ { exit } { n = NR } END { print n + 0 }' "$1"
}

for f in van/core/src/core.rs van/src/van.rs; do
    n=$(product_lines "$f")
    echo "$f: $n lines (limit 600)"
    [ "$n" -le 600 ] || { echo "FAIL: $f is over 600 lines"; fail=1; }
done

over=0
while IFS= read -r f; do
    case "$f" in
    */tests.rs | *_tests.rs | tests/* | */tests/* | target/*) continue ;;
    esac
    n=$(product_lines "$f")
    if [ "$n" -gt 700 ]; then
        echo "FAIL: $f has $n product lines (limit 700)"
        fail=1
        over=1
    fi
done < <(git ls-files '*.rs')
largest=$(git ls-files '*.rs' | grep -Ev '(^|/)tests(/|\.rs$)|_tests\.rs$' | while read -r f; do
    echo "$(product_lines "$f") $f"
done | sort -n | tail -1)
[ "$over" = 1 ] || echo "no product file over 700 lines (largest: $largest)"

clocks=$(grep -rnE 'Instant::now|SystemTime::now' van/core/src --include='*.rs' \
    | grep -Ev '^van/core/src/(harness\.rs|harness/)|/tests\.rs:|_tests\.rs:|^van/core/src/lib\.rs:[0-9]+:\s*//' || true)
# Inline test modules: keep only hits before the file's `#[cfg(test)] mod`.
bad=""
while IFS= read -r hit; do
    [ -n "$hit" ] || continue
    file=${hit%%:*}
    rest=${hit#*:}
    line=${rest%%:*}
    if [ "$line" -le "$(product_lines "$file")" ]; then bad+="$hit"$'\n'; fi
done <<< "$clocks"
if [ -n "$bad" ]; then
    echo "FAIL: clock reads in the socket-free crate (take now as an argument):"
    printf '%s' "$bad"
    fail=1
else
    echo "no Instant::now/SystemTime::now in van/core/src product code"
fi

styles=$(grep -rnE --include='*.rs' -e '->[[:space:]]*Vec<Effect>|fn take_output\b' van/core/src \
    | grep -Ev '^van/core/src/(harness\.rs|harness/)|/tests\.rs:|_tests\.rs:|^[^:]*:[0-9]+:[[:space:]]*//' \
    | grep -Ev '^van/core/src/core\.rs:[0-9]+:[[:space:]]*pub fn take_output\(&mut self\) -> Vec<Output>' \
    | grep -Ev '^van/core/src/admin\.rs:[0-9]+:[[:space:]]*pub fn take_output\(&mut self\) -> Vec<Message>' \
    | grep -Ev '^van/core/src/effects\.rs:[0-9]+:[[:space:]]*pub fn take\(&mut self\) -> Vec<Effect>' || true)
bad=""
while IFS= read -r hit; do
    [ -n "$hit" ] || continue
    file=${hit%%:*}
    rest=${hit#*:}
    line=${rest%%:*}
    if [ "$line" -le "$(product_lines "$file")" ]; then bad+="$hit"$'\n'; fi
done <<< "$styles"
if [ -n "$bad" ]; then
    echo "FAIL: a component of the core returns Vec<Effect> or keeps output for a take_output (emit into the Effects passed in):"
    printf '%s' "$bad"
    fail=1
else
    echo "no inherent Vec<Effect> APIs or take_output in the core (but Core's and Admin's take_output, their drivers')"
fi

envs=$(git ls-files '*.rs' \
    | grep -Ev '(^|/)(tests|examples|benches)/|(^|/)tests\.rs$|_tests\.rs$|^postoffice/src/settings\.rs$' \
    | xargs grep -nE 'env::var(_os)?\(|env::vars(_os)?\(' || true)
bad=""
while IFS= read -r hit; do
    [ -n "$hit" ] || continue
    file=${hit%%:*}
    rest=${hit#*:}
    line=${rest%%:*}
    if [ "$line" -le "$(product_lines "$file")" ]; then bad+="$hit"$'\n'; fi
done <<< "$envs"
if [ -n "$bad" ]; then
    echo "FAIL: environment reads outside postoffice/src/settings.rs (declare the variable there):"
    printf '%s' "$bad"
    fail=1
else
    echo "no environment read outside the settings table (postoffice/src/settings.rs)"
fi

for src in van/core/src van/src; do
    if out=$(python3 tests/structure/imports.py "$src"); then
        echo "$out" | tail -1
    else
        echo "$out"
        fail=1
    fi
done

send=$(awk '/^    fn send\(/ { f = 1 } f { n++ } f && /^    }$/ { print n; exit }' apps/src/kv_worker.rs)
echo "KVWorker::send: ${send:-0} lines (limit 80)"
if [ -z "$send" ] || [ "$send" -gt 80 ]; then
    echo "FAIL: KVWorker::send (apps/src/kv_worker.rs) is missing or over 80 lines: put the work in a stage"
    fail=1
fi

van_dep=$(awk '/^\[/ { d = ($0 == "[dependencies]") } d && /^pslite-van[ .=]/' apps/Cargo.toml)
van_uses=$(grep -rn 'pslite_van' apps/src --include='*.rs' \
    | awk '{ line = $0; sub(/^[^:]*:[0-9]+:/, "", line); gsub(/"([^"\\]|\\.)*"/, "", line);
             sub(/\/\/.*/, "", line); if (line ~ /pslite_van/) print }' || true)
if [ -n "$van_dep" ] || [ -n "$van_uses" ]; then
    echo "FAIL: the apps reach the Van directly (use what pslite_postoffice re-exports):"
    [ -z "$van_dep" ] || echo "apps/Cargo.toml [dependencies]: $van_dep"
    [ -z "$van_uses" ] || echo "$van_uses"
    fail=1
else
    echo "apps/src names no pslite_van (the Van through pslite_postoffice only)"
fi

# The core's components stay inside the driver (issue 42): van/src/lib.rs
# re-exports none of them publicly (a `pub(crate) use` for the driver's own
# modules is fine).
components=$(python3 - <<'PY'
import re
src = open("van/src/lib.rs").read()
names = set()
for m in re.finditer(r"^pub use pslite_van_core::(\{[^}]*\}|[^;]+);", src, re.M):
    names |= {n.strip().split("::")[0] for n in m.group(1).strip("{}").split(",") if n.strip()}
bad = names & {"scheduler", "replica", "resender", "effects", "carry", "component", "member",
               "checkpoint", "Core", "NodeTable", "Liveness", "Barriers", "Scheduler",
               "SchedulerConfig", "Resender", "ReplicaServer", "Output", "Route"}
print(" ".join(sorted(bad)))
PY
)
if [ -n "$components" ]; then
    echo "FAIL: van/src/lib.rs re-exports the core's components or outputs: $components"
    fail=1
else
    echo "van/src/lib.rs re-exports none of the core's components"
fi

exit "$fail"
