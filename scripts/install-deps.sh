#!/bin/sh
# Installs the Debian packages Sparrow builds against, if any are missing.
# --fuzz: also clang and its runtime libraries (libFuzzer, the sanitizers),
# which `make fuzz` needs; .ci/run asks for them.
# Needs root (or sudo) only when something is missing.
set -eu
pkgs="build-essential libpcre2-dev libcjson-dev libzstd-dev libssl-dev libsimde-dev libedit-dev libmicrohttpd-dev"
[ "${1:-}" = "--fuzz" ] && pkgs="$pkgs clang libclang-rt-dev"
need=""
for p in $pkgs; do
    dpkg -s "$p" >/dev/null 2>&1 || need="$need $p"
done
[ -z "$need" ] && exit 0
echo "install-deps: installing$need"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $need
