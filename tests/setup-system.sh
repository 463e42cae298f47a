#!/usr/bin/env bash
# The Debian packages the test suite uses and the main job does not (scripts/install.sh --tests):
#   iproute2                        the multi-node Ray cluster lives in network namespaces (ip)
#   procps                          tests find worker processes with pgrep
#   prometheus, prometheus-pushgateway   the metrics tests run a real Prometheus and Pushgateway on loopback
#   chromium, chromium-driver       the HTML report's browser test
#   curl                            the README's request, run as written
# Installed where we may (root with apt-get); elsewhere the missing ones are named, and the tests
# that need them say so when they run.
set -euo pipefail
step() { echo "install: $*" >&2; }
policy=${POLICY_RC_D:-/usr/sbin/policy-rc.d}

missing=()
need() { command -v "$1" >/dev/null 2>&1 || missing+=("$2"); }
need ip iproute2
need pgrep procps
need prometheus prometheus
need prometheus-pushgateway prometheus-pushgateway
need chromium chromium
need chromedriver chromium-driver
need curl curl
if [ ${#missing[@]} -eq 0 ]; then
  step "system packages for tests: all there"
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  step "system packages for tests: missing ${missing[*]}; install them as root (apt-get install ${missing[*]})"
  exit 0
fi
step "system packages for tests: ${missing[*]} (apt-get)"
# Keep the packages' services from starting: the tests start their own on loopback. policy-rc.d
# answering 101 tells invoke-rc.d that no service may start; ours goes again afterwards.
made_policy=
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' >"$policy"
  chmod +x "$policy"
  made_policy=1
fi
trap '[ -z "$made_policy" ] || rm -f "$policy"' EXIT
apt-get update -qq >&2
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
