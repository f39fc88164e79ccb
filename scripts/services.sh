#!/usr/bin/env bash
# Private servers for the tests and benches: a PostgreSQL cluster, a PgBouncer in transaction
# mode, a Redis and a three-master Redis Cluster, each on free loopback ports, with their files
# in "$run_dir". Sourced by scripts/test; `start_services` exports IDEM_PG_URL,
# IDEM_PGBOUNCER_URL, IDEM_REDIS_URL and IDEM_REDIS_CLUSTER_NODES, and `stop_services` stops
# what it started. A missing server program is installed with apt-get
# when we are root; otherwise it is an error, never a skipped test.

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

# The directory of initdb and pg_ctl: on PATH, or Debian's /usr/lib/postgresql/<version>/bin.
pg_bin_dir() {
    if command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; then
        dirname "$(command -v initdb)"
        return
    fi
    ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1
}

install_packages() {
    if [ "$(id -u)" -ne 0 ]; then
        echo "scripts/services.sh: missing $*; install it (apt-get install $*) or run as root" >&2
        return 1
    fi
    echo "== apt-get install $*"
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null 2>&1; then
        apt-get update -qq >/dev/null 2>&1
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
    fi
}

# Runs a command as the unprivileged owner of the cluster (initdb and postgres refuse root).
as_owner() {
    if [ "$(id -u)" -eq 0 ]; then
        runuser -u "$pg_owner" -- "$@"
    else
        "$@"
    fi
}

start_postgres() {
    local bin
    bin=$(pg_bin_dir)
    if [ -z "$bin" ] || [ ! -x "$bin/initdb" ]; then
        install_packages postgresql || return 1
        bin=$(pg_bin_dir)
    fi
    pg_owner=$(id -un)
    if [ "$(id -u)" -eq 0 ]; then
        pg_owner=postgres
        id -u "$pg_owner" >/dev/null 2>&1 || useradd --system --no-create-home "$pg_owner"
    fi
    pg_dir="$run_dir/postgres"
    mkdir -p "$pg_dir"
    chmod 755 "$run_dir"
    chown "$pg_owner" "$pg_dir"
    pg_port=$(free_port)
    as_owner "$bin/initdb" -D "$pg_dir/data" -U idem --auth=trust -E UTF8 --no-sync >"$pg_dir/initdb.log" 2>&1 \
        || { cat "$pg_dir/initdb.log" >&2; return 1; }
    # fsync off: the tests kill clients, never this server; it is removed afterwards. With
    # IDEM_PG_DURABLE=1 (what scripts/bench uses for its headline table) the server keeps
    # PostgreSQL's default durability: fsync, synchronous_commit and full_page_writes on.
    local durability="-c fsync=off -c full_page_writes=off"
    if [ "${IDEM_PG_DURABLE:-0}" = "1" ]; then
        durability="-c fsync=on -c synchronous_commit=on -c full_page_writes=on"
    fi
    as_owner "$bin/pg_ctl" -D "$pg_dir/data" -l "$pg_dir/server.log" -w -t 60 \
        -o "-p $pg_port -k $pg_dir -c listen_addresses=127.0.0.1 -c max_connections=300 $durability" \
        start >/dev/null || { cat "$pg_dir/server.log" >&2; return 1; }
    pg_ctl_bin="$bin/pg_ctl"
    export IDEM_PG_URL="postgres://idem@127.0.0.1:$pg_port/postgres"
    echo "== PostgreSQL $("$bin/postgres" --version | awk '{print $3}') on 127.0.0.1:$pg_port ($durability)"
}

start_pgbouncer() {
    if ! command -v pgbouncer >/dev/null 2>&1; then
        install_packages pgbouncer || return 1
    fi
    local dir="$run_dir/pgbouncer"
    mkdir -p "$dir"
    bouncer_port=$(free_port)
    printf '"idem" ""\n' >"$dir/userlist.txt"
    cat >"$dir/pgbouncer.ini" <<INI
[databases]
postgres = host=127.0.0.1 port=$pg_port dbname=postgres user=idem

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $bouncer_port
unix_socket_dir =
auth_type = trust
auth_file = $dir/userlist.txt
pool_mode = transaction
max_client_conn = 1000
default_pool_size = 40
ignore_startup_parameters = extra_float_digits
server_login_retry = 1
logfile = $dir/pgbouncer.log
pidfile = $dir/pgbouncer.pid
INI
    chown -R "$pg_owner" "$dir"
    as_owner pgbouncer -d "$dir/pgbouncer.ini" >/dev/null 2>&1 \
        || { cat "$dir/pgbouncer.log" >&2 2>/dev/null; return 1; }
    for _ in $(seq 50); do
        python3 -c "import socket; socket.create_connection(('127.0.0.1', $bouncer_port), 0.2)" 2>/dev/null && break
        sleep 0.1
    done
    bouncer_pid_file="$dir/pgbouncer.pid"
    export IDEM_PGBOUNCER_URL="postgres://idem@127.0.0.1:$bouncer_port/postgres"
    echo "== PgBouncer $(pgbouncer --version | head -n 1 | awk '{print $2}') (transaction mode) on 127.0.0.1:$bouncer_port"
}

start_redis() {
    if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
        install_packages redis-server || return 1
    fi
    local dir="$run_dir/redis"
    mkdir -p "$dir/single"
    redis_port=$(free_port)
    redis-server --port "$redis_port" --bind 127.0.0.1 --dir "$dir/single" --daemonize yes \
        --pidfile "$dir/single/redis.pid" --logfile "$dir/single/redis.log" --save '' --appendonly no \
        >/dev/null || return 1
    redis_pids=("$dir/single/redis.pid")
    export IDEM_REDIS_URL="redis://127.0.0.1:$redis_port"
    # A cluster of three masters, slots spread by redis-cli.
    local nodes=() port
    for i in 1 2 3; do
        port=$(free_port)
        mkdir -p "$dir/node$i"
        # The cluster bus port is given explicitly: port + 10000 may not exist.
        redis-server --port "$port" --bind 127.0.0.1 --dir "$dir/node$i" --daemonize yes \
            --cluster-enabled yes --cluster-port "$(free_port)" --cluster-config-file nodes.conf \
            --cluster-node-timeout 2000 \
            --pidfile "$dir/node$i/redis.pid" --logfile "$dir/node$i/redis.log" --save '' --appendonly no \
            >/dev/null || return 1
        redis_pids+=("$dir/node$i/redis.pid")
        nodes+=("127.0.0.1:$port")
    done
    for node in "${nodes[@]}"; do
        for _ in $(seq 50); do
            redis-cli -h 127.0.0.1 -p "${node#*:}" ping >/dev/null 2>&1 && break
            sleep 0.1
        done
    done
    redis-cli --cluster create "${nodes[@]}" --cluster-replicas 0 --cluster-yes >"$dir/cluster-create.log" 2>&1 \
        || { cat "$dir/cluster-create.log" >&2; return 1; }
    for _ in $(seq 100); do
        redis-cli -h 127.0.0.1 -p "${nodes[0]#*:}" cluster info 2>/dev/null | grep -q 'cluster_state:ok' && break
        sleep 0.1
    done
    export IDEM_REDIS_CLUSTER_NODES
    IDEM_REDIS_CLUSTER_NODES=$(printf 'redis://%s,' "${nodes[@]}")
    IDEM_REDIS_CLUSTER_NODES=${IDEM_REDIS_CLUSTER_NODES%,}
    echo "== Redis $(redis-server --version | awk '{print $3}' | cut -d= -f2) on 127.0.0.1:$redis_port, cluster on ${nodes[*]}"
}

start_services() {
    # faketime runs a test's child process with its clock minutes off (clock-skew test).
    if ! command -v faketime >/dev/null 2>&1; then
        install_packages faketime || return 1
    fi
    start_postgres && start_pgbouncer && start_redis
}

stop_services() {
    local pid_file
    for pid_file in "${redis_pids[@]:-}"; do
        [ -n "$pid_file" ] && [ -f "$pid_file" ] && kill "$(cat "$pid_file")" 2>/dev/null || true
    done
    if [ -n "${bouncer_pid_file:-}" ] && [ -f "$bouncer_pid_file" ]; then
        kill "$(cat "$bouncer_pid_file")" 2>/dev/null || true
    fi
    if [ -n "${pg_ctl_bin:-}" ]; then
        as_owner "$pg_ctl_bin" -D "$pg_dir/data" -m immediate -w stop >/dev/null 2>&1 || true
    fi
}
