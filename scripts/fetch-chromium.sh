#!/usr/bin/env bash
# The report test (tests/gateway/tools/test_report.py) renders `gateway report`'s page in
# headless Chromium: Debian's chromium package, installed with apt-get (as root, or through
# sudo) when no chromium is on PATH. Set CHROMIUM to use another binary instead.
# Idempotent: does nothing once chromium is there.
set -euo pipefail
if [ -n "${CHROMIUM:-}" ] || command -v chromium >/dev/null 2>&1; then exit 0; fi
sudo=()
if [ "$(id -u)" -ne 0 ]; then
    if ! command -v sudo >/dev/null 2>&1; then
        echo "fetch-chromium: not root and no sudo: install Debian's chromium package" >&2
        exit 1
    fi
    sudo=(sudo -n)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get -qq -o DPkg::Lock::Timeout=300 update
"${sudo[@]}" apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends chromium >/dev/null
echo "$(chromium --version 2>/dev/null) installed"
