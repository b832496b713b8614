#!/usr/bin/env bash
# The real PostgreSQL and Slurm (slurmctld + munge) that the test suite uses, from Debian packages.
#
#   bash scripts/services.sh install   apt-get install what is missing (postgresql, slurmctld,
#                                      slurm-client, slurmd, munge, iproute2, ethtool,
#                                      prometheus-alertmanager, etcd-server: the store of the
#                                      kube-apiserver that tests/support/kube.py starts, and
#                                      chromium: the headless browser of tests/test_incident_page.py)
#   bash scripts/services.sh start     start a private PostgreSQL cluster, munged, slurmctld and
#                                      one slurmd (for rwnode1) under $ROCEWATCH_SERVICES_DIR;
#                                      write its env.sh
#   bash scripts/services.sh stop      stop them (only what this script started: by pid file)
#   bash scripts/services.sh status    say what runs
#
# Nothing here touches the system's own services (/etc/munge, /etc/slurm, the 15/main cluster):
# every daemon gets its own config, socket, port, pid and log under $ROCEWATCH_SERVICES_DIR.
# After `start`:   source "$ROCEWATCH_SERVICES_DIR/env.sh"   exports
#   ROCEWATCH_TEST_PG_URL       postgresql+psycopg://postgres@127.0.0.1:PORT/rw_test (trust auth)
#   SLURM_CONF                  the private slurm.conf (scontrol finds slurmctld and munged by it)
#   ROCEWATCH_TEST_SLURM_NODES  rwnode1,rwnode2 (nodes defined in slurm.conf)
#   ROCEWATCH_TEST_SLURMD_NODE  rwnode1: the one node with a local slurmd (jobs can run there);
#                               rwnode[2-4] stay defined without one
#
# Environment: ROCEWATCH_SERVICES_DIR (default /tmp/rocewatch-services; postgres and munge must be
# able to traverse it), ROCEWATCH_PG_PORT (default 55432), ROCEWATCH_SLURMCTLD_PORT (default 56817),
# ROCEWATCH_SLURMD_PORT (default ROCEWATCH_SLURMCTLD_PORT + 2),
# ROCEWATCH_SERVICES_TIMEOUT (seconds to wait for each daemon, default 60).
# Needs root: PostgreSQL runs as the `postgres` user and munged as `munge` (both refuse root).
set -euo pipefail

DIR="$(realpath -m "${ROCEWATCH_SERVICES_DIR:-/tmp/rocewatch-services}")"
PG_PORT="${ROCEWATCH_PG_PORT:-55432}"
SLURM_PORT="${ROCEWATCH_SLURMCTLD_PORT:-56817}"
SLURMD_PORT="${ROCEWATCH_SLURMD_PORT:-$((SLURM_PORT + 2))}"
TIMEOUT="${ROCEWATCH_SERVICES_TIMEOUT:-60}"
PG_DB=rw_test
CLUSTER=rwtest
NODES="rwnode[1-4]"
OTHER_NODES="rwnode[2-4]"
TEST_NODES="rwnode1,rwnode2"
SLURMD_NODE=rwnode1

PGDATA="$DIR/pg/data"
PGRUN="$DIR/pg/run"
PGLOG="$DIR/pg/postgres.log"
MUNGE_DIR="$DIR/munge"
MUNGE_SOCK="$MUNGE_DIR/munge.socket"
MUNGE_PID="$MUNGE_DIR/munged.pid"
SLURM_DIR="$DIR/slurm"
SLURM_CONF_FILE="$SLURM_DIR/slurm.conf"
SLURM_PID="$SLURM_DIR/slurmctld.pid"
SLURM_LOG="$SLURM_DIR/slurmctld.log"
SLURMD_PID="$SLURM_DIR/slurmd.pid"
SLURMD_LOG="$SLURM_DIR/slurmd.log"
ENV_FILE="$DIR/env.sh"

say() { printf '[services] %s\n' "$*"; }
die() {
    printf '[services] ERROR: %s\n' "$*" >&2
    exit 1
}
now() { date +%s; }

need_root() {
    [ "$(id -u)" -eq 0 ] || die "'$1' needs root (daemons run as the postgres and munge users)"
}

# --- install ------------------------------------------------------------------------------------

PACKAGES=(postgresql slurmctld slurmd slurm-client munge iproute2 ethtool prometheus-alertmanager
    etcd-server chromium)

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q '^install ok installed$'; }

cmd_install() {
    local missing=() p sudo=()
    for p in "${PACKAGES[@]}"; do
        installed "$p" || missing+=("$p")
    done
    if [ ${#missing[@]} -eq 0 ]; then
        say "install: already installed: ${PACKAGES[*]}"
        return 0
    fi
    if [ "$(id -u)" -ne 0 ]; then
        command -v sudo >/dev/null || die "install needs root (or sudo) for apt-get"
        sudo=(sudo -n)
    fi
    say "install: missing ${missing[*]}: apt-get update"
    local apt=(env DEBIAN_FRONTEND=noninteractive timeout 900 apt-get -q -y
        -o DPkg::Lock::Timeout=300 -o Dpkg::Options::=--force-confdef
        -o Dpkg::Options::=--force-confold)
    "${sudo[@]}" "${apt[@]}" update >/dev/null
    say "install: apt-get install --no-install-recommends ${missing[*]}"
    "${sudo[@]}" "${apt[@]}" install --no-install-recommends "${missing[@]}" >/dev/null
    for p in "${missing[@]}"; do
        installed "$p" || die "install: $p is still not installed"
    done
    say "install: done"
}

# --- helpers --------------------------------------------------------------------------------------

pg_bin() {
    local d
    d="$(find /usr/lib/postgresql -mindepth 3 -maxdepth 3 -path '*/bin/pg_ctl' 2>/dev/null |
        sort -V | tail -n 1)"
    [ -n "$d" ] || die "PostgreSQL server binaries not found (run: bash $0 install)"
    dirname "$d"
}

as_postgres() { runuser -u postgres -- "$@"; }

port_busy() { # port -> 0 when something listens on 127.0.0.1:port
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

alive() { # pidfile -> 0 when its process runs
    local pid
    [ -s "$1" ] || return 1
    pid="$(head -n 1 "$1" 2>/dev/null | tr -dc 0-9)"
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null
}

kill_pidfile() { # pidfile name: TERM, wait up to 20 s, then KILL
    local pid i
    [ -s "$1" ] || return 0
    pid="$(head -n 1 "$1" 2>/dev/null | tr -dc 0-9)"
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        say "stop: $2 (pid $pid)"
        kill -TERM "$pid" 2>/dev/null || true
        for ((i = 0; i < 200; i++)); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "$pid" 2>/dev/null; then
            say "stop: $2 (pid $pid) ignored TERM: KILL"
            kill -KILL "$pid" 2>/dev/null || true
            sleep 0.2
        fi
    fi
    rm -f "$1"
}

tail_log() { [ -f "$1" ] && tail -n 25 "$1" | sed 's/^/    | /' >&2 || true; }

# --- PostgreSQL ---------------------------------------------------------------------------------

start_postgres() {
    local bin t0
    bin="$(pg_bin)"
    t0=$(now)
    as_postgres test -x "$DIR" || die "user postgres cannot enter $DIR: choose another ROCEWATCH_SERVICES_DIR"
    if port_busy "$PG_PORT"; then
        die "127.0.0.1:$PG_PORT is taken by something else: set ROCEWATCH_PG_PORT"
    fi
    mkdir -p "$DIR/pg"
    chown postgres:postgres "$DIR/pg"
    chmod 0700 "$DIR/pg"
    if [ ! -s "$PGDATA/PG_VERSION" ] || [ "$(cat "$PGDATA/PG_VERSION")" != "$(basename "$(dirname "$bin")")" ]; then
        rm -rf "$PGDATA"
        say "postgres: initdb $PGDATA ($("$bin/postgres" --version))"
        as_postgres "$bin/initdb" -D "$PGDATA" -U postgres --auth=trust -E UTF8 \
            --locale=C.UTF-8 --no-sync >"$DIR/pg/initdb.log" 2>&1 ||
            { tail_log "$DIR/pg/initdb.log"; die "initdb failed"; }
    fi
    install -d -o postgres -g postgres -m 0700 "$PGRUN"
    say "postgres: starting on 127.0.0.1:$PG_PORT"
    # Test settings: loopback only, private socket dir, no durability (tests recreate everything).
    as_postgres "$bin/pg_ctl" -D "$PGDATA" -l "$PGLOG" -w -t "$TIMEOUT" -o "-p $PG_PORT \
        -c listen_addresses=127.0.0.1 -c unix_socket_directories=$PGRUN -c fsync=off \
        -c synchronous_commit=off -c full_page_writes=off -c max_connections=100" start \
        >/dev/null || { tail_log "$PGLOG"; die "PostgreSQL did not start"; }
    if ! as_postgres "$bin/psql" -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres -tAq \
        -c "SELECT 1 FROM pg_database WHERE datname = '$PG_DB'" | grep -q 1; then
        as_postgres "$bin/createdb" -h 127.0.0.1 -p "$PG_PORT" -U postgres "$PG_DB"
        say "postgres: created database $PG_DB"
    fi
    say "postgres: ready in $(($(now) - t0)) s"
}

stop_postgres() {
    local bin
    [ -f "$PGDATA/postmaster.pid" ] || return 0
    bin="$(pg_bin)"
    if as_postgres "$bin/pg_ctl" -D "$PGDATA" status >/dev/null 2>&1; then
        say "stop: postgres ($PGDATA)"
        as_postgres "$bin/pg_ctl" -D "$PGDATA" -m fast -w -t 30 stop >/dev/null ||
            as_postgres "$bin/pg_ctl" -D "$PGDATA" -m immediate -w -t 30 stop >/dev/null || true
    fi
}

# --- munge --------------------------------------------------------------------------------------

start_munge() {
    local t0 i
    t0=$(now)
    rm -rf "$MUNGE_DIR"
    install -d -o munge -g munge -m 0700 "$MUNGE_DIR"
    # A fresh key per start: only this script's munged and the Slurm it serves use it.
    if command -v mungekey >/dev/null; then
        runuser -u munge -- mungekey --create --keyfile="$MUNGE_DIR/munge.key" --force
    else
        dd if=/dev/urandom bs=1 count=1024 of="$MUNGE_DIR/munge.key" status=none
        chown munge:munge "$MUNGE_DIR/munge.key"
    fi
    chmod 0400 "$MUNGE_DIR/munge.key"
    say "munge: starting munged (socket $MUNGE_SOCK)"
    # --force: the services dir may sit under /tmp, whose sticky world-writable mode munged's
    # directory checks would otherwise reject.
    runuser -u munge -- /usr/sbin/munged --force --socket="$MUNGE_SOCK" \
        --key-file="$MUNGE_DIR/munge.key" --pid-file="$MUNGE_PID" \
        --log-file="$MUNGE_DIR/munged.log" --seed-file="$MUNGE_DIR/munged.seed" ||
        { tail_log "$MUNGE_DIR/munged.log"; die "munged did not start"; }
    for ((i = 0; i < TIMEOUT * 10; i++)); do
        if munge -n --socket="$MUNGE_SOCK" 2>/dev/null | unmunge --socket="$MUNGE_SOCK" >/dev/null 2>&1; then
            say "munge: ready in $(($(now) - t0)) s"
            return 0
        fi
        sleep 0.1
    done
    tail_log "$MUNGE_DIR/munged.log"
    die "munged does not answer on $MUNGE_SOCK"
}

stop_munge() { kill_pidfile "$MUNGE_PID" munged; }

# --- slurmctld ----------------------------------------------------------------------------------

write_slurm_conf() {
    cat >"$SLURM_CONF_FILE" <<EOF
# Written by scripts/services.sh: a test-only controller on localhost. Only $SLURMD_NODE runs a
# slurmd (its own port); SlurmdTimeout=0 keeps slurmctld from marking the others DOWN, so they
# can still be drained and resumed.
ClusterName=$CLUSTER
SlurmctldHost=localhost
SlurmctldPort=$SLURM_PORT
SlurmdPort=$((SLURM_PORT + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCK
StateSaveLocation=$SLURM_DIR/state
SlurmdSpoolDir=$SLURM_DIR/spool
SlurmctldPidFile=$SLURM_PID
SlurmdPidFile=$SLURMD_PID
SlurmdLogFile=$SLURMD_LOG
SlurmdDebug=info
SlurmctldLogFile=$SLURM_LOG
SlurmctldDebug=info
SlurmdTimeout=0
SlurmctldTimeout=30
ReturnToService=2
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
PlugStackConfig=$SLURM_DIR/plugstack.conf
NodeName=$SLURMD_NODE NodeHostname=$(hostname -s) NodeAddr=127.0.0.1 Port=$SLURMD_PORT CPUs=1 RealMemory=100 State=UNKNOWN
NodeName=$OTHER_NODES NodeAddr=127.0.0.1 CPUs=1 RealMemory=100 State=UNKNOWN
PartitionName=rwtest Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
    : >"$SLURM_DIR/plugstack.conf"
}

start_slurmctld() {
    local t0 i
    t0=$(now)
    if port_busy "$SLURM_PORT"; then
        die "127.0.0.1:$SLURM_PORT is taken by something else: set ROCEWATCH_SLURMCTLD_PORT"
    fi
    rm -rf "$SLURM_DIR"
    mkdir -p "$SLURM_DIR/state" "$SLURM_DIR/spool"
    chmod 0755 "$SLURM_DIR"
    write_slurm_conf
    say "slurm: starting slurmctld ($(slurmctld -V 2>/dev/null), port $SLURM_PORT, nodes $NODES)"
    # -c: clear any saved state (a fresh cluster on every start); -i: ignore bad state files.
    SLURM_CONF="$SLURM_CONF_FILE" /usr/sbin/slurmctld -c -i -f "$SLURM_CONF_FILE" ||
        { tail_log "$SLURM_LOG"; die "slurmctld did not start"; }
    for ((i = 0; i < TIMEOUT * 5; i++)); do
        if SLURM_CONF="$SLURM_CONF_FILE" timeout 10 scontrol ping 2>/dev/null | grep -q 'is UP'; then
            say "slurm: slurmctld answers scontrol ping in $(($(now) - t0)) s"
            return 0
        fi
        if [ "$i" -gt 10 ] && ! alive "$SLURM_PID"; then
            break
        fi
        sleep 0.2
    done
    tail_log "$SLURM_LOG"
    die "slurmctld does not answer scontrol ping"
}

stop_slurmctld() { kill_pidfile "$SLURM_PID" slurmctld; }

start_slurmd() {
    local t0 i
    t0=$(now)
    if port_busy "$SLURMD_PORT"; then
        die "127.0.0.1:$SLURMD_PORT is taken by something else: set ROCEWATCH_SLURMD_PORT"
    fi
    say "slurm: starting slurmd for $SLURMD_NODE (port $SLURMD_PORT)"
    SLURM_CONF="$SLURM_CONF_FILE" /usr/sbin/slurmd -N "$SLURMD_NODE" -f "$SLURM_CONF_FILE" ||
        { tail_log "$SLURMD_LOG"; die "slurmd did not start"; }
    for ((i = 0; i < TIMEOUT * 5; i++)); do
        if SLURM_CONF="$SLURM_CONF_FILE" timeout 10 scontrol show node -o "$SLURMD_NODE" 2>/dev/null |
            grep -q 'SlurmdStartTime=[0-9]'; then
            say "slurm: slurmd registered $SLURMD_NODE in $(($(now) - t0)) s"
            return 0
        fi
        sleep 0.2
    done
    tail_log "$SLURMD_LOG"
    die "slurmd for $SLURMD_NODE did not register with slurmctld"
}

stop_slurmd() { kill_pidfile "$SLURMD_PID" slurmd; }

# --- commands -----------------------------------------------------------------------------------

cmd_stop() {
    need_root stop
    [ -d "$DIR" ] || { say "stop: nothing to stop ($DIR does not exist)"; return 0; }
    stop_slurmd
    stop_slurmctld
    stop_munge
    stop_postgres
    rm -f "$ENV_FILE"
    say "stop: done"
}

cmd_start() {
    need_root start
    local t0
    t0=$(now)
    for c in runuser munged munge unmunge slurmctld slurmd scontrol; do
        command -v "$c" >/dev/null || [ -x "/usr/sbin/$c" ] ||
            die "$c not found (run: bash $0 install)"
    done
    id postgres >/dev/null 2>&1 || die "no postgres user (run: bash $0 install)"
    id munge >/dev/null 2>&1 || die "no munge user (run: bash $0 install)"
    mkdir -p "$DIR"
    chmod 0755 "$DIR"
    cmd_stop # leftovers of an earlier start
    start_postgres
    start_munge
    start_slurmctld
    start_slurmd
    cat >"$ENV_FILE" <<EOF
# Written by scripts/services.sh start: source it before pytest.
export ROCEWATCH_TEST_PG_URL='postgresql+psycopg://postgres@127.0.0.1:$PG_PORT/$PG_DB'
export SLURM_CONF='$SLURM_CONF_FILE'
export ROCEWATCH_TEST_SLURM_NODES='$TEST_NODES'
export ROCEWATCH_TEST_SLURMD_NODE='$SLURMD_NODE'
EOF
    say "start: all up in $(($(now) - t0)) s; env in $ENV_FILE:"
    sed -n 's/^export /    /p' "$ENV_FILE"
}

cmd_status() {
    local rc=0
    if [ -f "$PGDATA/postmaster.pid" ] && as_postgres "$(pg_bin)/pg_ctl" -D "$PGDATA" status >/dev/null 2>&1; then
        say "postgres: running (127.0.0.1:$PG_PORT)"
    else
        say "postgres: stopped"
        rc=1
    fi
    if alive "$MUNGE_PID"; then say "munged: running"; else say "munged: stopped"; rc=1; fi
    if alive "$SLURM_PID"; then say "slurmctld: running"; else say "slurmctld: stopped"; rc=1; fi
    if alive "$SLURMD_PID"; then say "slurmd: running"; else say "slurmd: stopped"; rc=1; fi
    return $rc
}

case "${1:-}" in
install) cmd_install ;;
start) cmd_start ;;
stop) cmd_stop ;;
restart) cmd_start ;;
status) cmd_status ;;
*)
    echo "usage: bash $0 install|start|stop|status" >&2
    exit 2
    ;;
esac
