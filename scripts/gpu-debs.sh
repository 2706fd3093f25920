#!/usr/bin/env bash
# gpu-debs.sh: carries pprun's build dependencies to a GPU machine that
# reaches no package registry (the device machine of docs/gpu.md).
#
#   scripts/gpu-debs.sh fetch DIR            here, with Debian's registry:
#       downloads the .deb files of the libraries pprun builds and links
#       against (and their Debian-12-only runtime libraries) into DIR.
#   eval "$(scripts/gpu-debs.sh unpack DIR PREFIX)"   on the GPU machine:
#       unpacks every DIR/*.deb under PREFIX (never into /), makes the
#       pkg-config files point into PREFIX, and prints the exports (PATH,
#       PKG_CONFIG_LIBDIR, LD_LIBRARY_PATH) that make CMake and the built
#       programs use PREFIX.
#
# The .pc files lose their Requires.private lines: those name the static
# dependencies (gnutls, libgit2, ...), which a dynamic link does not need
# and whose -dev packages would triple what has to travel.
set -euo pipefail

# What the build needs (-dev: headers, .so links, .pc), what the programs
# load at run time, and pkg-config itself. Runtime libraries that every
# glibc distribution has (libc, libgnutls, libssl, zlib, libffi) are left out.
packages=(libmicrohttpd-dev libmicrohttpd12
          libsqlite3-dev libsqlite3-0
          libcjson-dev libcjson1
          libcriterion-dev libcriterion3 libnanomsg5 libgit2-1.5 libhttp-parser2.9
          libmbedtls14 libmbedx509-1 libmbedcrypto7 libssh2-1
          libopenblas-dev libopenblas-pthread-dev libopenblas0-pthread libgfortran5
          pkgconf pkgconf-bin libpkgconf3)
# Python's headers, for the package's extension pprun._op (python/pprun/_op.c);
# without them the PyTorch path records through ctypes, slower.
packages+=(libpython3-dev libpython3.11-dev)

usage() {
    echo "usage: scripts/gpu-debs.sh fetch DIR | unpack DIR PREFIX" >&2
    exit 2
}

fetch() {
    local dir=$1
    mkdir -p "$dir"
    # apt warns that it downloads as root outside its sandbox: harmless here.
    (cd "$dir" && apt-get download "${packages[@]}" 2>&1 >/dev/null) | grep -v unsandboxed >&2 || true
    local p missing=0
    for p in "${packages[@]}"; do
        compgen -G "$dir/${p}_*.deb" >/dev/null || { echo "gpu-debs: $p was not downloaded" >&2; missing=1; }
    done
    [ $missing -eq 0 ] || exit 1
    echo "gpu-debs: $(ls "$dir"/*.deb | wc -l) packages, $(du -sh "$dir" | cut -f1) in $dir" >&2
}

unpack() {
    local dir=$1 prefix=$2 multiarch=lib/x86_64-linux-gnu
    compgen -G "$dir/*.deb" >/dev/null || { echo "gpu-debs: no .deb files in $dir" >&2; exit 1; }
    mkdir -p "$prefix"
    prefix=$(cd "$prefix" && pwd)
    for f in "$dir"/*.deb; do dpkg-deb -x "$f" "$prefix"; done
    local pc=$prefix/usr/$multiarch/pkgconfig
    mkdir -p "$pc"
    # OpenBLAS's .pc and .so links live in its variant folder (Debian's
    # alternatives would link them into place; there are none here).
    local blas=$prefix/usr/$multiarch/openblas-pthread
    cp "$blas/pkgconfig/openblas.pc" "$pc/openblas.pc"
    for so in "$blas"/lib*.so*; do ln -sf "$so" "$prefix/usr/$multiarch/$(basename "$so")"; done
    for f in "$pc"/*.pc; do
        [ -L "$f" ] && cp --remove-destination "$(readlink -f "$f")" "$f"
        sed -i -e "s|^prefix=/usr|prefix=$prefix/usr|" -e "s| /usr/| $prefix/usr/|g" \
            -e "s|=/usr/|=$prefix/usr/|g" -e '/^Requires.private:/d' "$f"
    done
    echo "export PATH=\"$prefix/usr/bin:\$PATH\""
    echo "export PKG_CONFIG_LIBDIR=\"$pc\""
    echo "export LD_LIBRARY_PATH=\"$prefix/usr/$multiarch:$blas\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}\""
}

case "${1:-}" in
fetch) [ $# -eq 2 ] || usage; fetch "$2" ;;
unpack) [ $# -eq 3 ] || usage; unpack "$2" "$3" ;;
*) usage ;;
esac
