#!/usr/bin/env bash
# Multi-host tests: real clusters spread over network namespaces, each its own
# "machine" with its own address, joined by veth pairs on a bridge that lives
# in a namespace of its own. Every address is a private test address
# (10.99.N.0/24, fd00:99:N::/64, decoy 10.98.N.0/24) that exists only inside
# these namespaces; nothing is sent anywhere else (the engine cases run on
# 127.0.0.1).
#
# Usage: tests/multihost/run.sh [CASE...]   (default: every case)
# Needs root (ip netns) and the release binaries (built here if missing).
# Prints one PASS/FAIL/SKIP line per case and "N passed, N failed, N skipped";
# exits 1 if any case failed. Everything it creates is removed on exit, even
# on failure or Ctrl-C.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BIN=$ROOT/target/release
PSLITE=$BIN/pslite
KV_APP=$BIN/examples/kv_app
KV_RECOVERY=$BIN/examples/kv_recovery

CASES_ALL=(kv_app interface bind_any host_names ipv6 unreachable auth netem link_cut
           slurm_sim kubernetes_sim mpirun slurm cpp_refused kubernetes_manifests)
CASES=("${@:-${CASES_ALL[@]}}")

PASSED=0 FAILED=0 SKIPPED=0
pass() { echo "PASS $1${2:+ ($2)}"; PASSED=$((PASSED + 1)); }
fail() { echo "FAIL $1: $2"; FAILED=$((FAILED + 1)); }
skip() { echo "SKIP $1: $2"; SKIPPED=$((SKIPPED + 1)); }
summary() {
    local line="$PASSED passed, $FAILED failed"
    [ "$SKIPPED" -gt 0 ] && line+=", $SKIPPED skipped"
    echo "$line"
}

# Names unique to this run (interface names stay under 16 characters).
TAG=pmh$$
N=$(($$ % 250 + 1))
NET=10.99.$N
NET6=fd00:99:$N:
DECOY=10.98.$N
SW=${TAG}sw
NODES=6 # ns 0: scheduler, 1-2: servers, 3-4: workers, 5: spare
ns() { echo "${TAG}n$1"; }
LOGS=$(mktemp -d /tmp/pslite-multihost.XXXXXX)
PIDS=()

# Kills every process still running in our namespaces (a case's nodes that
# it stopped waiting for), so the next case finds its ports free.
reap() {
    local i
    for i in $(seq 0 $((NODES - 1))); do
        ip netns pids "$(ns "$i")" 2>/dev/null | xargs -r kill -KILL 2>/dev/null
    done
}

SLURM_DIR=
stop_slurm() {
    [ -n "$SLURM_DIR" ] || return 0
    local f
    for f in "$SLURM_DIR"/slurmd.pid "$SLURM_DIR"/slurmctld.pid; do
        [ -f "$f" ] && kill -TERM "$(cat "$f")" 2>/dev/null
    done
    rm -rf "$SLURM_DIR"
    SLURM_DIR=
}

cleanup() {
    local pid
    stop_slurm
    reap
    for pid in "${PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null; done
    wait 2>/dev/null
    for i in $(seq 0 $((NODES - 1))); do
        ip netns del "$(ns "$i")" 2>/dev/null
        rm -rf "/etc/netns/$(ns "$i")"
    done
    ip netns del "$SW" 2>/dev/null
    if [ "$FAILED" -eq 0 ] && [ -z "${KEEP_LOGS:-}" ]; then rm -rf "$LOGS"; else echo "logs: $LOGS"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ ! -x "$PSLITE" ] || [ ! -x "$KV_APP" ] || [ ! -x "$KV_RECOVERY" ]; then
    cargo build --release -p pslite -p pslite-cli --bins --examples >&2 || {
        fail build "cargo build failed"; summary; exit 1; }
fi

HAVE_NETNS=1
if [ "$(id -u)" != 0 ]; then
    HAVE_NETNS=0 WHY="needs root (ip netns)"
elif ! ip netns add "$SW" 2>/dev/null; then
    HAVE_NETNS=0 WHY="cannot create network namespaces here"
fi

# The test network: a bridge in namespace $SW; namespace i has net0 at
# $NET.(10+i), $NET.(110+i) and ${NET6}:(10+i), a host name node<i> (and
# pslite-<i>.pslite, the Kubernetes pod name) in its hosts file; namespace 1
# also has a decoy interface eth0 ($DECOY.11) that no other namespace reaches.
setup_network() {
    ip -n "$SW" link add br0 type bridge || return 1
    ip -n "$SW" link set br0 up || return 1
    local hosts=$LOGS/hosts i n
    {
        echo "127.0.0.1 localhost"
        for i in $(seq 0 $((NODES - 1))); do
            echo "$NET.$((10 + i)) node$i pslite-$i.pslite"
        done
    } > "$hosts"
    for i in $(seq 0 $((NODES - 1))); do
        n=$(ns "$i")
        ip netns add "$n" || return 1
        mkdir -p "/etc/netns/$n" && cp "$hosts" "/etc/netns/$n/hosts"
        ip link add "${TAG}v$i" netns "$SW" type veth peer name net0 netns "$n" || return 1
        ip -n "$SW" link set "${TAG}v$i" master br0 up || return 1
        ip -n "$n" link set lo up
        ip -n "$n" addr add "$NET.$((10 + i))/24" dev net0
        ip -n "$n" addr add "$NET.$((110 + i))/24" dev net0
        ip -n "$n" addr add "${NET6}:$((10 + i))/64" dev net0 nodad
        ip -n "$n" link set net0 up || return 1
    done
    # The decoy: a second interface in namespace 1, on a subnet nobody routes.
    ip -n "$(ns 1)" link add eth0 type veth peer name eth0peer || return 1
    ip -n "$(ns 1)" addr add "$DECOY.11/24" dev eth0
    ip -n "$(ns 1)" link set eth0 up && ip -n "$(ns 1)" link set eth0peer up
}

# Starts PROGRAM in namespace NS with only the given variables (plus PATH),
# bounded by LIMIT seconds; output to $LOGS/NAME.log. Sets LAST to its pid.
# usage: start NAME NS LIMIT [VAR=VALUE...] -- PROGRAM [ARGS...]
start() {
    local name=$1 n=$2 limit=$3 vars=()
    shift 3
    while [ "$1" != -- ]; do vars+=("$1"); shift; done
    shift
    # In a subshell: a node killed by reap ends quietly (no job notice).
    (timeout -k 2 "$limit" ip netns exec "$n" env -i PATH="$PATH" "${vars[@]}" "$@" \
        > "$LOGS/$name.log" 2>&1; exit $?) 2> /dev/null &
    LAST=$!
    PIDS+=("$LAST")
}

# Waits for the given pids; returns how many failed.
wait_all() {
    local bad=0 pid
    for pid in "$@"; do wait "$pid" || bad=$((bad + 1)); done
    return "$bad"
}

# Waits up to SECS for a line matching PATTERN in LOG.
wait_line() {
    local log=$1 pattern=$2 secs=$3 end=$((SECONDS + $3))
    while [ $SECONDS -lt $end ]; do
        grep -q -- "$pattern" "$log" 2>/dev/null && return 0
        sleep 0.2
    done
    return 1
}

# A kv_app cluster: scheduler in ns 0, servers in 1-2, workers in 3-4.
# usage: kv_cluster CASE ROOT_URI HOST_KIND [VAR=VALUE...]
# HOST_KIND: ip (DMLC_NODE_HOST=$NET.1x), alias ($NET.11x), name (node<i>),
# v6 (${NET6}:1x), iface (DMLC_INTERFACE=net0), none (nothing).
kv_cluster() {
    local case=$1 uri=$2 kind=$3 pids=() i role host
    shift 3
    for i in 0 1 2 3 4; do
        case $i in 0) role=scheduler ;; 1 | 2) role=server ;; *) role=worker ;; esac
        case $kind in
            ip) host=(DMLC_NODE_HOST="$NET.$((10 + i))") ;;
            alias) host=(DMLC_NODE_HOST="$NET.$((110 + i))") ;;
            name) host=(DMLC_NODE_HOST="node$i") ;;
            v6) host=(DMLC_NODE_HOST="${NET6}:$((10 + i))") ;;
            iface) host=(DMLC_INTERFACE=net0) ;;
            *) host=() ;;
        esac
        start "$case.$role$i" "$(ns "$i")" 90 DMLC_ROLE=$role DMLC_NUM_SERVER=2 DMLC_NUM_WORKER=2 \
            DMLC_PS_ROOT_URI="$uri" DMLC_PS_ROOT_PORT=9091 PS_START_TIMEOUT=60 \
            KV_APP_REPEAT="${REPEAT:-10}" "${host[@]}" "$@" -- "$KV_APP"
        pids+=("$LAST")
    done
    local bad=0
    wait_all "${pids[@]}" || bad=$?
    local exact
    exact=$(cat "$LOGS/$case".worker*.log | grep -c "sums exact")
    if [ "$bad" -eq 0 ] && [ "$exact" -eq 2 ]; then
        return 0
    fi
    DETAIL="$bad node(s) failed, $exact of 2 workers exact; $(grep -h -m1 -i "error" "$LOGS/$case".*.log | head -1)"
    return 1
}

case_kv_app() {
    kv_cluster kv_app "$NET.10" ip && pass kv_app "5 namespaces, sums exact" || fail kv_app "$DETAIL"
}

case_interface() {
    # Namespace 1 also has eth0 (the decoy, the name pslite guesses first
    # without DMLC_INTERFACE): DMLC_INTERFACE=net0 must win.
    if ! kv_cluster interface "$NET.10" iface PS_VERBOSE=1; then
        fail interface "$DETAIL"
    elif grep -q "shares this host" "$LOGS"/interface.*.log; then
        # Namespaces stand for machines: no shared memory between them.
        fail interface "nodes in separate namespaces took each other for same-host peers"
    elif grep -q "listening on $NET.11:" "$LOGS/interface.server1.log"; then
        pass interface "DMLC_INTERFACE=net0 advertised $NET.11, not eth0's $DECOY.11"
    else
        fail interface "server 1 did not listen on $NET.11: $(grep -m1 listening "$LOGS/interface.server1.log")"
    fi
}

case_bind_any() {
    kv_cluster bind_any "$NET.10" alias PS_BIND_HOST=0.0.0.0 \
        && pass bind_any "bound 0.0.0.0, advertised $NET.11x" || fail bind_any "$DETAIL"
}

case_host_names() {
    kv_cluster host_names node0 name && pass host_names "node0..node4 from each namespace's hosts file" \
        || fail host_names "$DETAIL"
}

case_ipv6() {
    kv_cluster ipv6 "${NET6}:10" v6 && pass ipv6 "${NET6}:10..14" || fail ipv6 "$DETAIL"
}

# Latency and loss on every link with PS_RESEND=1. tc netem gives 1 ms
# delay and 1% loss; a kernel without netem gets 1% loss from nftables
# (numgen random) and no delay, and the PASS line says so.
case_netem() {
    local i how
    if ip netns exec "$(ns 0)" tc qdisc add dev net0 root netem delay 1ms loss 1% 2>/dev/null; then
        ip netns exec "$(ns 0)" tc qdisc del dev net0 root
        how="tc netem: 1 ms delay, 1% loss"
        for i in 0 1 2 3 4; do
            ip netns exec "$(ns "$i")" tc qdisc add dev net0 root netem delay 1ms loss 1%
        done
    elif command -v nft > /dev/null \
        && ip netns exec "$(ns 0)" nft add table inet pslite_loss 2>/dev/null; then
        how="no netem in this kernel: 1% loss each way by nftables, no delay"
        for i in 0 1 2 3 4; do
            ip netns exec "$(ns "$i")" nft -f - <<NFT || { skip netem "nft rules failed"; return; }
table inet pslite_loss {
    chain input { type filter hook input priority 0; numgen random mod 100 < 1 drop; }
    chain output { type filter hook output priority 0; numgen random mod 100 < 1 drop; }
}
NFT
        done
    else
        skip netem "neither tc netem nor nft (apt-get install nftables) works here"; return
    fi
    local ok=0
    REPEAT=5 kv_cluster netem "$NET.10" ip PS_RESEND=1 PS_RESEND_TIMEOUT=500 || ok=1
    for i in 0 1 2 3 4; do
        ip netns exec "$(ns "$i")" tc qdisc del dev net0 root 2>/dev/null
        ip netns exec "$(ns "$i")" nft delete table inet pslite_loss 2>/dev/null
    done
    [ "$ok" -eq 0 ] && pass netem "$how on every link, PS_RESEND=1: sums exact" \
        || fail netem "$how: $DETAIL"
}

case_auth() {
    kv_cluster auth "$NET.10" ip PS_AUTH_TOKEN=multihost-secret \
        && pass auth "PS_AUTH_TOKEN across namespaces: sums exact" || fail auth "$DETAIL"
}

case_unreachable() {
    # The server in namespace 1 advertises its decoy address, which the
    # scheduler cannot reach: it must fail within its start deadline (8 s)
    # with an error naming that address.
    local common=(DMLC_NUM_SERVER=1 DMLC_NUM_WORKER=1 DMLC_PS_ROOT_URI="$NET.10" DMLC_PS_ROOT_PORT=9091)
    start unreachable.scheduler "$(ns 0)" 30 DMLC_ROLE=scheduler "${common[@]}" \
        DMLC_NODE_HOST="$NET.10" -- "$KV_APP"
    local sched=$LAST t0=$SECONDS
    start unreachable.server "$(ns 1)" 30 DMLC_ROLE=server "${common[@]}" DMLC_INTERFACE=eth0 \
        PS_START_TIMEOUT=8 -- "$KV_APP"
    local server=$LAST rc=0
    wait "$server" || rc=$?
    local took=$((SECONDS - t0))
    reap
    wait "$sched" 2>/dev/null
    local log=$LOGS/unreachable.server.log
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$took" -le 20 ] && grep -q "$DECOY.11" "$log"; then
        pass unreachable "failed after ${took} s: $( grep -o "the address it advertises, [^ ]*" "$log" | head -1)"
    else
        fail unreachable "exit $rc after ${took} s; $(tail -2 "$log")"
    fi
}

case_link_cut() {
    # kv_recovery with heartbeats; the link of the server in namespace 1 goes
    # down mid-job; a new server in namespace 5 must take its place.
    local common=(DMLC_NUM_SERVER=2 DMLC_NUM_WORKER=2 DMLC_PS_ROOT_URI="$NET.10" DMLC_PS_ROOT_PORT=9091
        PS_HEARTBEAT_INTERVAL=1 PS_HEARTBEAT_TIMEOUT=3 PS_RESEND=1 PS_RESEND_TIMEOUT=300
        KV_RECOVERY_ROUNDS=50 KV_RECOVERY_MAX_ROUNDS=100000)
    local pids=() i role
    for i in 0 1 2 3 4; do
        case $i in 0) role=scheduler ;; 1 | 2) role=server ;; *) role=worker ;; esac
        start "link_cut.$role$i" "$(ns "$i")" 120 DMLC_ROLE=$role DMLC_NODE_HOST="$NET.$((10 + i))" \
            "${common[@]}" -- "$KV_RECOVERY"
        pids+=("$LAST")
    done
    local victim=${pids[1]}
    if ! wait_line "$LOGS/link_cut.server1.log" "serving" 60 \
        || ! wait_line "$LOGS/link_cut.worker3.log" "round 200" 60 \
        || ! wait_line "$LOGS/link_cut.worker4.log" "round 200" 60; then
        fail link_cut "the cluster never got going"; return
    fi
    ip -n "$(ns 1)" link set net0 down
    start link_cut.replacement "$(ns 5)" 120 DMLC_ROLE=server DMLC_NODE_HOST="$NET.15" "${common[@]}" \
        -- "$KV_RECOVERY"
    local others=("${pids[0]}" "${pids[2]}" "${pids[3]}" "${pids[4]}" "$LAST") bad=0
    wait_all "${others[@]}" || bad=$?
    reap
    wait "$victim" 2>/dev/null
    ip -n "$(ns 1)" link set net0 up
    local id
    id=$(grep -o "server node [0-9]* serving" "$LOGS/link_cut.server1.log" | awk '{print $3}')
    local exact
    exact=$(cat "$LOGS"/link_cut.worker*.log | grep -c "exact rounds after recovery")
    if [ "$bad" -eq 0 ] && [ "$exact" -eq 2 ] \
        && grep -q "server node $id serving (recovered)" "$LOGS/link_cut.replacement.log"; then
        pass link_cut "node $id declared dead, replaced from namespace 5, both workers exact"
    else
        fail link_cut "$bad node(s) failed, $exact of 2 workers exact after recovery"
    fi
}

# Slurm, simulated: the variables srun gives each task (one task per
# "machine"), pslite exec derives everything else.
case_slurm_sim() {
    local pids=() i
    for i in 0 1 2 3 4 5; do
        start "slurm_sim.task$i" "$(ns "$i")" 90 SLURM_PROCID=$i SLURM_NTASKS=6 SLURM_JOB_ID=4242 \
            SLURM_JOB_NODELIST="node[0-5]" DMLC_INTERFACE=net0 KV_APP_REPEAT=10 \
            -- "$PSLITE" exec --servers 2 -- "$KV_APP"
        pids+=("$LAST")
    done
    local bad=0
    wait_all "${pids[@]}" || bad=$?
    local exact
    exact=$(cat "$LOGS"/slurm_sim.task*.log | grep -c "sums exact")
    [ "$bad" -eq 0 ] && [ "$exact" -eq 3 ] && pass slurm_sim "6 tasks, scheduler node0 from SLURM_JOB_NODELIST" \
        || fail slurm_sim "$bad task(s) failed, $exact of 3 workers exact"
}

# Kubernetes, simulated: a StatefulSet's pods pslite-0..5 behind the headless
# Service "pslite" (names from the hosts file), as deploy/kubernetes sets them.
case_kubernetes_sim() {
    local pids=() i
    for i in 0 1 2 3 4 5; do
        start "kubernetes_sim.pod$i" "$(ns "$i")" 90 KUBERNETES_SERVICE_HOST=10.96.0.1 \
            HOSTNAME="pslite-$i" PSLITE_WORLD_SIZE=6 PSLITE_SERVICE=pslite POD_IP="$NET.$((10 + i))" \
            PS_BIND_HOST=0.0.0.0 KV_APP_REPEAT=10 -- "$PSLITE" exec --servers 2 -- "$KV_APP"
        pids+=("$LAST")
    done
    local bad=0
    wait_all "${pids[@]}" || bad=$?
    local exact
    exact=$(cat "$LOGS"/kubernetes_sim.pod*.log | grep -c "sums exact")
    [ "$bad" -eq 0 ] && [ "$exact" -eq 3 ] && pass kubernetes_sim "6 pods, scheduler pslite-0.pslite" \
        || fail kubernetes_sim "$bad pod(s) failed, $exact of 3 workers exact"
}

# The real Open MPI launcher, on this machine (127.0.0.1).
case_mpirun() {
    if ! command -v mpirun > /dev/null; then
        skip mpirun "mpirun not installed (apt-get install openmpi-bin)"; return
    fi
    local port log=$LOGS/mpirun.log
    port=$(free_port)
    timeout -k 2 120 env -u DMLC_ROLE KV_APP_REPEAT=10 mpirun --allow-run-as-root --oversubscribe -np 6 \
        -x KV_APP_REPEAT "$PSLITE" exec --servers 2 --port "$port" -- "$KV_APP" > "$log" 2>&1 &
    PIDS+=($!)
    local rc=0
    wait $! || rc=$?
    local exact
    exact=$(grep -c "sums exact" "$log")
    [ "$rc" -eq 0 ] && [ "$exact" -eq 3 ] && pass mpirun "mpirun -np 6 pslite exec --servers 2: 3 workers exact" \
        || fail mpirun "exit $rc, $exact of 3 workers exact; $(tail -3 "$log" | tr '\n' ' ')"
}

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# The real Slurm: a one-machine cluster (slurmctld + slurmd from Debian's
# slurm-wlm, auth/none, state in a temporary directory), then srun -n 6.
case_slurm() {
    if ! command -v slurmctld > /dev/null || ! command -v slurmd > /dev/null; then
        skip slurm "slurm-wlm not installed (apt-get install slurm-wlm)"; return
    fi
    if [ "$(id -u)" != 0 ]; then
        skip slurm "needs root (slurmd)"; return
    fi
    SLURM_DIR=$(mktemp -d /tmp/pslite-slurm.XXXXXX)
    local d=$SLURM_DIR host p1 p2 i
    host=$(hostname)
    p1=$(free_port) p2=$(free_port)
    mkdir -p "$d/state" "$d/spool"
    cat > "$d/slurm.conf" <<CONF
ClusterName=pslitetest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$p1
SlurmdPort=$p2
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$d/state
SlurmdSpoolDir=$d/spool
SlurmctldPidFile=$d/slurmctld.pid
SlurmdPidFile=$d/slurmd.pid
SlurmctldLogFile=$d/slurmctld.log
SlurmdLogFile=$d/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SwitchType=switch/none
MpiDefault=none
ReturnToService=2
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
SlurmdParameters=config_overrides
NodeName=$host NodeAddr=127.0.0.1 CPUs=8 State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=10 State=UP OverSubscribe=FORCE:8
CONF
    export SLURM_CONF=$d/slurm.conf
    if ! slurmctld -f "$SLURM_CONF" -c > "$LOGS/slurmctld.out" 2>&1 \
        || ! slurmd -f "$SLURM_CONF" > "$LOGS/slurmd.out" 2>&1; then
        fail slurm "cannot start slurmctld/slurmd: $(tail -1 "$LOGS"/slurm*.out)"; stop_slurm; return
    fi
    local end=$((SECONDS + 30))
    until sinfo -h -o %T 2> /dev/null | grep -q idle; do
        if [ $SECONDS -ge $end ]; then
            fail slurm "the node never became idle: $(sinfo 2>&1 | tail -1)"; stop_slurm; return
        fi
        sleep 0.3
    done
    # The scheduler is the first host of the node list (this machine's
    # name); keep the traffic on loopback if that name is not 127.x here.
    local root=()
    getent hosts "$host" | grep -q '^127\.' || root=(DMLC_PS_ROOT_URI=127.0.0.1)
    local log=$LOGS/slurm.log rc=0
    timeout -k 2 120 env "${root[@]}" DMLC_NODE_HOST=127.0.0.1 KV_APP_REPEAT=10 \
        srun -n 6 -t 2 "$PSLITE" exec --servers 2 --port "$(free_port)" -- "$KV_APP" > "$log" 2>&1 &
    PIDS+=($!)
    wait $! || rc=$?
    stop_slurm
    unset SLURM_CONF
    local exact
    exact=$(grep -c "sums exact" "$log")
    [ "$rc" -eq 0 ] && [ "$exact" -eq 3 ] \
        && pass slurm "slurmctld + slurmd on this machine, srun -n 6 pslite exec --servers 2: 3 workers exact" \
        || fail slurm "exit $rc, $exact of 3 workers exact; $(tail -3 "$log" | tr '\n' ' ')"
}

# A C++ ps-lite node (MXNet 1.9.1's, from the venv tests/interop/run.sh
# builds) without a token against our token-protected scheduler, on
# 127.0.0.1: refused, with a log line on our side saying why.
case_cpp_refused() {
    local py=$ROOT/target/interop-venv/bin/python
    if [ ! -x "$py" ] || ! "$py" -c 'import mxnet' 2> /dev/null; then
        skip cpp_refused "no MXNet venv (tests/interop/run.sh creates it)"; return
    fi
    local port common
    port=$(free_port)
    common=(DMLC_NUM_SERVER=1 DMLC_NUM_WORKER=1 DMLC_PS_ROOT_URI=127.0.0.1 DMLC_PS_ROOT_PORT=$port)
    timeout -k 2 30 env -i PATH="$PATH" "${common[@]}" PS_AUTH_TOKEN=secret PS_START_TIMEOUT=8 \
        "$PSLITE" scheduler > "$LOGS/cpp_refused.scheduler.log" 2>&1 &
    local sched=$!
    PIDS+=("$sched")
    timeout -k 2 30 env -i PATH="$PATH" "${common[@]}" DMLC_ROLE=server DMLC_NODE_HOST=127.0.0.1 \
        "$py" "$ROOT/tests/interop/mx_node.py" > "$LOGS/cpp_refused.mxnet.log" 2>&1 &
    local cpp=$!
    PIDS+=("$cpp")
    local rc=0
    wait "$sched" || rc=$?
    kill -TERM "$cpp" 2> /dev/null
    wait "$cpp" 2> /dev/null
    local log=$LOGS/cpp_refused.scheduler.log
    if [ "$rc" -ne 0 ] && grep -q "C++ ps-lite node" "$log" && grep -q "1 of 1 servers" "$log"; then
        pass cpp_refused "$(grep -m1 -o "refused a connection.*" "$log" | cut -c1-120)..."
    else
        fail cpp_refused "scheduler exit $rc; $(tail -2 "$log" | tr '\n' ' ')"
    fi
}

case_kubernetes_manifests() {
    local out py=""
    # The first Python with PyYAML (the image's, or Debian's python3-yaml that .ci/run installs).
    for candidate in python3 /usr/bin/python3; do
        if "$candidate" -c 'import yaml' 2> /dev/null; then py=$candidate; break; fi
    done
    if [ -z "$py" ]; then
        fail kubernetes_manifests "no Python with PyYAML (apt-get install python3-yaml)"
        return
    fi
    if out=$("$py" "$ROOT/tests/multihost/check_manifests.py" "$ROOT/deploy/kubernetes" 2>&1); then
        pass kubernetes_manifests "$out"
    else
        fail kubernetes_manifests "$out"
    fi
}

NETNS_CASES=" kv_app interface bind_any host_names ipv6 unreachable auth netem link_cut slurm_sim kubernetes_sim "
NETWORK_READY=0
for c in "${CASES[@]}"; do
    if ! declare -F "case_$c" > /dev/null; then
        fail "$c" "no such case (cases: ${CASES_ALL[*]})"; continue
    fi
    if [[ $NETNS_CASES == *" $c "* ]]; then
        if [ "$HAVE_NETNS" -eq 0 ]; then skip "$c" "$WHY"; continue; fi
        if [ "$NETWORK_READY" -eq 0 ]; then
            if ! setup_network > "$LOGS/setup.log" 2>&1; then
                HAVE_NETNS=0 WHY="cannot build the test network: $(tail -1 "$LOGS/setup.log")"
                skip "$c" "$WHY"; continue
            fi
            NETWORK_READY=1
        fi
    fi
    "case_$c"
    [ "$NETWORK_READY" -eq 1 ] && reap
done
summary
[ "$FAILED" -eq 0 ]
