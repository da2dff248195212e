"""A simulated node running the real daemon binary, for the monitoring tests.

efa-simnode writes the node (sysfs, dev, DMI product name); fake-kubelet
serves its kubelet side (registration, pod-resources, one admitted
container holding EFAs) and keeps serving (--hold); the daemon binary runs
against both and serves /metrics on a free loopback port. On a node without
EFA the daemon hands over to the idle process beside it (same PID), which
serves /metrics on a port of its own.

    with SimNode(bins, "p5.48xlarge", work, admit=4) as node:
        node.wait_log("registered")
        text = node.scrape()
"""
import os
import re
import subprocess
import time
import urllib.request

DEADLINE = 20.0  # seconds for any one event
RESOURCE = "vpc.amazonaws.com/efa"


class Binaries:
    """The build's binaries: the daemon (the idle process beside it),
    efa-simnode and fake-kubelet."""

    def __init__(self, daemon, simnode, kubelet):
        self.daemon, self.simnode, self.kubelet = daemon, simnode, kubelet
        for path in (daemon, simnode, kubelet):
            if not os.access(path, os.X_OK):
                raise SystemExit(f"not an executable: {path} (build it first)")


def wait_for(what, predicate, deadline=DEADLINE, pause=0.05):
    """Polls `predicate` until it returns a true value, which is returned;
    fails naming `what` after `deadline` seconds."""
    end = time.monotonic() + deadline
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {deadline:.0f} s waiting for {what}")
        time.sleep(pause)  # the pace of the polling, not a wait for the event


def http_get(url, timeout=5.0):
    with urllib.request.urlopen(url, timeout=timeout) as reply:
        return reply.read().decode()


class SimNode:
    def __init__(self, bins, machine, work, admit=0, daemon_flags=()):
        self.bins, self.machine, self.admit = bins, machine, admit
        self.root = os.path.join(work, machine)
        self.daemon_flags = list(daemon_flags)
        self.procs = []
        self.log = os.path.join(work, f"{machine}.daemon.log")
        self.kubelet_log = os.path.join(work, f"{machine}.kubelet.log")
        self.removed = {}

    def __enter__(self):
        subprocess.run([self.bins.simnode, self.machine, self.root], check=True)
        kubelet_dir = os.path.join(self.root, "kubelet")
        os.makedirs(os.path.join(kubelet_dir, "device-plugins"), exist_ok=True)
        if self.admit:
            # As the kubelet: serves kubelet.sock and pod-resources, admits one
            # container asking for `admit` EFAs once the plugin registered.
            self._spawn([self.bins.kubelet, "--dir", os.path.join(kubelet_dir, "device-plugins"),
                         "--pod-resources-socket",
                         os.path.join(kubelet_dir, "pod-resources/kubelet.sock"),
                         "--admit", f"{RESOURCE}={self.admit}", "--timeout", "30", "--hold"],
                        self.kubelet_log)
            wait_for("fake-kubelet to serve", lambda: "serving" in read(self.kubelet_log))
        r = self.root
        self._spawn([self.bins.daemon, "--kubelet-dir", kubelet_dir,
                     "--sysfs-root", f"{r}/sys", "--dev-root", f"{r}/dev",
                     "--proc-root", f"{r}/proc", "--cdi-spec-dirs", f"{r}/etc/cdi",
                     "--cdi-dir", f"{r}/var/run/cdi",
                     "--metrics-address", "127.0.0.1:0", "--probe-address", "",
                     "--rescan-interval", "100ms"] + self.daemon_flags, self.log)
        return self

    def __exit__(self, *exc):
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        return False

    def _spawn(self, args, log):
        with open(log, "wb") as out:
            self.procs.append(subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT))

    def wait_log(self, text, deadline=DEADLINE):
        try:
            wait_for(f"{text!r} in {self.log}", lambda: text in read(self.log), deadline)
        except AssertionError:
            print(read(self.log)[-4000:])
            raise

    def wait_admitted(self):
        wait_for("fake-kubelet to admit the container",
                 lambda: "holding until SIGTERM" in read(self.kubelet_log))

    def metrics_port(self):
        """The port of the last "serving /metrics ... (port N)" line: the
        daemon's, or the idle process's once it took over."""
        found = re.findall(r"serving /metrics.*?\(port (\d+)", read(self.log))
        return int(found[-1]) if found else 0

    def scrape(self):
        return http_get(f"http://127.0.0.1:{self.metrics_port()}/metrics")

    # A device removed as the kernel removes it (lifecycle_node.cc's
    # RemoveEfa): its class entries and its device node; a uevent counted.
    def remove_efa(self, ibdev):
        sys_dir = os.path.join(self.root, "sys")
        uverbs = self._uverbs_of(ibdev)
        entries = {os.path.join(sys_dir, "class/infiniband", ibdev): None,
                   os.path.join(sys_dir, "class/infiniband_verbs", uverbs): None}
        for link in entries:
            entries[link] = os.readlink(link)
            os.remove(link)
        node = os.path.join(self.root, "dev/infiniband", uverbs)
        self.removed[ibdev] = (entries, node, os.stat(node).st_rdev)
        os.remove(node)
        self._count_uevent()

    def return_efa(self, ibdev):
        entries, node, rdev = self.removed.pop(ibdev)
        for link, target in entries.items():
            os.symlink(target, link)
        os.mknod(node, 0o666 | 0o020000, rdev)  # S_IFCHR
        self._count_uevent()

    def efas(self):
        return sorted(os.listdir(os.path.join(self.root, "sys/class/infiniband")))

    # An efa port counter set as the driver shows it: the whole value at
    # once (written aside, then renamed), as sim::SetEfaCounter does.
    def set_port_counter(self, ibdev, name, value):
        path = os.path.join(self.root, "sys/class/infiniband", ibdev, "ports/1/hw_counters", name)
        if not os.path.exists(path):
            raise AssertionError(f"{path}: the simulated driver has no such counter")
        with open(path + ".new", "w") as f:
            f.write(f"{value}\n")
        os.replace(path + ".new", path)

    def _uverbs_of(self, ibdev):
        verbs = os.path.join(self.root, "sys/class/infiniband_verbs")
        for name in os.listdir(verbs):
            ibdev_file = os.path.join(verbs, name, "ibdev")
            if os.path.exists(ibdev_file) and read(ibdev_file).strip() == ibdev:
                return name
        raise AssertionError(f"no uverbs device of {ibdev} under {verbs}")

    def _count_uevent(self):
        path = os.path.join(self.root, "sys/kernel/uevent_seqnum")
        count = int(read(path).strip() or 0)
        with open(path + ".new", "w") as f:
            f.write(f"{count + 1}\n")
        os.replace(path + ".new", path)


def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""
