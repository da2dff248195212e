# shellcheck shell=sh
# The .rpm's %post ($1: 1 on install, 2 on upgrade): creates the
# directories the unit writes, enables the unit on a first install and
# starts it when systemd runs (an AMI build in a chroot only enables it).
systemd-tmpfiles --create efa-k8s-device-plugin.conf >/dev/null 2>&1 || :
if [ "$1" -eq 1 ]; then
  systemctl --no-reload enable efa-k8s-device-plugin.service >/dev/null 2>&1 || :
fi
if [ -d /run/systemd/system ]; then
  systemctl daemon-reload >/dev/null 2>&1 || :
  if [ "$1" -eq 1 ]; then
    systemctl start efa-k8s-device-plugin.service >/dev/null 2>&1 || :
  fi
fi
