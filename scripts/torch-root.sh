#!/usr/bin/env bash
# torch-root.sh: the Debian 13 (trixie) root with PyTorch 2.6 that the
# PyTorch tests run in (Debian 12 has only torch 1.13). Made once with
# mmdebstrap at a fixed path outside the clone and reused; made again when
# it is missing or broken (no python3 there, or `import torch` fails).
#
#   scripts/torch-root.sh ensure        make the root if needed; prints its path
#   scripts/torch-root.sh check         exit 0 when the root is there and imports torch
#   scripts/torch-root.sh path          prints the path
#   scripts/torch-root.sh run CMD ARGS  runs CMD inside the root, from the same
#                                       working directory
#
# `run` enters a private mount namespace (unshare --mount: nothing shows
# outside it), mounts /proc, /dev (with /dev/shm, where the trace rings of
# pprun's launcher live), /sys and /tmp of this machine into the root, and
# the directories CMD works in at the same paths: this checkout, the
# working directory and each of PPRUN_TORCH_BINDS (colon-separated); then
# chroots and execs CMD in the same process, so its pid, its signals, its
# environment and the fds it inherited (PPRUN_TRACE_FD) are the caller's.
# The network is this machine's (rendezvous and gloo over loopback).
#
# Needs root (mount namespaces, chroot); making the root needs mmdebstrap
# and the network (about 2 minutes, 1.2 GB). Every failure names its cause.
# PPRUN_TORCH_SUITE names the Debian suite (default trixie: torch 2.6; forky
# or sid have a later torch) and PPRUN_TORCH_ROOT the path (default
# /var/cache/pprun/torch-SUITE).
set -euo pipefail

suite=${PPRUN_TORCH_SUITE:-trixie}
case "$suite" in
*[!a-z-]* | "") echo "torch-root: PPRUN_TORCH_SUITE '$suite' is not a Debian suite name" >&2; exit 2 ;;
esac
root=${PPRUN_TORCH_ROOT:-/var/cache/pprun/torch-$suite}
checkout=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

die() {
    echo "torch-root: $*" >&2
    exit 1
}

need_root() {
    [ "$(id -u)" -eq 0 ] || die "$1 needs root (mount namespaces and chroot); run it as root"
}

# Runs "$@" inside the root; the caller's process becomes it (exec).
run_inside() {
    need_root "running a command in $root"
    [ -x "$root/usr/bin/python3" ] ||
        die "no PyTorch root at $root (no usr/bin/python3 there): make it with scripts/torch-root.sh ensure"
    local binds=("$checkout" "$PWD") extra
    if [ -n "${PPRUN_TORCH_BINDS:-}" ]; then
        IFS=: read -r -a extra <<<"$PPRUN_TORCH_BINDS"
        binds+=("${extra[@]}")
    fi
    # The script below runs in the new namespace: argv[1] the root, then
    # the directories to bind, "--", the command.
    local script='
        set -e
        root=$1; shift
        mount --make-rprivate /
        mount -t proc proc "$root/proc"
        mount --rbind /dev "$root/dev"
        mount --rbind /sys "$root/sys"
        mount --bind /tmp "$root/tmp"
        while [ "$1" != -- ]; do
            case "$1" in
            /proc|/proc/*|/dev|/dev/*|/sys|/sys/*|/tmp|/tmp/*|/) ;;
            *) mkdir -p "$root$1"; mount --rbind "$1" "$root$1" ;;
            esac
            shift
        done
        shift
        exec chroot "$root" /bin/sh -c "cd \"\$0\" && exec \"\$@\"" "$PWD" "$@"'
    exec unshare --mount /bin/sh -c "$script" torch-root "$root" "${binds[@]}" -- "$@"
}

# 0 when the root is there and python3 in it imports torch.
check() {
    [ -x "$root/usr/bin/python3" ] || return 1
    (run_inside python3 -c 'import torch, torch.distributed.pipelining') >/dev/null 2>&1
}

make_root() {
    need_root "making $root"
    command -v mmdebstrap >/dev/null || die "cannot make $root: mmdebstrap is not installed (apt-get install mmdebstrap)"
    mkdir -p "$(dirname "$root")" || die "cannot make $root: cannot create $(dirname "$root")"
    local tmp="$root.new"
    rm -rf "$tmp" "$root.old"
    echo "torch-root: making $root with mmdebstrap (Debian $suite, python3-torch; about 2 minutes, 1.2 GB)" >&2
    # A testing suite's Release file (forky) is valid a week (Valid-Until);
    # a mirror that serves a frozen snapshot of it is refused as expired
    # once that passes. The packages are still checked against the signed
    # Release; only its age is not (stable's, trixie's, has no such date).
    if ! mmdebstrap --variant=apt --aptopt='Acquire::Check-Valid-Until "false"' --include=python3-torch \
        "$suite" "$tmp" >"$tmp.log" 2>&1; then
        tail -20 "$tmp.log" >&2
        rm -rf "$tmp"
        die "cannot make $root: mmdebstrap failed (its log: $tmp.log; it needs deb.debian.org over the network)"
    fi
    # Swapped in whole: a build cut short never looks like a root.
    [ -e "$root" ] && mv "$root" "$root.old"
    mv "$tmp" "$root"
    rm -rf "$root.old" "$tmp.log"
}

ensure() {
    # One maker at a time: tests started together wait for the first.
    mkdir -p "$(dirname "$root")" 2>/dev/null || die "cannot make $root: cannot create $(dirname "$root")"
    exec 9>"$root.lock" || die "cannot lock $root.lock"
    flock 9
    if ! check; then
        [ -e "$root" ] && echo "torch-root: $root is broken (python3 there cannot import torch); making it again" >&2
        make_root
        check || die "made $root, but python3 there cannot import torch.distributed.pipelining"
    fi
    echo "$root"
}

case "${1:-}" in
ensure) ensure ;;
check) check ;;
path) echo "$root" ;;
run)
    shift
    [ $# -gt 0 ] || die "run: no command"
    run_inside "$@"
    ;;
*)
    echo "usage: scripts/torch-root.sh ensure | check | path | run CMD [ARGS...]" >&2
    exit 2
    ;;
esac
