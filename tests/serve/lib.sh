# lib.sh -- sourced by the server's tests and benches: start a server in the
# background on an ephemeral loopback port and stop it.
#   serve_start LOG CMD ARGS...   runs CMD ARGS... --port 0 (CMD prints
#                                 "listening on http://HOST:PORT"); sets
#                                 serve_pid and serve_url, or returns 1
#   serve_stop                    SIGTERM, then (after 10 s) SIGKILL; sets serve_rc
serve_start() {
    _log=$1; shift
    : >"$_log" # exists before the loop reads it (the background redirect may come later)
    "$@" >"$_log" 2>&1 &
    serve_pid=$!
    serve_url=
    _i=0
    while [ $_i -lt 600 ]; do # 60 s at most (a 7B model loads in seconds)
        serve_url=$(sed -n 's/.*listening on \(http:\/\/[^ ]*\).*/\1/p' "$_log" | head -n 1)
        [ -n "$serve_url" ] && return 0
        kill -0 "$serve_pid" 2>/dev/null || break
        sleep 0.1
        _i=$((_i + 1))
    done
    return 1
}

serve_stop() {
    serve_rc=0
    [ -n "${serve_pid:-}" ] || return 0
    kill -TERM "$serve_pid" 2>/dev/null
    _i=0
    while kill -0 "$serve_pid" 2>/dev/null && [ $_i -lt 100 ]; do sleep 0.1; _i=$((_i + 1)); done
    kill -0 "$serve_pid" 2>/dev/null && kill -KILL "$serve_pid"
    wait "$serve_pid" 2>/dev/null
    serve_rc=$?
    serve_pid=
}

# The official openai package (4.x, pinned) into DIR, once: returns 1 if npm
# cannot reach the registry.
OPENAI_VERSION=4.95.0
openai_install() {
    _dir=$1
    if [ -f "$_dir/node_modules/openai/package.json" ] &&
        grep -q "\"version\": \"$OPENAI_VERSION\"" "$_dir/node_modules/openai/package.json"; then
        return 0
    fi
    mkdir -p "$_dir"
    timeout 300 npm install --prefix "$_dir" --no-audit --no-fund --loglevel=error "openai@$OPENAI_VERSION" >"$_dir/npm.log" 2>&1
}
