# shellcheck shell=bash
# Finds or starts the Postgres and Redis that shardkeep's scripts need.
#
# sk_services_up exports DATABASE_URL and REDIS_URL. It keeps a reachable server named by those
# variables, else tries the conventional local addresses (SHARDKEEP_LOCAL_PG_URLS and
# SHARDKEEP_LOCAL_REDIS_URLS, space-separated, name others), else starts a private server from
# the installed binaries in a temporary directory on a free port. sk_services_down stops whatever
# sk_services_up started (and nothing else). Where the binaries are missing it says how to
# install them.

SK_TMP=""
SK_PG_SOURCE=""
SK_PG_DIR=""
SK_PG_BINDIR=""
SK_PG_USER=""
SK_REDIS_PORT=""
SK_CLUSTER_PORTS=""
SK_PGBOUNCER_DIR=""

sk_log() { printf '[services] %s\n' "$*" >&2; }

# True when something accepts TCP connections on host $1 port $2.
sk_tcp_open() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

# A port nothing listens on, from the dynamic range.
sk_free_port() {
  local port
  for _ in $(seq 1 200); do
    port=$((20000 + RANDOM % 40000))
    if ! sk_tcp_open 127.0.0.1 "$port"; then
      echo "$port"
      return 0
    fi
  done
  return 1
}

sk_pg_reachable() {
  local url=$1
  if command -v psql >/dev/null 2>&1; then
    PGCONNECT_TIMEOUT=3 psql "$url" -Atqc 'SELECT 1' >/dev/null 2>&1
  elif command -v pg_isready >/dev/null 2>&1; then
    pg_isready -q -t 3 -d "$url" >/dev/null 2>&1
  else
    local hostport=${url#*@}
    hostport=${hostport%%/*}
    sk_tcp_open "${hostport%%:*}" "${hostport##*:}"
  fi
}

sk_redis_reachable() {
  local url=$1
  if command -v redis-cli >/dev/null 2>&1; then
    [ "$(timeout 3 redis-cli -u "$url" PING 2>/dev/null)" = "PONG" ]
  else
    local hostport=${url#redis://}
    hostport=${hostport#*@}
    hostport=${hostport%%/*}
    sk_tcp_open "${hostport%%:*}" "${hostport##*:}"
  fi
}

sk_tmpdir() {
  if [ -z "$SK_TMP" ]; then
    SK_TMP=$(mktemp -d "${TMPDIR:-/tmp}/shardkeep-services.XXXXXX")
    chmod 755 "$SK_TMP"
  fi
}

# Directory holding initdb and pg_ctl, if PostgreSQL's server binaries are installed.
sk_pg_bindir() {
  local dir
  if command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; then
    dirname "$(readlink -f "$(command -v initdb)")"
    return 0
  fi
  for dir in /usr/lib/postgresql/*/bin /usr/local/opt/postgresql*/bin /opt/homebrew/opt/postgresql*/bin; do
    if [ -x "$dir/initdb" ] && [ -x "$dir/pg_ctl" ]; then
      echo "$dir"
      return 0
    fi
  done
  return 1
}

# Runs a command as the unprivileged owner of the private cluster (Postgres refuses root).
sk_as_pg_user() {
  if [ -n "$SK_PG_USER" ]; then
    runuser -u "$SK_PG_USER" -- "$@"
  else
    "$@"
  fi
}

sk_start_postgres() {
  local bindir port
  if ! bindir=$(sk_pg_bindir); then
    sk_log "Postgres is not reachable and its server binaries (initdb, pg_ctl) are not installed."
    sk_log "Install them, e.g. 'sudo apt-get install postgresql' (Debian/Ubuntu) or"
    sk_log "'brew install postgresql@16' (macOS), or set DATABASE_URL to a reachable server."
    return 1
  fi
  sk_tmpdir
  SK_PG_DIR="$SK_TMP/pg"
  # Known before initdb, so that clean-up can stop a server whatever step failed.
  SK_PG_BINDIR=$bindir
  mkdir -p "$SK_PG_DIR"
  if [ "$(id -u)" = "0" ]; then
    if id postgres >/dev/null 2>&1; then SK_PG_USER=postgres; else SK_PG_USER=nobody; fi
    chown -R "$SK_PG_USER" "$SK_PG_DIR"
  fi
  sk_as_pg_user "$bindir/initdb" -D "$SK_PG_DIR/data" -U postgres -A trust -E UTF8 --no-sync >"$SK_TMP/initdb.log" 2>&1 \
    || { sk_log "initdb failed:"; cat "$SK_TMP/initdb.log" >&2; return 1; }
  # A free port can be taken before the server binds it (tests run beside each other): another
  # port is tried then.
  local attempt log
  for attempt in 1 2 3; do
    port=$(sk_free_port) || { sk_log "no free port for Postgres"; return 1; }
    sk_log "starting a private Postgres on 127.0.0.1:$port ($SK_PG_DIR)"
    log="$SK_PG_DIR/postgres-$attempt.log"
    if sk_as_pg_user "$bindir/pg_ctl" -D "$SK_PG_DIR/data" -l "$log" -w -t 60 \
      -o "-p $port -k $SK_PG_DIR -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=300" \
      start >/dev/null; then
      break
    fi
    if [ "$attempt" = 3 ] || ! grep -q "Address already in use" "$log"; then
      sk_log "Postgres did not start:"
      cat "$log" >&2
      return 1
    fi
  done
  export DATABASE_URL="postgres://postgres@127.0.0.1:$port/postgres"
}

sk_start_redis() {
  local port
  if ! command -v redis-server >/dev/null 2>&1; then
    sk_log "Redis is not reachable and redis-server is not installed."
    sk_log "Install it, e.g. 'sudo apt-get install redis-server' (Debian/Ubuntu) or"
    sk_log "'brew install redis' (macOS), or set REDIS_URL to a reachable server."
    return 1
  fi
  sk_tmpdir
  port=$(sk_free_port) || { sk_log "no free port for Redis"; return 1; }
  sk_log "starting a private Redis on 127.0.0.1:$port"
  redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --daemonize yes \
    --dir "$SK_TMP" --pidfile "$SK_TMP/redis.pid" --logfile "$SK_TMP/redis.log" >/dev/null
  for _ in $(seq 1 100); do
    if sk_tcp_open 127.0.0.1 "$port"; then
      SK_REDIS_PORT=$port
      export REDIS_URL="redis://127.0.0.1:$port"
      return 0
    fi
    sleep 0.1
  done
  sk_log "Redis did not start:"
  cat "$SK_TMP/redis.log" >&2
  return 1
}

# A port p with p and p+10000 (its cluster bus) both free.
sk_free_cluster_port() {
  local port
  for _ in $(seq 1 200); do
    port=$((20000 + RANDOM % 30000))
    if ! sk_tcp_open 127.0.0.1 "$port" && ! sk_tcp_open 127.0.0.1 $((port + 10000)); then
      case " $SK_CLUSTER_PORTS " in *" $port "*) continue ;; esac
      echo "$port"
      return 0
    fi
  done
  return 1
}

# Starts a private Redis Cluster of three masters with one replica each, on free ports in the
# temporary directory, and exports SK_REDIS_CLUSTER_URL (its six nodes as seeds).
sk_start_redis_cluster() {
  local port ports=() seeds=() nodes=()
  if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
    sk_log "redis-server and redis-cli are needed for the Redis Cluster tests."
    sk_log "Install them, e.g. 'sudo apt-get install redis-server' (Debian/Ubuntu)."
    return 1
  fi
  sk_tmpdir
  for _ in 1 2 3 4 5 6; do
    port=$(sk_free_cluster_port) || { sk_log "no free port for the Redis Cluster"; return 1; }
    SK_CLUSTER_PORTS="$SK_CLUSTER_PORTS $port"
    ports+=("$port")
    mkdir -p "$SK_TMP/cluster-$port"
    redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --daemonize yes \
      --cluster-enabled yes --cluster-config-file "$SK_TMP/cluster-$port/nodes.conf" \
      --cluster-node-timeout 2000 --dir "$SK_TMP/cluster-$port" \
      --pidfile "$SK_TMP/cluster-$port/redis.pid" --logfile "$SK_TMP/cluster-$port/redis.log" \
      >/dev/null
    seeds+=("redis://127.0.0.1:$port")
    nodes+=("127.0.0.1:$port")
  done
  for port in "${ports[@]}"; do
    for _ in $(seq 1 100); do
      sk_tcp_open 127.0.0.1 "$port" && break
      sleep 0.1
    done
  done
  sk_log "starting a private Redis Cluster (3 masters, 3 replicas) on ports${SK_CLUSTER_PORTS}"
  if ! redis-cli --cluster create "${nodes[@]}" --cluster-replicas 1 --cluster-yes \
      >"$SK_TMP/cluster-create.log" 2>&1; then
    sk_log "redis-cli --cluster create failed:"
    cat "$SK_TMP/cluster-create.log" >&2
    return 1
  fi
  for _ in $(seq 1 200); do
    local ok=0
    for port in "${ports[@]}"; do
      redis-cli -p "$port" CLUSTER INFO 2>/dev/null | grep -q 'cluster_state:ok' && ok=$((ok + 1))
    done
    if [ "$ok" -eq 6 ]; then
      SK_REDIS_CLUSTER_URL=$(IFS=,; echo "${seeds[*]}")
      export SK_REDIS_CLUSTER_URL
      return 0
    fi
    sleep 0.1
  done
  sk_log "the Redis Cluster did not reach cluster_state:ok"
  return 1
}

sk_stop_redis_cluster() {
  local port
  for port in $SK_CLUSTER_PORTS; do
    redis-cli -p "$port" SHUTDOWN NOSAVE >/dev/null 2>&1 || true
  done
  [ -n "$SK_CLUSTER_PORTS" ] && sk_log "stopped the private Redis Cluster"
  SK_CLUSTER_PORTS=""
}

# Installs PgBouncer when it is missing and this is a root shell with apt-get; otherwise says how.
sk_pgbouncer_up() {
  if command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ]; then
    return 0
  fi
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    sk_log "installing pgbouncer (Debian's package) for the PgBouncer pass"
    if DEBIAN_FRONTEND=noninteractive apt-get install -y -q pgbouncer >/dev/null 2>&1 \
      || { apt-get update -q >/dev/null 2>&1 \
        && DEBIAN_FRONTEND=noninteractive apt-get install -y -q pgbouncer >/dev/null 2>&1; }; then
      return 0
    fi
  fi
  sk_log "pgbouncer is not installed: install it, e.g. 'sudo apt-get install pgbouncer'"
  sk_log "(Debian/Ubuntu) or 'brew install pgbouncer' (macOS)."
  return 1
}

# Starts a private PgBouncer in transaction pooling mode in front of DATABASE_URL's server, for
# every database on it, and exports SK_PGBOUNCER_URL (DATABASE_URL with its host and port).
sk_start_pgbouncer() {
  local bin port hostport pg_host pg_port user
  sk_pgbouncer_up || return 1
  bin=$(command -v pgbouncer || echo /usr/sbin/pgbouncer)
  hostport=${DATABASE_URL#*://}
  hostport=${hostport#*@}
  hostport=${hostport%%/*}
  pg_host=${hostport%%:*}
  pg_port=${hostport##*:}
  [ "$pg_port" = "$hostport" ] && pg_port=5432
  # The user (and password) PgBouncer logs in to Postgres with are the URL's.
  local userinfo="" password=""
  case "${DATABASE_URL#*://}" in *@*) userinfo=${DATABASE_URL#*://}; userinfo=${userinfo%%@*} ;; esac
  user=${userinfo%%:*}
  [ "$userinfo" != "$user" ] && password=${userinfo#*:}
  [ -z "$user" ] && user=${PGUSER:-$(id -un)}
  sk_tmpdir
  # The port is free when picked and taken when PgBouncer binds it; another process can take
  # it in between, so a start that fails is tried again on another port.
  local attempt
  for attempt in 1 2 3; do
    sk_pgbouncer_attempt && return 0
    sk_stop_pgbouncer >/dev/null 2>&1
    sk_log "PgBouncer start $attempt of 3 failed; trying another port"
  done
  return 1
}

# One start of PgBouncer on a newly picked free port (uses sk_start_pgbouncer's locals).
sk_pgbouncer_attempt() {
  port=$(sk_free_port) || { sk_log "no free port for PgBouncer"; return 1; }
  SK_PGBOUNCER_DIR="$SK_TMP/pgbouncer"
  mkdir -p "$SK_PGBOUNCER_DIR"
  rm -f "$SK_PGBOUNCER_DIR/pgbouncer.log" "$SK_PGBOUNCER_DIR/pgbouncer.pid"
  printf '"%s" "%s"\n' "$user" "$password" >"$SK_PGBOUNCER_DIR/users.txt"
  # Small server pools per database: the suite's databases share one server's connections.
  cat >"$SK_PGBOUNCER_DIR/pgbouncer.ini" <<INI
[databases]
* = host=$pg_host port=$pg_port

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir =
auth_type = trust
auth_file = $SK_PGBOUNCER_DIR/users.txt
pool_mode = transaction
max_client_conn = 4000
default_pool_size = 4
server_idle_timeout = 5
logfile = $SK_PGBOUNCER_DIR/pgbouncer.log
pidfile = $SK_PGBOUNCER_DIR/pgbouncer.pid
INI
  chmod 600 "$SK_PGBOUNCER_DIR/users.txt"
  local started=0
  if [ "$(id -u)" = "0" ]; then
    # PgBouncer refuses to run as root.
    local owner=nobody
    id postgres >/dev/null 2>&1 && owner=postgres
    chown -R "$owner" "$SK_PGBOUNCER_DIR"
    runuser -u "$owner" -- "$bin" -d "$SK_PGBOUNCER_DIR/pgbouncer.ini" >/dev/null 2>&1 && started=1
  else
    "$bin" -d "$SK_PGBOUNCER_DIR/pgbouncer.ini" >/dev/null 2>&1 && started=1
  fi
  if [ "$started" -ne 1 ]; then
    sk_log "PgBouncer did not start:"
    cat "$SK_PGBOUNCER_DIR/pgbouncer.log" >&2
    return 1
  fi
  local pid
  for _ in $(seq 1 100); do
    # Listening, and by PgBouncer: one that lost the port to another process exits.
    pid=$(cat "$SK_PGBOUNCER_DIR/pgbouncer.pid" 2>/dev/null)
    if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then
      break
    fi
    if [ -n "$pid" ] && sk_tcp_open 127.0.0.1 "$port" && sleep 0.2 && kill -0 "$pid" 2>/dev/null; then
      SK_PGBOUNCER_URL="postgres://$userinfo@127.0.0.1:$port/${DATABASE_URL##*/}"
      [ -z "$userinfo" ] && SK_PGBOUNCER_URL="postgres://$user@127.0.0.1:$port/${DATABASE_URL##*/}"
      export SK_PGBOUNCER_URL
      sk_log "started a private PgBouncer (transaction mode) on 127.0.0.1:$port"
      return 0
    fi
    sleep 0.1
  done
  sk_log "PgBouncer did not listen on 127.0.0.1:$port:"
  cat "$SK_PGBOUNCER_DIR/pgbouncer.log" >&2
  return 1
}

sk_stop_pgbouncer() {
  if [ -n "$SK_PGBOUNCER_DIR" ] && [ -f "$SK_PGBOUNCER_DIR/pgbouncer.pid" ]; then
    local pid
    pid=$(cat "$SK_PGBOUNCER_DIR/pgbouncer.pid")
    kill "$pid" 2>/dev/null || true
    # Gone only once its server connections are closed (the sweep then drops freely).
    for _ in $(seq 1 50); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    sk_log "stopped the private PgBouncer"
  fi
  SK_PGBOUNCER_DIR=""
}

# Drops the test databases sqlx's test support recorded in DATABASE_URL's database since $1 (a
# timestamp taken before the pass) and could not drop itself: through PgBouncer a database is
# still in use for a few seconds after its test. Run after PgBouncer stopped; a plain DROP, so a
# database someone else is using stays.
sk_sweep_test_databases() {
  local since=$1 names name dropped=0
  command -v psql >/dev/null 2>&1 || return 0
  names=$(psql "$DATABASE_URL" -Atqc \
    "SELECT db_name FROM _sqlx_test.databases WHERE created_at >= '$since'" 2>/dev/null) || return 0
  for name in $names; do
    if psql "$DATABASE_URL" -qc "DROP DATABASE IF EXISTS \"$name\"" >/dev/null 2>&1; then
      psql "$DATABASE_URL" -qc "DELETE FROM _sqlx_test.databases WHERE db_name = '$name'" >/dev/null 2>&1
      dropped=$((dropped + 1))
    fi
  done
  [ "$dropped" -gt 0 ] && sk_log "dropped $dropped test databases the PgBouncer pass left"
  return 0
}

sk_services_up() {
  local candidate
  if [ -n "${DATABASE_URL:-}" ] && sk_pg_reachable "$DATABASE_URL"; then
    sk_log "using Postgres from DATABASE_URL"
    SK_PG_SOURCE=env
  else
    [ -n "${DATABASE_URL:-}" ] && sk_log "DATABASE_URL is set but not reachable; looking elsewhere"
    unset DATABASE_URL
    for candidate in ${SHARDKEEP_LOCAL_PG_URLS:-postgres://postgres@127.0.0.1:5432/postgres postgres://postgres@127.0.0.1:5432/test}; do
      if sk_pg_reachable "$candidate"; then
        export DATABASE_URL=$candidate
        SK_PG_SOURCE=local
        sk_log "using the local Postgres at $candidate"
        break
      fi
    done
    if [ -z "${DATABASE_URL:-}" ]; then
      sk_start_postgres || return 1
      SK_PG_SOURCE=private
    fi
  fi
  if [ -n "${REDIS_URL:-}" ] && sk_redis_reachable "$REDIS_URL"; then
    sk_log "using Redis from REDIS_URL"
    return 0
  fi
  for candidate in ${SHARDKEEP_LOCAL_REDIS_URLS:-redis://127.0.0.1:6379}; do
    if sk_redis_reachable "$candidate"; then
      export REDIS_URL=$candidate
      sk_log "using the local Redis at $REDIS_URL"
      return 0
    fi
  done
  sk_start_redis || return 1
}

# What a test run may create and must remove: Redis keys of test, simulator and benchmark
# namespaces (plain, and hash-tagged as `{ns:…}`), and Postgres databases of sqlx tests,
# simulations and benchmarks.
SK_TEST_KEY_PATTERNS=("t-*" "sim-*" "bq-*" "bench_*" "bench-*"
  "{t-*" "{sim-*" "{bq-*" "{bench_*" "{bench-*")
SK_TEST_DB_PATTERN="^(_sqlx_test_|shardkeep_sim_|bench_)"

# Every key of a test namespace on REDIS_URL and on every node of the private cluster, sorted;
# fails when a server cannot be scanned.
sk_test_keys() {
  local pattern port
  command -v redis-cli >/dev/null 2>&1 || return 0
  for pattern in "${SK_TEST_KEY_PATTERNS[@]}"; do
    redis-cli -u "$REDIS_URL" --scan --pattern "$pattern" || return 1
    for port in $SK_CLUSTER_PORTS; do
      redis-cli -p "$port" --scan --pattern "$pattern" || return 1
    done
  done | LC_ALL=C sort -u
}

# Every test, simulation and benchmark database on DATABASE_URL's server, sorted; fails when
# the server cannot be asked.
sk_test_databases() {
  local names
  command -v psql >/dev/null 2>&1 || return 0
  names=$(psql "$DATABASE_URL" -Atqc "SELECT datname FROM pg_database") || return 1
  printf '%s\n' "$names" | { grep -E "$SK_TEST_DB_PATTERN" || true; } | LC_ALL=C sort
}

# Notes what test keys and databases exist before the run (left by an earlier one, or by an
# operator's own simulation), so the checks judge only what this run left.
sk_note_leftovers() {
  sk_tmpdir
  sk_test_keys >"$SK_TMP/keys-before" || sk_log "could not list Redis keys before the run"
  sk_test_databases >"$SK_TMP/databases-before" || sk_log "could not list databases before the run"
}

# Fails, naming a few, when the pass just run (`$1`) left keys of a test namespace or test
# databases behind, or when they cannot be listed. sqlx names a test's database after the
# test, so each pass is checked before the next one could reuse the names.
sk_check_leftovers() {
  local pass=$1 keys dbs
  if ! keys=$(sk_test_keys); then
    sk_log "$pass: cannot scan Redis for keys left by tests"
    return 1
  fi
  if ! dbs=$(sk_test_databases); then
    sk_log "$pass: cannot list Postgres databases left by tests"
    return 1
  fi
  keys=$(printf '%s\n' "$keys" | LC_ALL=C comm -13 "$SK_TMP/keys-before" - | sed '/^$/d')
  dbs=$(printf '%s\n' "$dbs" | LC_ALL=C comm -13 "$SK_TMP/databases-before" - | sed '/^$/d')
  if [ -z "$keys" ] && [ -z "$dbs" ]; then
    sk_log "$pass: no test keys and no test databases left"
    return 0
  fi
  if [ -n "$keys" ]; then
    sk_log "$pass left $(printf '%s\n' "$keys" | wc -l) keys of test namespaces in Redis, e.g.:"
    printf '%s\n' "$keys" | head -n 5 >&2
  fi
  if [ -n "$dbs" ]; then
    sk_log "$pass left $(printf '%s\n' "$dbs" | wc -l) test databases in Postgres, e.g.:"
    printf '%s\n' "$dbs" | head -n 5 >&2
  fi
  return 1
}

sk_services_down() {
  sk_stop_pgbouncer
  sk_stop_redis_cluster
  if [ -n "$SK_PG_DIR" ] && [ -d "$SK_PG_DIR/data" ]; then
    sk_as_pg_user "$SK_PG_BINDIR/pg_ctl" -D "$SK_PG_DIR/data" -m fast -w stop >/dev/null 2>&1 || true
    sk_log "stopped the private Postgres"
  fi
  if [ -n "$SK_REDIS_PORT" ]; then
    if command -v redis-cli >/dev/null 2>&1; then
      redis-cli -p "$SK_REDIS_PORT" SHUTDOWN NOSAVE >/dev/null 2>&1 || true
    elif [ -f "$SK_TMP/redis.pid" ]; then
      kill "$(cat "$SK_TMP/redis.pid")" 2>/dev/null || true
    fi
    sk_log "stopped the private Redis"
  fi
  if [ -n "$SK_TMP" ]; then
    rm -rf "$SK_TMP"
  fi
}

# The console test drives Debian's chromium through chromium-driver. Installs them when missing
# and this is a root shell with apt-get; otherwise says how.
sk_browser_up() {
  if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
    return 0
  fi
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    sk_log "installing chromium and chromium-driver for the console test"
    if DEBIAN_FRONTEND=noninteractive apt-get install -y chromium chromium-driver >/dev/null 2>&1 \
      || { apt-get update >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium chromium-driver >/dev/null 2>&1; }; then
      return 0
    fi
  fi
  sk_log "the console test needs a headless Chromium and its WebDriver:"
  sk_log "install them, e.g. 'sudo apt-get install chromium chromium-driver' (Debian/Ubuntu)."
  return 1
}

# The alerting rules (deploy/prometheus) are checked and unit-tested with promtool, which Debian
# ships in its prometheus package. Installs it when missing and this is a root shell with
# apt-get; otherwise says how.
sk_promtool_up() {
  if command -v promtool >/dev/null 2>&1; then
    return 0
  fi
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    sk_log "installing prometheus (for promtool) to check the alerting rules"
    if DEBIAN_FRONTEND=noninteractive apt-get install -y prometheus >/dev/null 2>&1 \
      || { apt-get update >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y prometheus >/dev/null 2>&1; }; then
      command -v promtool >/dev/null 2>&1 && return 0
    fi
  fi
  sk_log "checking the alerting rules needs promtool:"
  sk_log "install it, e.g. 'sudo apt-get install prometheus' (Debian/Ubuntu) or 'brew install prometheus' (macOS)."
  return 1
}

# The OpenAPI document is validated with openapi-spec-validator (python3 -m openapi_spec_validator
# FILE; it detects OpenAPI 2.0, 3.0 and 3.1). Installs it with pip when missing; otherwise says how.
sk_openapi_validator_up() {
  if ! command -v python3 >/dev/null 2>&1; then
    sk_log "validating the OpenAPI document needs python3 with openapi-spec-validator:"
    sk_log "install python3 and pip, then 'python3 -m pip install openapi-spec-validator'."
    return 1
  fi
  if python3 -c 'import openapi_spec_validator' >/dev/null 2>&1; then
    return 0
  fi
  sk_log "installing openapi-spec-validator to validate the OpenAPI document"
  if python3 -m pip install --quiet openapi-spec-validator >/dev/null 2>&1 \
    && python3 -c 'import openapi_spec_validator' >/dev/null 2>&1; then
    return 0
  fi
  sk_log "validating the OpenAPI document needs openapi-spec-validator for $(command -v python3):"
  sk_log "install it, e.g. 'python3 -m pip install openapi-spec-validator' (inside a virtualenv where"
  sk_log "the system Python refuses pip installs)."
  return 1
}
