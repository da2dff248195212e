# shellcheck shell=sh
# The .rpm's %postun ($1: 0 on erase, 1 on upgrade): reloads systemd; on an
# upgrade, restarts the service on the new binary if it ran.
if [ -d /run/systemd/system ]; then
  systemctl daemon-reload >/dev/null 2>&1 || :
  if [ "$1" -ge 1 ]; then
    systemctl try-restart efa-k8s-device-plugin.service >/dev/null 2>&1 || :
  fi
fi
