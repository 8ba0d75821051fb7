#!/usr/bin/env bash
# Set up everything Unveil's commands and tests need on a fresh Debian machine:
# system packages (real servers for the tests, tools the remediation scripts drive)
# and a virtual environment with the project installed. Idempotent and quiet when done.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
# what                 why
# influxdb             a real InfluxDB 1.x server for the sink/source tests
# victoria-metrics     a real server speaking InfluxDB's /api/v2/write for the v2 path tests
# chromium             renders the HTML report headless in tests
# numactl              migratepages, used by the NUMA rebinding remediation
# ethtool              NIC ring sizes, read and set by the nic_ring remediation
# linux-perf           hardware counters, where the PMU exposes them
# systemd              systemd-analyze verify checks the service units (packaging/systemd)
# nftables             random packet loss for the drill's network fault where the kernel has no sch_netem
APT_PACKAGES=(influxdb victoria-metrics chromium numactl ethtool linux-perf systemd nftables)

want_apt=()
for pkg in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || want_apt+=("$pkg")
done
if ((${#want_apt[@]})); then
    if [[ $(id -u) -ne 0 ]]; then
        echo "bootstrap: missing system packages: ${want_apt[*]} (run as root or install them)" >&2
        exit 1
    fi
    echo "bootstrap: installing ${want_apt[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${want_apt[@]}" >/dev/null
fi

stamp="$VENV/.unveil-installed"
if [[ ! -x "$VENV/bin/python" ]]; then
    "$PYTHON" -m venv "$VENV"
fi
if [[ ! -f "$stamp" || pyproject.toml -nt "$stamp" ]]; then
    "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
    "$VENV/bin/python" -m pip install -q -e ".[test]"
    touch "$stamp"
fi
