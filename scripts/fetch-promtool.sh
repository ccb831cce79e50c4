#!/usr/bin/env bash
# The deploy tests check deploy/prometheus/ with promtool (`check rules`, `check config`,
# `test rules`). Fetch Debian 12's prometheus package with a private apt configuration (the
# system's apt state is left alone), unpack it in a temporary folder and keep only promtool,
# as .cache/promtool/bin/promtool.
# Idempotent: does nothing once promtool is there.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.cache/promtool/bin/promtool
if [ -x "$dest" ]; then exit 0; fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/cache/archives/partial"
: > "$work/status"
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
opt="signed-by=$keyring"
[ -r "$keyring" ] || opt="trusted=yes"
cat > "$work/sources.list" <<SRC
deb [$opt] http://deb.debian.org/debian bookworm main
deb [$opt] http://deb.debian.org/debian-security bookworm-security main
deb [$opt] http://deb.debian.org/debian bookworm-updates main
SRC
apt_opts=(-o "Dir::Etc::SourceList=$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
          -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache"
          -o "Dir::State::Status=$work/status" -o Debug::NoLocking=1
          -o APT::Sandbox::User=root)
apt-get "${apt_opts[@]}" -qq update
(cd "$work" && apt-get "${apt_opts[@]}" -qq download prometheus)
dpkg -x "$work"/prometheus_*.deb "$work/root"
install -D -m 0755 "$work/root/usr/bin/promtool" "$dest"
echo "promtool $("$dest" --version 2>&1 | head -n1 | awk '{print $3}') unpacked as $dest"
