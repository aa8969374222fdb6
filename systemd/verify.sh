#!/usr/bin/env bash
# Checks systemd/servetune.service with `systemd-analyze verify`, against the servetune binary
# built here (the unit names /usr/local/bin/servetune, where the install puts it). Any warning
# fails: systemd-analyze exits 0 on unknown keys or bad values and only prints them.
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${1:-$PWD/target/release/servetune}"
[ -x "$bin" ] || { echo "verify.sh: $bin is not built" >&2; exit 1; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
sed "s#/usr/local/bin/servetune#$bin#" systemd/servetune.service > "$tmp/servetune.service"
out="$(cd "$tmp" && systemd-analyze verify --man=no ./servetune.service 2>&1)" || { echo "$out" >&2; exit 1; }
if [ -n "$out" ]; then
  echo "systemd-analyze verify warned about systemd/servetune.service:" >&2
  echo "$out" >&2
  exit 1
fi
echo "systemd/servetune.service: systemd-analyze verify OK"
