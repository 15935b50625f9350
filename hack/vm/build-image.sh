#!/bin/bash
# build-image.sh - build the Debian bookworm systemd VM image that the VM tests (test/vm, `make test-vm`) boot.
# Adapted from shared/recipes/vm. No root mounts or loop devices: the disk is made with mkfs.ext4 -d.
#
# Output (in $VM_CACHE_DIR, default ${XDG_CACHE_HOME:-$HOME/.cache}/lifecycle-agent/vm), outside the clone:
#   base.qcow2        ext4 root filesystem (whole disk, no partition table) -> /dev/vda in the guest
#   vmlinux           uncompressed kernel (PVH-bootable ELF; much faster under TCG than bzImage)
#   vmlinuz, initrd   kernel + initramfs as shipped by Debian (VM_BOOT=bzimage fallback)
#   id_ed25519[.pub]  ssh key authorized for root@guest
#   stamp             hash of every build input; when it matches, the build is skipped (cache hit, ~0 s)
#
# The guest: host name vm-node; systemd as PID 1, dbus, logind, libc (what the agent and its .deb need at run
# time), openssh-server, curl (reach the API server by hand), a persistent journal (journalctl -b -1 after a
# reboot or a power cut). /etc/hosts maps `kubernetes` to 10.0.2.100, the address run-vm.sh forwards
# (QEMU guestfwd) to the host's test kube-apiserver on 127.0.0.1; the guest reaches nothing else.
#
# Env: VM_CACHE_DIR, VM_MIRROR (default: the first non-security URI in this machine's apt sources),
#      VM_SUITE (bookworm), VM_DISK_SIZE (4G), VM_NODEBIN (default: the output of hack/nodebin.sh), VM_EXTRA_PACKAGES (comma-separated),
#      VM_PRUNE_MODULES (1: delete gpu/sound/wifi/... kernel modules), VM_COMPRESS (0: qcow2 -c),
#      VM_BUILD_TIMEOUT (1800 s for debootstrap), VM_FORCE (1: rebuild even if the stamp matches)
# Host packages (Debian): debootstrap qemu-utils e2fsprogs xz-utils openssh-client python3; run as root.
set -euo pipefail

CACHE=${VM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/lifecycle-agent/vm}
SUITE=${VM_SUITE:-bookworm}
DISK_SIZE=${VM_DISK_SIZE:-4G}
PRUNE=${VM_PRUNE_MODULES:-1}
COMPRESS=${VM_COMPRESS:-0}
BUILD_TIMEOUT=${VM_BUILD_TIMEOUT:-1800}
API_ADDR=10.0.2.100   # keep in sync with run-vm.sh (VM_API_GUEST_ADDR) and test/vm
# Runtime needs of the agent and its .deb (libc6, systemd, dbus, logind via libpam-systemd; init-system-helpers
# and apt are in minbase), plus the plumbing of the test VM and a few debugging tools.
PKGS="systemd,systemd-sysv,dbus,dbus-bin,libpam-systemd,libc6,linux-image-amd64,initramfs-tools,openssh-server"
PKGS="$PKGS,iproute2,udev,kmod,procps,psmisc,e2fsprogs,less,curl,ca-certificates"
[ -n "${VM_EXTRA_PACKAGES:-}" ] && PKGS="$PKGS,${VM_EXTRA_PACKAGES}"

if [ -z "${VM_MIRROR:-}" ]; then
  # Reuse the mirror this machine's apt is configured with (deb822 or one-line format).
  VM_MIRROR=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '/^URIs:/{print $2}' | grep -v security | head -1 || true)
  [ -z "$VM_MIRROR" ] && VM_MIRROR=$(grep -hE '^deb ' /etc/apt/sources.list 2>/dev/null | grep -v security | awk '{print $2}' | head -1 || true)
  [ -z "$VM_MIRROR" ] && { echo "cannot determine the apt mirror; set VM_MIRROR" >&2; exit 2; }
fi

log() { echo "[build-image $(date +%T)] $*" >&2; }
missing=()
for t in debootstrap:debootstrap qemu-img:qemu-utils mkfs.ext4:e2fsprogs xz:xz-utils python3:python3 ssh-keygen:openssh-client; do
  command -v "${t%%:*}" >/dev/null || missing+=("${t#*:}")
done
[ ${#missing[@]} -eq 0 ] || { echo "build-image.sh: missing host tools; install them with: apt-get install -y ${missing[*]}" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "build-image.sh: must run as root (debootstrap/chroot)" >&2; exit 2; }

# The test node's kubelet, containerd, runc, CNI plugins and images (hack/nodebin.sh, cached by its own key):
# installed in the image, their units disabled; the real-node tests enable them (test/vm realnode_test.go).
NODEBIN=${VM_NODEBIN:-$("$(dirname "$0")/../nodebin.sh")} || { echo "build-image.sh: hack/nodebin.sh failed" >&2; exit 1; }
[ -f "$NODEBIN/done" ] || { echo "build-image.sh: $NODEBIN is not a hack/nodebin.sh output" >&2; exit 1; }
STAMP=$( { cat "$0"; echo "$SUITE $VM_MIRROR $PKGS $DISK_SIZE $PRUNE $COMPRESS $(basename "$NODEBIN")"; } | sha256sum | cut -c1-16)
mkdir -p "$CACHE"
exec 8>"$CACHE/.build.lock"
flock 8   # one builder at a time; a parallel caller waits, then gets the cache hit
if [ "${VM_FORCE:-0}" != 1 ] && [ -f "$CACHE/stamp" ] && [ "$(cat "$CACHE/stamp")" = "$STAMP" ] && [ -f "$CACHE/base.qcow2" ]; then
  log "cache hit ($CACHE, stamp $STAMP)"; exit 0
fi

B="$CACHE/build"; R="$B/rootfs"
rm -rf "$B"; mkdir -p "$B"
rm -f "$CACHE/stamp"
T0=$(date +%s)

log "debootstrap $SUITE from $VM_MIRROR (cold build: ~2-4 min on 2 cores)"
# INITRD=No: the kernel's postinst hook skips the full (MODULES=most) initramfs, by far the slowest step of the
# install; a small one (MODULES=list) is made below, once the configuration is in place.
INITRD=No timeout "$BUILD_TIMEOUT" debootstrap --variant=minbase --include="$PKGS" "$SUITE" "$R" "$VM_MIRROR" >"$B/debootstrap.log" 2>&1 \
  || { tail -30 "$B/debootstrap.log" >&2; exit 1; }
T1=$(date +%s); log "debootstrap done in $((T1-T0)) s"

# ---------- guest configuration ----------
echo vm-node > "$R/etc/hostname"
printf '127.0.0.1 localhost\n127.0.1.1 vm-node\n# the host test kube-apiserver, through QEMU guestfwd (run-vm.sh)\n%s kubernetes\n' "$API_ADDR" > "$R/etc/hosts"
: > "$R/etc/resolv.conf"   # no DNS: the guest network is restricted; names come from /etc/hosts
cat > "$R/etc/fstab" <<'EOF'
/dev/vda  /        ext4  rw,errors=remount-ro  0 1
# optional host share (run-vm.sh passes -virtfs ... mount_tag=ci); nofail so it boots without it
ci        /mnt/ci  9p    trans=virtio,version=9p2000.L,msize=262144,nofail,x-systemd.requires=systemd-modules-load.service  0 0
EOF
printf '9p\n9pnet_virtio\n' > "$R/etc/modules-load.d/ci-9p.conf"
mkdir -p "$R/mnt/ci" "$R/var/log/journal"          # persistent journal -> journalctl -b -1 after reboots and power cuts
mkdir -p "$R/etc/systemd/journald.conf.d"
printf '[Journal]\nStorage=persistent\nSystemMaxUse=64M\nRateLimitBurst=0\n' > "$R/etc/systemd/journald.conf.d/ci.conf"
cat > "$R/etc/systemd/network/10-dhcp.network" <<'EOF'
[Match]
Name=en* eth*
[Network]
DHCP=ipv4
[DHCPv4]
UseDNS=no
EOF
# serial console autologin (debugging only)
mkdir -p "$R/etc/systemd/system/serial-getty@ttyS0.service.d"
cat > "$R/etc/systemd/system/serial-getty@ttyS0.service.d/autologin.conf" <<'EOF'
[Service]
ExecStart=
ExecStart=-/sbin/agetty --autologin root --keep-baud 115200,57600,38400,9600 %I $TERM
EOF
# boot marker on the serial console: the host waits for "CI-READY <boot_id>"
cat > "$R/etc/systemd/system/ci-ready.service" <<'EOF'
[Unit]
Description=Print CI-READY marker on serial console
After=multi-user.target
[Service]
Type=oneshot
ExecStart=/bin/sh -c 'echo "CI-READY $(cat /proc/sys/kernel/random/boot_id) uptime=$(cut -d" " -f1 /proc/uptime)" > /dev/ttyS0'
[Install]
WantedBy=multi-user.target
EOF
mkdir -p "$R/root/.ssh"; chmod 700 "$R/root/.ssh"
[ -f "$CACHE/id_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C ci-vm -f "$CACHE/id_ed25519"
cp "$CACHE/id_ed25519.pub" "$R/root/.ssh/authorized_keys"; chmod 600 "$R/root/.ssh/authorized_keys"
# UsePAM no: no logind session and no user manager (systemd --user) per ssh login, which costs seconds under TCG
printf 'UseDNS no\nPermitRootLogin prohibit-password\nUsePAM no\n' > "$R/etc/ssh/sshd_config.d/ci.conf"
# ---------- the test node: kubelet + containerd (disabled; test/vm enables them for the real-node scenarios) ----------
install -m 0755 "$NODEBIN"/bin/* "$R/usr/local/bin/"
mkdir -p "$R/opt/cni/bin" "$R/etc/cni/net.d" "$R/etc/containerd" "$R/var/lib/kubelet" "$R/var/lib/lifecycle-test/images" "$R/var/lib/lifecycle-test/record"
install -m 0755 "$NODEBIN"/cni/* "$R/opt/cni/bin/"
install -m 0644 "$NODEBIN"/images/*.tar "$R/var/lib/lifecycle-test/images/"
printf 'overlay\nbridge\nveth\n' > "$R/etc/modules-load.d/ci-node.conf"
cat > "$R/etc/containerd/config.toml" <<'EOF'
# containerd 2.x for the test node: the sandbox image is the one imported from /var/lib/lifecycle-test/images
# (no registry is reachable), runc with the systemd cgroup driver like the kubelet.
version = 3
[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = 'lifecycle.test/pause:1'
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
  SystemdCgroup = true
EOF
cat > "$R/etc/cni/net.d/10-test.conflist" <<'EOF'
{"cniVersion": "1.0.0", "name": "test-pods", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.88.0.0/16"}]], "routes": [{"dst": "0.0.0.0/0"}]}}]}
EOF
cat > "$R/etc/systemd/system/containerd.service" <<'EOF'
[Unit]
Description=containerd (test node runtime, hack/nodebin.sh)
After=network.target local-fs.target
[Service]
ExecStartPre=-/sbin/modprobe overlay
ExecStart=/usr/local/bin/containerd
Type=notify
Delegate=yes
KillMode=process
Restart=always
RestartSec=2
LimitNOFILE=infinity
OOMScoreAdjust=-999
[Install]
WantedBy=multi-user.target
EOF
cat > "$R/etc/systemd/system/ci-images.service" <<'EOF'
[Unit]
Description=Import the test node's images (pause, workload) into containerd
Requires=containerd.service
After=containerd.service
Before=kubelet.service
ConditionPathExists=!/var/lib/lifecycle-test/images/.imported
[Service]
Type=oneshot
ExecStart=/usr/local/bin/ctr -n k8s.io images import /var/lib/lifecycle-test/images/pause.tar
ExecStart=/usr/local/bin/ctr -n k8s.io images import /var/lib/lifecycle-test/images/workload.tar
ExecStart=/usr/bin/touch /var/lib/lifecycle-test/images/.imported
[Install]
WantedBy=multi-user.target
EOF
cat > "$R/etc/systemd/system/kubelet.service" <<'EOF'
[Unit]
Description=kubelet (test node, hack/nodebin.sh)
Wants=containerd.service ci-images.service
After=containerd.service ci-images.service network.target
[Service]
ExecStart=/usr/local/bin/kubelet --config=/var/lib/kubelet/config.yaml --kubeconfig=/etc/kubernetes/kubelet.conf --hostname-override=vm-node --node-ip=10.0.2.15
Restart=always
RestartSec=2
[Install]
WantedBy=multi-user.target
EOF
# The kubelet's graceful node shutdown is on (shutdownGracePeriod): it takes its own logind delay lock and
# writes /run/systemd/logind.conf.d/99-kubelet.conf beside the agent's drop-in. Authentication is open
# (anonymous, AlwaysAllow) because port 10250 is reachable from nothing but the guest itself (restrict=on).
cat > "$R/var/lib/kubelet/config.yaml" <<'EOF'
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: systemd
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization:
  mode: AlwaysAllow
failSwapOn: false
rotateCertificates: false
serializeImagePulls: false
shutdownGracePeriod: 20s
shutdownGracePeriodCriticalPods: 5s
evictionHard: {memory.available: "50Mi", nodefs.available: "2%", imagefs.available: "2%", nodefs.inodesFree: "2%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
nodeStatusReportFrequency: 1m
EOF

# small initramfs: only what is needed to mount an ext4 root on virtio-blk
sed -i 's/^MODULES=.*/MODULES=list/' "$R/etc/initramfs-tools/initramfs.conf"
printf 'virtio_pci\nvirtio_blk\next4\n' >> "$R/etc/initramfs-tools/modules"

if [ "$PRUNE" = 1 ]; then
  for k in "$R"/usr/lib/modules/*/kernel; do
    rm -rf "$k"/sound "$k"/drivers/{gpu,media,infiniband,staging,iio,usb,bluetooth,isdn} "$k"/drivers/net/{wireless,ethernet,usb,can} "$k"/net/{wireless,mac80211,bluetooth}
  done
fi

chroot "$R" /bin/sh -e -c '
  export DEBIAN_FRONTEND=noninteractive
  passwd -d root >/dev/null
  systemctl enable systemd-networkd.service ssh.service ci-ready.service >/dev/null 2>&1
  systemctl disable systemd-networkd-wait-online.service >/dev/null 2>&1 || true
  systemctl mask apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer e2scrub_reap.service fstrim.timer \
    dpkg-db-backup.timer getty@tty1.service >/dev/null 2>&1 || true
  for v in /usr/lib/modules/*; do depmod -a "$(basename $v)"; done
  update-initramfs -c -k all >/dev/null 2>&1
  apt-get clean
  rm -f /etc/machine-id /var/lib/dbus/machine-id; systemd-machine-id-setup >/dev/null 2>&1
' >"$B/chroot.log" 2>&1 || { cat "$B/chroot.log" >&2; exit 1; }
rm -rf "$R"/var/lib/apt/lists/* "$R"/tmp/*

KVER=$(ls "$R/boot" | sed -n 's/^vmlinuz-//p' | sort -V | tail -1)
[ -f "$R/boot/initrd.img-$KVER" ] || { echo "no initramfs for kernel $KVER (see $CACHE/chroot.log)" >&2; cat "$B/chroot.log" >&2; exit 1; }
cp "$R/boot/vmlinuz-$KVER" "$B/vmlinuz"; cp "$R/boot/initrd.img-$KVER" "$B/initrd"
python3 - "$B/vmlinuz" "$B/vmlinux.xz" <<'EOF'
import sys
d = open(sys.argv[1], 'rb').read(); i = d.find(b'\xfd7zXZ\x00')
if i < 0: sys.exit("no xz payload in bzImage")
open(sys.argv[2], 'wb').write(d[i:])
EOF
xz -dc "$B/vmlinux.xz" > "$B/vmlinux" 2>/dev/null || true   # trailing garbage after the xz stream -> nonzero rc; output is complete
rm -f "$B/vmlinux.xz"
[ -s "$B/vmlinux" ] || { echo "could not extract vmlinux from vmlinuz-$KVER" >&2; exit 1; }
T2=$(date +%s); log "configured in $((T2-T1)) s (kernel $KVER)"

# ---------- disk image (mkfs.ext4 -d: no mount/loop needed) ----------
truncate -s "$DISK_SIZE" "$B/root.raw"
mkfs.ext4 -q -F -L ciroot -d "$R" "$B/root.raw"
if [ "$COMPRESS" = 1 ]; then qemu-img convert -c -O qcow2 "$B/root.raw" "$B/base.qcow2"; else qemu-img convert -O qcow2 "$B/root.raw" "$B/base.qcow2"; fi
rm -f "$B/root.raw"
mv -f "$B/base.qcow2" "$B/vmlinux" "$B/vmlinuz" "$B/initrd" "$CACHE/"
cp "$B/debootstrap.log" "$B/chroot.log" "$CACHE/" 2>/dev/null || true
rm -rf "$B"
echo "$STAMP" > "$CACHE/stamp"
T3=$(date +%s)
log "image done in $((T3-T2)) s; total $((T3-T0)) s"
ls -la "$CACHE" >&2
qemu-img info "$CACHE/base.qcow2" | grep -E 'virtual size|disk size' >&2
