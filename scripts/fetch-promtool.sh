#!/usr/bin/env bash
# The deploy tests check deploy/prometheus/ with promtool (`check rules`, `check config`,
# `test rules`). Fetch Debian 12's prometheus package (scripts/debian-fetch.sh: a private apt
# configuration, the system's apt state left alone), unpack it in a temporary folder and keep
# only promtool, as .cache/promtool/bin/promtool.
# Idempotent: does nothing once promtool is there.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.cache/promtool/bin/promtool
if [ -x "$dest" ]; then exit 0; fi
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
scripts/debian-fetch.sh bookworm prometheus "$root"
install -D -m 0755 "$root/usr/bin/promtool" "$dest"
echo "promtool $("$dest" --version 2>&1 | head -n1 | awk '{print $3}') unpacked as $dest"
