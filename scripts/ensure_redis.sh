#!/usr/bin/env bash
# Install redis-server from the OS packages when it is missing (the tests start their own).
set -euo pipefail
if command -v redis-server >/dev/null 2>&1; then exit 0; fi
SUDO=""
[ "$(id -u)" = "0" ] || SUDO="sudo"
if command -v apt-get >/dev/null 2>&1; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server >/dev/null
  # the package may start a system instance; the tests use their own on free ports
  ($SUDO systemctl stop redis-server 2>/dev/null || $SUDO service redis-server stop 2>/dev/null || true) >/dev/null 2>&1
else
  echo "redis-server is missing and apt-get is not available: install redis-server" >&2
  exit 1
fi
