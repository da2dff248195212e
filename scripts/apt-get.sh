#!/usr/bin/env bash
# apt-get under one lock for the machine, which every script of the tree
# takes: .ci/run runs scripts/install-deps.sh, scripts/image.sh --prepare and
# the Kubernetes build at once, and `apt-get update` fails at once when
# another holds its lists lock (DPkg::Lock::Timeout waits only for dpkg's).
# Waits up to 30 minutes for the lock. Run as root (install-deps.sh: sudo).
exec flock -w 1800 /var/lib/apt/efa-apt-get.lock apt-get "$@"
