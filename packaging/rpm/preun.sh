# shellcheck shell=sh
# The .rpm's %preun ($1: 0 on erase, 1 on upgrade): on erase, stops and
# disables the service (the daemon removes its socket on SIGTERM).
if [ "$1" -eq 0 ]; then
  systemctl --no-reload disable --now efa-k8s-device-plugin.service >/dev/null 2>&1 || :
fi
