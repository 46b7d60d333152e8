#!/usr/bin/env bash
# N `folio serve` replicas on loopback behind an existing router: the SGLang model
# gateway (PyPI `smg`, pinned below, installed into target/smg-venv on first use) or
# nginx hashing each conversation's first user turn (Debian's `nginx`), or none (the
# replicas alone, asked directly: a benchmark's baseline). Every process runs in a process group of its own, its pid and log in the run directory.
#
#   scripts/cluster.sh up [--replicas N] [--router smg|nginx|none] [--policy POLICY]
#                         [--port PORT] [--threads T] [--hash-bytes B]
#                         [--sticky] [--router-arg ARG]... [-- SERVE_ARGS...]
#   scripts/cluster.sh status      # each replica's pid, port, /health; the router's view
#   scripts/cluster.sh kill I      # SIGKILL replica I (0-based), as a crash would
#   scripts/cluster.sh restart I   # stop replica I if it runs, start it on its port again
#   scripts/cluster.sh down        # stop the router and every replica (TERM, then KILL)
#   scripts/cluster.sh install-smg # make target/smg-venv; prints smg's path
#
# Defaults: 2 replicas, router smg, policy cache_aware (smg's others: round_robin,
# power_of_two, consistent_hashing, prefix_hash, ...), router port 8080, one forward
# thread per replica, model name `folio` on every replica (smg needs `model` in each
# request). --sticky keeps each chat conversation on one replica (STICKY_ARGS below;
# clients name the conversation in X-SMG-Routing-Key). --router-arg passes one more
# argument to smg, as in `--router-arg --cache-threshold --router-arg 0.6`. Environment: FOLIO_CLUSTER_DIR
# (run directory: pids, ports, logs; default target/cluster), FOLIO_BIN (default
# target/release/folio, built if missing), FOLIO_MODEL, FOLIO_SMG_VENV (default
# target/smg-venv), SMG_LOG_LEVEL (warn).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
SMG_VERSION=1.13.0
# `up --sticky`: smg as docs/cluster.md advises for chat. A conversation named in the
# X-SMG-Routing-Key header stays on the replica its first turn went to, a new one goes
# to the replica with the fewest requests in flight, and a burst of waiting turns on a
# replica does not take it out of routing (smg's default veto is 8).
STICKY_ARGS="--sticky-sessions --assignment-mode min_load --worker-overload-waiting-requests 32"
dir=${FOLIO_CLUSTER_DIR:-$root/target/cluster}
bin=${FOLIO_BIN:-$root/target/release/folio}
venv=${FOLIO_SMG_VENV:-$root/target/smg-venv}
dir=$(realpath -m "$dir")
bin=$(realpath -m "$bin")
cd "$root" # the binary's default model path is relative to the repository

die() { echo "cluster.sh: $*" >&2; exit 1; }

# A process that runs (a zombie does not count).
alive() {
    local pid=$1 state
    [ -n "$pid" ] && [ -r "/proc/$pid/stat" ] || return 1
    state=$(sed 's/^.*) //' "/proc/$pid/stat" | cut -d' ' -f1)
    [ "$state" != Z ] && [ "$state" != X ]
}

# TERM to the process group of the pid in FILE, KILL after SECS; removes FILE.
stop_group() {
    local file=$1 secs=${2:-10} pid i
    [ -f "$file" ] || return 0
    pid=$(cat "$file")
    if alive "$pid"; then
        kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
        for ((i = 0; i < secs * 10; i++)); do
            alive "$pid" || break
            sleep 0.1
        done
        if alive "$pid"; then
            kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
            for ((i = 0; i < 50; i++)); do alive "$pid" || break; sleep 0.1; done
        fi
    fi
    rm -f "$file"
}

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# 0 when GET URL answers 200.
ok200() {
    [ "$(curl -s -o /dev/null -m 3 -w '%{http_code}' "$1" 2>/dev/null)" = 200 ]
}

install_smg() {
    local shown
    shown=$("$venv/bin/pip" show smg 2>/dev/null || true)
    if [ ! -x "$venv/bin/smg" ] || ! grep -q "^Version: $SMG_VERSION$" <<<"$shown"; then
        echo "installing smg==$SMG_VERSION into $venv" >&2
        python3 -m venv "$venv" >&2
        "$venv/bin/pip" install --quiet --disable-pip-version-check "smg==$SMG_VERSION" >&2
    fi
    echo "$venv/bin/smg"
}

# Starts replica I on the port in replica-I.port (0 the first time: the ready line
# says which it got), waits for /health.
start_replica() {
    local i=$1
    local port=0 log="$dir/replica-$i.log" from pid line
    [ -f "$dir/replica-$i.port" ] && port=$(cat "$dir/replica-$i.port")
    echo "=== start $(date -u +%FT%TZ) port $port" >>"$log"
    from=$(($(stat -c %s "$log") + 1))
    # shellcheck disable=SC2086
    setsid "$bin" serve --host 127.0.0.1 --port "$port" --threads "$THREADS" \
        --model-name folio $SERVE_ARGS </dev/null >>"$log" 2>&1 &
    pid=$!
    echo "$pid" >"$dir/replica-$i.pid"
    for ((t = 0; t < 1200; t++)); do
        alive "$pid" || die "replica $i exited at start-up: see $log"
        line=$(tail -c +"$from" "$log" | grep -m1 -o 'serving .* at http://127\.0\.0\.1:[0-9]*' || true)
        if [ -n "$line" ]; then
            port=${line##*:}
            echo "$port" >"$dir/replica-$i.port"
            if ok200 "http://127.0.0.1:$port/health"; then
                echo "replica $i: pid $pid, http://127.0.0.1:$port"
                return 0
            fi
        fi
        sleep 0.1
    done
    die "replica $i not ready after 120 s: see $log"
}

write_nginx_conf() {
    local conf="$dir/nginx/nginx.conf" i servers=""
    mkdir -p "$dir/nginx/tmp"
    for ((i = 0; i < REPLICAS; i++)); do
        servers+="        server 127.0.0.1:$(cat "$dir/replica-$i.port") max_fails=1 fail_timeout=2s;"$'\n'
    done
    # The hash key of a chat request is its body up to the end of the first user
    # message (model, system prompt, first user turn): the same on every turn of one
    # conversation, since turns are appended, so a conversation stays on the replica
    # that holds its prefix while different conversations spread. It needs "role"
    # before "content" in that message (as OpenAI's SDKs and json.dumps of a literal
    # write it) and the fields before `messages` fixed across turns. Other bodies
    # (completions) hash their first HASH_BYTES bytes.
    # (Written unexpanded: the regex's backslashes reach nginx as they stand.)
    cat >"$dir/nginx/prefix_map.conf" <<'MAP'
map $request_body $folio_prefix {
    '~(?s)^(?<head>.*?"role"\s*:\s*"user"\s*,\s*"content"\s*:\s*"(?:[^"\\\\]|\\\\.)*")' $head;
    'HEAD_RULE' $head;
    default $request_body;
}
MAP
    sed -i "s|'HEAD_RULE'|'~(?s)^(?<head>.{1,$HASH_BYTES})'|" "$dir/nginx/prefix_map.conf"
    cat >"$conf" <<EOF
daemon off;
worker_processes 1;
pid $dir/nginx/nginx.pid;
error_log stderr warn;
events { worker_connections 1024; }
http {
    log_format upstream '\$time_iso8601 \$status \$upstream_addr \$upstream_status \$request_time';
    access_log $dir/nginx/access.log upstream;
    client_body_temp_path $dir/nginx/tmp/body;
    proxy_temp_path $dir/nginx/tmp/proxy;
    fastcgi_temp_path $dir/nginx/tmp/fastcgi;
    uwsgi_temp_path $dir/nginx/tmp/uwsgi;
    scgi_temp_path $dir/nginx/tmp/scgi;
    client_max_body_size 4m;
    client_body_buffer_size 4m;
    client_body_in_single_buffer on;
    include $dir/nginx/prefix_map.conf;
    upstream folio {
        hash \$folio_prefix consistent;
$servers        keepalive 32;
    }
    server {
        listen 127.0.0.1:$ROUTER_PORT;
        location / {
            proxy_pass http://folio;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host \$host;
            proxy_buffering off;
            proxy_read_timeout 600s;
            # A POST whose replica died before answering is sent to the next one (a
            # generation is safe to run twice); a stream already under way is not.
            proxy_next_upstream error timeout non_idempotent;
            proxy_next_upstream_tries 3;
        }
    }
}
EOF
    echo "$conf"
}

start_router() {
    local urls=() i pid log="$dir/router.log"
    [ "$ROUTER" = none ] && return 0
    for ((i = 0; i < REPLICAS; i++)); do
        urls+=("http://127.0.0.1:$(cat "$dir/replica-$i.port")")
    done
    case $ROUTER in
    smg)
        local smg
        smg=$(install_smg)
        # Health probes every second (2 failures: out; 1 success: back in); a
        # refused connection is retried on another worker; the circuit breaker
        # re-probes a worker 2 s after it opens, so a restarted replica rejoins in
        # seconds rather than smg's default minute.
        # shellcheck disable=SC2086
        NO_COLOR=1 setsid "$smg" launch --host 127.0.0.1 --port "$ROUTER_PORT" \
            --worker-urls "${urls[@]}" --policy "$POLICY" \
            --prometheus-host 127.0.0.1 --prometheus-port "$(free_port)" \
            --disable-tokenizer-autoload \
            --health-check-interval-secs 1 --health-check-timeout-secs 2 \
            --health-failure-threshold 2 --health-success-threshold 1 \
            --retry-max-retries 3 --retry-initial-backoff-ms 50 --retry-max-backoff-ms 500 \
            --cb-failure-threshold 3 --cb-success-threshold 1 --cb-timeout-duration-secs 2 \
            --shutdown-grace-period-secs 2 --log-level "${SMG_LOG_LEVEL:-warn}" \
            $ROUTER_ARGS \
            </dev/null >>"$log" 2>&1 &
        pid=$!
        ;;
    nginx)
        command -v nginx >/dev/null || die "nginx is missing: apt-get install nginx-light (or nginx)"
        local conf
        conf=$(write_nginx_conf)
        setsid nginx -c "$conf" -p "$dir/nginx" </dev/null >>"$log" 2>&1 &
        pid=$!
        ;;
    *) die "unknown router $ROUTER (smg, nginx or none)" ;;
    esac
    echo "$pid" >"$dir/router.pid"
    for ((t = 0; t < 600; t++)); do
        alive "$pid" || die "the router exited at start-up: see $log"
        if [ "$ROUTER" = smg ]; then
            # Ready when every replica is registered and healthy.
            if [ "$(curl -s -m 3 "http://127.0.0.1:$ROUTER_PORT/workers" 2>/dev/null |
                grep -o '"is_healthy":true' | wc -l)" -ge "$REPLICAS" ]; then
                break
            fi
        elif ok200 "http://127.0.0.1:$ROUTER_PORT/health"; then
            break
        fi
        sleep 0.1
    done
    ok200 "http://127.0.0.1:$ROUTER_PORT/v1/models" || die "the router is not ready after 60 s: see $log"
    echo "router $ROUTER ($([ "$ROUTER" = smg ] && echo "policy $POLICY" || echo "consistent hash of the first user turn")): pid $pid, http://127.0.0.1:$ROUTER_PORT"
}

load_config() {
    [ -f "$dir/cluster.env" ] || die "no cluster in $dir (run: scripts/cluster.sh up)"
    # shellcheck disable=SC1091
    . "$dir/cluster.env"
}

down() {
    [ -d "$dir" ] || return 0
    stop_group "$dir/router.pid" 10
    local f
    for f in "$dir"/replica-*.pid; do
        [ -e "$f" ] && stop_group "$f" 10
    done
    rm -f "$dir/cluster.env"
    echo "cluster in $dir stopped"
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case $cmd in
up)
    REPLICAS=2 ROUTER=smg POLICY=cache_aware ROUTER_PORT=8080 THREADS=1 HASH_BYTES=512
    SERVE_ARGS="" ROUTER_ARGS="" STICKY=0
    while [ $# -gt 0 ]; do
        case $1 in
        --replicas) REPLICAS=$2; shift 2 ;;
        --router) ROUTER=$2; shift 2 ;;
        --policy) POLICY=$2; shift 2 ;;
        --port) ROUTER_PORT=$2; shift 2 ;;
        --threads) THREADS=$2; shift 2 ;;
        --hash-bytes) HASH_BYTES=$2; shift 2 ;;
        --router-arg) ROUTER_ARGS+=" $2"; shift 2 ;;
        --sticky) STICKY=1; shift ;;
        --) shift; SERVE_ARGS="$*"; break ;;
        *) die "unknown option $1" ;;
        esac
    done
    if [ "$STICKY" = 1 ]; then
        [ "$ROUTER" = smg ] || die "--sticky is for --router smg"
        ROUTER_ARGS+=" $STICKY_ARGS"
    fi
    [ "$ROUTER_PORT" = 0 ] && ROUTER_PORT=$(free_port)
    [ -f "$dir/cluster.env" ] && die "a cluster runs in $dir already (scripts/cluster.sh down)"
    if [ ! -x "$bin" ]; then
        (cd "$root" && cargo build --release -p folio-cli)
    fi
    mkdir -p "$dir"
    rm -f "$dir"/replica-*.port "$dir"/replica-*.pid "$dir/router.pid"
    [ "$ROUTER" = smg ] && install_smg >/dev/null
    {
        echo "REPLICAS=$REPLICAS ROUTER=$ROUTER POLICY=$POLICY ROUTER_PORT=$ROUTER_PORT"
        echo "THREADS=$THREADS HASH_BYTES=$HASH_BYTES"
        printf 'SERVE_ARGS=%q\n' "$SERVE_ARGS"
        printf 'ROUTER_ARGS=%q\n' "$ROUTER_ARGS"
    } >"$dir/cluster.env"
    trap 'echo "start-up failed: stopping what started" >&2; down >&2' ERR
    for ((i = 0; i < REPLICAS; i++)); do start_replica "$i"; done
    start_router
    trap - ERR
    echo "run directory: $dir"
    ;;
down)
    down
    ;;
status)
    load_config
    for ((i = 0; i < REPLICAS; i++)); do
        pid=$(cat "$dir/replica-$i.pid" 2>/dev/null || true)
        port=$(cat "$dir/replica-$i.port")
        state=down
        alive "$pid" && state=running
        ok200 "http://127.0.0.1:$port/health" && state=healthy
        echo "replica $i: pid ${pid:-?} port $port $state"
    done
    [ "$ROUTER" = none ] && exit 0
    pid=$(cat "$dir/router.pid" 2>/dev/null || true)
    echo "router $ROUTER: pid ${pid:-?} port $ROUTER_PORT $(alive "$pid" && echo running || echo down)"
    if [ "$ROUTER" = smg ]; then
        curl -s -m 3 "http://127.0.0.1:$ROUTER_PORT/workers" | python3 -c '
import json, sys
for w in json.load(sys.stdin).get("workers", []):
    print("  smg sees", w["url"], "healthy=%s load=%s" % (w["is_healthy"], w.get("load")))' || true
    fi
    ;;
kill)
    load_config
    i=${1:?replica index}
    pid=$(cat "$dir/replica-$i.pid" 2>/dev/null) || die "no replica $i"
    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
    for ((t = 0; t < 50; t++)); do alive "$pid" || break; sleep 0.1; done
    echo "replica $i (pid $pid) killed"
    ;;
restart)
    load_config
    i=${1:?replica index}
    [ -f "$dir/replica-$i.port" ] || die "no replica $i"
    stop_group "$dir/replica-$i.pid" 10
    start_replica "$i"
    ;;
install-smg)
    install_smg
    ;;
*)
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
    exit 2
    ;;
esac
