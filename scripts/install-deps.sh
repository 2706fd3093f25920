#!/usr/bin/env bash
# install-deps.sh: installs the Debian packages pprun needs to build, run and
# test. Works as root or through sudo; does nothing when all are present.
set -euo pipefail

# python3: test_program runs examples/pipeline_demo.py, a traced Python program.
packages=(build-essential cmake pkg-config libmicrohttpd-dev libsqlite3-dev libcjson-dev
          libcriterion-dev libopenblas-dev sqlite3 python3)
# python3-dev: Python's headers, for pprun._op (python/pprun/_op.c), the
# package's per-op call without ctypes; without them it records through ctypes.
packages+=(python3-dev)
# procps: tests look for processes left behind (pgrep, ps); a minimal
# Debian root lacks it.
packages+=(procps)
# The fuzz build (scripts/test.sh fuzz, tests/fuzz/): clang and its libFuzzer.
packages+=(clang libclang-rt-14-dev)
# The PyTorch tests run torch 2.6 in a Debian trixie root made by
# mmdebstrap (scripts/torch-root.sh); PPRUN_NO_TORCH=1 leaves it out.
[ "${PPRUN_NO_TORCH:-0}" != 1 ] && packages+=(mmdebstrap)
# tests/test_slurm.c starts a Slurm cluster on this machine from Debian's
# daemons (scripts/slurm-local.sh); PPRUN_NO_SLURM=1 leaves them out.
[ "${PPRUN_NO_SLURM:-0}" != 1 ] && packages+=(munge slurmctld slurmd slurm-client)
# The browser tests drive Debian's chromium with playwright-core from npm.
if [ "${PPRUN_NO_BROWSER:-0}" != 1 ]; then
  packages+=(chromium)
  # NodeSource's nodejs ships npm and conflicts with Debian's npm package.
  command -v node >/dev/null || packages+=(nodejs)
  command -v npm >/dev/null || packages+=(npm)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# The browser tests' driver: playwright-core from the npm registry, pinned by
# tests/browser/package-lock.json (no browser download: Debian's chromium).
install_browser_driver() {
  [ "${PPRUN_NO_BROWSER:-0}" = 1 ] && return 0
  local here
  here="$(cd "$(dirname "$0")/.." && pwd)"
  # The pin (1.61: the last that runs on Debian 12's node 18; later ones
  # refuse it) against what node_modules holds: a checkout that had another
  # version installed gets the pinned one.
  local want have
  want="$(sed -n 's/.*"playwright-core": "\(.*\)".*/\1/p' "$here/tests/browser/package.json")"
  have="$(sed -n 's/^  "version": "\(.*\)".*/\1/p' "$here/tests/browser/node_modules/playwright-core/package.json" 2>/dev/null || true)"
  if [ "$have" != "$want" ]; then
    echo "install-deps: npm ci --prefix tests/browser (playwright-core $want)"
    if ! PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --prefix "$here/tests/browser" --no-audit --no-fund --loglevel=error \
         >/dev/null; then
      echo "install-deps: npm ci failed (above): the browser tests need playwright-core from the npm registry;" \
           "PPRUN_NO_BROWSER=1 scripts/install-deps.sh installs the rest without it" >&2
      exit 1
    fi
  fi
}

# The PyTorch root, made once at a fixed path outside the clone (about 2
# minutes and 1.2 GB the first time; reused after, made again when broken).
install_torch_root() {
  [ "${PPRUN_NO_TORCH:-0}" = 1 ] && return 0
  local here
  here="$(cd "$(dirname "$0")/.." && pwd)"
  local sudo=()
  [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null && sudo=(sudo)
  # sudo drops the environment: the root's suite and path go by name
  "${sudo[@]}" env PPRUN_TORCH_SUITE="${PPRUN_TORCH_SUITE:-}" PPRUN_TORCH_ROOT="${PPRUN_TORCH_ROOT:-}" \
    "$here/scripts/torch-root.sh" ensure >/dev/null
}

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all packages present"
  install_browser_driver
  install_torch_root
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
install_browser_driver
install_torch_root
echo "install-deps: done"
