#!/usr/bin/env bash
# Installs what the container image's build needs besides Rust and a C compiler: with the
# `igzip` cargo feature, ISA-L's igzip (src/storage/gzip.rs) compresses uploads, C and
# assembly that the `isal-sys` crate builds from source with nasm and the autotools. The
# default build (`cargo build --release`) needs none of this. Without them, isal-sys's
# build script stops with `autoreconf: not found` and "autogen failed"; this script names
# in one line what is missing.
#
#   ./scripts/install-build-deps.sh      # then: cargo build --release --features igzip
#   ./scripts/install-build-deps.sh WHAT:PACKAGE...   # other tools (scripts/check-aarch64.sh)
#
# Idempotent and quick when everything is there. Installs the missing Debian/Ubuntu packages
# (nasm autoconf automake libtool make) with apt-get, as root or through sudo; elsewhere it
# names what is missing and exits 1. With arguments, checks those instead: WHAT is a
# command, or an absolute path that must exist, and PACKAGE the package that provides it.
set -euo pipefail

pairs=("$@")
if ((${#pairs[@]} == 0)); then
    pairs=(nasm:nasm autoconf:autoconf automake:automake libtoolize:libtool make:make)
fi
missing=()
for pair in "${pairs[@]}"; do
    what="${pair%%:*}"
    if [[ "$what" == /* ]]; then
        [[ -e "$what" ]] || missing+=("${pair#*:}")
    else
        command -v "$what" >/dev/null 2>&1 || missing+=("${pair#*:}")
    fi
done
if ((${#missing[@]} == 0)); then
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-build-deps: missing ${missing[*]}; install them with your package manager" \
        "(nasm >= 2.14 for igzip), then build again" >&2
    exit 1
fi
as_root=()
if [[ "$(id -u)" != 0 ]]; then
    if command -v sudo >/dev/null 2>&1; then
        as_root=(sudo)
    else
        echo "install-build-deps: missing ${missing[*]}; run as root:" \
            "apt-get install -y ${missing[*]}" >&2
        exit 1
    fi
fi
echo "install-build-deps: installing ${missing[*]} (apt-get)" >&2
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >&2
