#!/usr/bin/env bash
# install-deps.sh: installs the Debian packages pprun needs to build, run and
# test. Works as root or through sudo; does nothing when all are present.
set -euo pipefail

packages=(build-essential cmake pkg-config libmicrohttpd-dev libsqlite3-dev libcjson-dev
          libcriterion-dev libopenblas-dev sqlite3)
# The browser tests drive Debian's chromium with playwright-core from npm.
if [ "${PPRUN_NO_BROWSER:-0}" != 1 ]; then
  packages+=(chromium nodejs npm)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all packages present"
  exit 0
fi

if [ "$(id -u)" -eq 0 ]; then
  as_root=()
elif command -v sudo >/dev/null; then
  as_root=(sudo)
else
  echo "install-deps: need root or sudo to install: ${missing[*]}" >&2
  exit 1
fi
echo "install-deps: installing ${missing[*]}"
"${as_root[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${as_root[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
