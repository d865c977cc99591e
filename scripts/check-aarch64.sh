#!/usr/bin/env bash
# Builds the collector for 64-bit ARM (aarch64 Linux: Grace Hopper and Graviton GPU nodes)
# on an x86_64 machine and runs its unit tests under qemu's user-mode emulation. The part
# that could differ by architecture is the C and assembly of the upload compressors (ISA-L's
# igzip has its own aarch64 code; libdeflate picks its routines at run time): the unit
# tests compress and read back at every `--gzip-level`, and the binary, run under qemu,
# takes the quickstart's events and uploads them at two levels. Built as the container
# image is, with the `igzip` feature (the default build's compressors are libdeflate's).
#
#   ./scripts/check-aarch64.sh      # ~6 min on 2 cores from a clean target directory
#
# Not part of .ci/run (it would add about half of its time). Installs what is missing on
# Debian/Ubuntu with apt-get, as root or through sudo: the cross compiler and C library
# (gcc-aarch64-linux-gnu, libc6-dev-arm64-cross) and qemu-user-static; and the Rust target
# with rustup. Builds into target/aarch64-check so the host's build is left alone.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

./scripts/install-build-deps.sh

./scripts/install-build-deps.sh \
    aarch64-linux-gnu-gcc:gcc-aarch64-linux-gnu \
    /usr/aarch64-linux-gnu/include/stdio.h:libc6-dev-arm64-cross \
    qemu-aarch64-static:qemu-user-static

target=aarch64-unknown-linux-gnu
if ! rustup target list --installed | grep -qx "$target"; then
    rustup target add "$target"
fi

export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64-static -L /usr/aarch64-linux-gnu"
export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
export AR_aarch64_unknown_linux_gnu=aarch64-linux-gnu-ar
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/aarch64-check"

echo "== cargo build --release --target $target --features igzip (the collector binary)"
cargo build --locked --release --target "$target" --features igzip --bin ray-history-collector
bin="$CARGO_TARGET_DIR/$target/release/ray-history-collector"
file_type=$(od -An -tx1 -j18 -N2 "$bin" | tr -d ' ')
if [[ "$file_type" != "b700" ]]; then
    echo "check-aarch64: $bin is not an aarch64 ELF (e_machine $file_type)" >&2
    exit 1
fi
qemu=(qemu-aarch64-static -L /usr/aarch64-linux-gnu)
echo "== $bin --version, under qemu"
"${qemu[@]}" "$bin" --version

# The binary end to end, under qemu: the quickstart's events in, SIGTERM, the objects read
# back, once at the default level (igzip) and once at a libdeflate level.
work=$(mktemp -d)
collector_pid=
cleanup() {
    [[ -n "$collector_pid" ]] && kill "$collector_pid" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
for level in 1 6; do
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    echo "== the aarch64 binary under qemu, --gzip-level $level, on 127.0.0.1:$port"
    "${qemu[@]}" "$bin" --listen "127.0.0.1:$port" --spool-dir "$work/spool-$level" \
        --storage "$work/bucket-$level" --gzip-level "$level" \
        --enable-log-collector false --enable-export-events false >"$work/log-$level" 2>&1 &
    collector_pid=$!
    for _ in $(seq 1 100); do
        curl -s --noproxy '*' -o /dev/null "http://127.0.0.1:$port/healthz" && break
        sleep 0.2
    done
    examples/quickstart/send-sample.sh "http://127.0.0.1:$port/v1/events" >/dev/null
    kill -TERM "$collector_pid"
    if ! wait "$collector_pid"; then
        cat "$work/log-$level" >&2
        echo "check-aarch64: the collector did not exit 0 after SIGTERM" >&2
        exit 1
    fi
    collector_pid=
    lines=0
    while IFS= read -r -d '' object; do
        lines=$((lines + $(gzip -dc "$object" | wc -l)))
    done < <(find "$work/bucket-$level" -name '*.jsonl.gz' -print0)
    sent=$(python3 -c 'import json,sys; print(sum(len(json.loads(l)) for l in open(sys.argv[1]) if l.strip()))' \
        examples/quickstart/sample-events.jsonl)
    if [[ "$lines" != "$sent" ]]; then
        echo "check-aarch64: $sent events sent, $lines read back from the bucket" >&2
        exit 1
    fi
    echo "   $lines events sent, uploaded and read back with gzip -d"
done

echo "== cargo test --lib --target $target --features igzip, under qemu"
cargo test --locked --target "$target" --features igzip --lib -p ray-history-collector
echo "check-aarch64: ok"
