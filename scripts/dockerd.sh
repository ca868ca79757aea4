#!/usr/bin/env bash
# A private Docker daemon for agentrl's sandboxes, started without systemd.
#
#   scripts/dockerd.sh start    # install docker.io if needed, start dockerd, wait until it answers
#   scripts/dockerd.sh stop     # stop it (by its pidfile) and wait until it has exited
#   scripts/dockerd.sh status   # exit 0 when it answers, 1 otherwise
#
# Everything lives under ${AGENTRL_DOCKER_DIR:-/var/lib/agentrl-docker}: data-root, exec-root,
# pidfile, log and the API socket (unix://$AGENTRL_DOCKER_DIR/docker.sock). The daemon has no
# bridge network and touches no iptables rules: sandboxes run with network "none".
# `start` and `status` print the line to export, e.g.  DOCKER_HOST=unix:///var/lib/agentrl-docker/docker.sock
set -euo pipefail

DIR="${AGENTRL_DOCKER_DIR:-/var/lib/agentrl-docker}"
SOCK="$DIR/docker.sock"
HOST="unix://$SOCK"
PIDFILE="$DIR/dockerd.pid"
LOG="$DIR/dockerd.log"
WAIT_S="${AGENTRL_DOCKERD_WAIT_S:-30}"

log() { echo "dockerd.sh: $*" >&2; }

as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo -n "$@"; else
        log "need root for: $*"; return 1; fi
}

daemon_pid() {
    # The pid in the pidfile when that process is alive and is a dockerd; else nothing.
    [ -s "$PIDFILE" ] || return 1
    local pid
    pid="$(cat "$PIDFILE" 2>/dev/null || true)"
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    kill -0 "$pid" 2>/dev/null || return 1
    grep -qa dockerd "/proc/$pid/cmdline" 2>/dev/null || return 1
    echo "$pid"
}

answers() { timeout 10 docker -H "$HOST" info >/dev/null 2>&1; }

ensure_installed() {
    if command -v dockerd >/dev/null && command -v docker >/dev/null; then return 0; fi
    log "dockerd not found: installing docker.io with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    as_root apt-get update -q >/dev/null
    as_root apt-get install -y -q --no-install-recommends docker.io >/dev/null
    command -v dockerd >/dev/null || { log "docker.io installed but dockerd is still missing"; exit 1; }
}

print_host() { echo "DOCKER_HOST=$HOST"; }

start() {
    ensure_installed
    mkdir -p "$DIR/data" "$DIR/exec"
    if pid="$(daemon_pid)"; then
        if answers; then
            log "already running (pid $pid)"
            print_host
            return 0
        fi
        log "dockerd (pid $pid) is up but does not answer yet; waiting"
    else
        rm -f "$PIDFILE" "$SOCK"
        log "starting dockerd (log: $LOG)"
        # setsid + nohup: the daemon outlives this shell and its terminal.
        setsid nohup dockerd \
            --storage-driver=overlay2 \
            --iptables=false --ip6tables=false --bridge=none \
            --data-root="$DIR/data" --exec-root="$DIR/exec" \
            --pidfile="$PIDFILE" -H "$HOST" \
            >>"$LOG" 2>&1 </dev/null &
        local child=$!
    fi
    local deadline=$((SECONDS + WAIT_S))
    while [ "$SECONDS" -lt "$deadline" ]; do
        if answers; then
            log "dockerd is up"
            print_host
            return 0
        fi
        if [ -n "${child:-}" ] && ! kill -0 "$child" 2>/dev/null; then
            log "dockerd exited during start-up"
            break
        fi
        sleep 0.5
    done
    log "dockerd did not answer within ${WAIT_S}s; last lines of $LOG:"
    tail -n 40 "$LOG" >&2 || true
    exit 1
}

stop() {
    local pid
    if ! pid="$(daemon_pid)"; then
        log "not running"
        rm -f "$PIDFILE"
        return 0
    fi
    log "stopping dockerd (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    # dockerd stops its containers first (up to their stop timeout), so allow some time.
    for _ in $(seq 1 60); do
        kill -0 "$pid" 2>/dev/null || { rm -f "$PIDFILE"; log "stopped"; return 0; }
        sleep 0.5
    done
    log "dockerd ignored SIGTERM for 30 s: sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    for _ in $(seq 1 20); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.25
    done
    rm -f "$PIDFILE"
}

status() {
    local pid
    if pid="$(daemon_pid)" && answers; then
        log "running (pid $pid)"
        print_host
        return 0
    fi
    log "not running"
    return 1
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) status ;;
    restart) stop; start ;;
    *) echo "usage: $0 start|stop|status|restart" >&2; exit 2 ;;
esac
