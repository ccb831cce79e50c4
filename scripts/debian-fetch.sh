#!/usr/bin/env bash
# usage: scripts/debian-fetch.sh SUITE PACKAGE DEST
# Download PACKAGE from Debian SUITE (e.g. bookworm) with a private apt configuration (the
# system's apt state is left alone; no root needed) and unpack it into DEST (dpkg -x).
set -euo pipefail
suite=$1 package=$2 dest=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/cache/archives/partial"
: > "$work/status"
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
opt="signed-by=$keyring"
[ -r "$keyring" ] || opt="trusted=yes"
cat > "$work/sources.list" <<SRC
deb [$opt] http://deb.debian.org/debian $suite main
deb [$opt] http://deb.debian.org/debian-security $suite-security main
deb [$opt] http://deb.debian.org/debian $suite-updates main
SRC
apt_opts=(-o "Dir::Etc::SourceList=$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
          -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache"
          -o "Dir::State::Status=$work/status" -o Debug::NoLocking=1
          -o APT::Sandbox::User=root)
apt-get "${apt_opts[@]}" -qq update
(cd "$work" && apt-get "${apt_opts[@]}" -qq download "$package")
mkdir -p "$dest"
dpkg -x "$work/${package}"_*.deb "$dest"
