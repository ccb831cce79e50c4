#!/usr/bin/env bash
# usage: scripts/debian-fetch.sh SUITE PACKAGE DEST
# Download PACKAGE from Debian SUITE (e.g. bullseye) with a private apt configuration (the
# system's apt state is left alone; no root needed) and unpack it into DEST (dpkg -x), from
# the Debian archives this machine's apt sources name.
set -euo pipefail
suite=$1 package=$2 dest=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/cache/archives/partial"
: > "$work/status"
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
opt="signed-by=$keyring"
[ -r "$keyring" ] || opt="trusted=yes"
# The machine's own Debian archives, from its configured apt sources (a mirror or a proxy
# the operator set is honoured; no host is written here): the one serving this release's
# codename, and the one serving its -security suite.
codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
main= security=
while read -r uri release; do
  case $release in
    "$codename") main=${main:-$uri} ;;
    "$codename-security") security=${security:-$uri} ;;
  esac
done < <(apt-get indextargets --format '$(REPO_URI) $(RELEASE)' 2>/dev/null | sort -u)
if [ -z "$main" ]; then
  echo "debian-fetch.sh: no Debian archive for '$codename' in this machine's apt sources" >&2
  exit 1
fi
{
  echo "deb [$opt] $main $suite main"
  echo "deb [$opt] $main $suite-updates main"
  [ -z "$security" ] || echo "deb [$opt] $security $suite-security main"
} > "$work/sources.list"
apt_opts=(-o "Dir::Etc::SourceList=$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
          -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache"
          -o "Dir::State::Status=$work/status" -o Debug::NoLocking=1
          -o APT::Sandbox::User=root)
apt-get "${apt_opts[@]}" -qq update
(cd "$work" && apt-get "${apt_opts[@]}" -qq download "$package")
mkdir -p "$dest"
dpkg -x "$work/${package}"_*.deb "$dest"
