#!/usr/bin/env bash
# Proves the README's two commands on a machine that has none of meshtrain's packages: a clean
# Debian 12 root from debootstrap, this tree copied in, then `./run.sh --steps 20` and `./test.sh`.
# Usage (root): scripts/fresh_machine.sh [--run-only] [--keep]. About 30 minutes on 2 cores; too
# slow for CI, run it before a release-like change. Mounts live in a private mount namespace, so
# they vanish with the script whatever way it ends.
set -euo pipefail
cd "$(dirname "$0")/.."
run_only=0 keep=0
for arg in "$@"; do
  case "$arg" in
    --run-only) run_only=1 ;;
    --keep) keep=1 ;;
    *) echo "usage: scripts/fresh_machine.sh [--run-only] [--keep]" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "fresh_machine.sh: needs root (debootstrap, chroot, mounts)" >&2; exit 2; }
command -v debootstrap > /dev/null || {
  echo "fresh_machine.sh: needs debootstrap (apt-get install -y debootstrap)" >&2; exit 2; }

root=$(mktemp -d /var/tmp/meshtrain-fresh.XXXXXX)
chmod 755 "$root" # mktemp makes it 0700: the root's own users (munge, _apt) could reach nothing
cleanup() { [ "$keep" = 1 ] && echo "kept: $root" || rm -rf --one-file-system "$root"; }
trap cleanup EXIT
stamp() { date -u +%H:%M:%S; }
started=$SECONDS

echo "[$(stamp)] debootstrap --variant=minbase bookworm $root"
debootstrap --variant=minbase bookworm "$root" http://deb.debian.org/debian > "$root.debootstrap.log" 2>&1 ||
  { tail -20 "$root.debootstrap.log" >&2; exit 1; }
rm -f "$root.debootstrap.log"
cp /etc/resolv.conf "$root/etc/resolv.conf"
# This network's own certificate authorities (an egress proxy's), as a machine on it has them:
# ca-certificates takes them in when apt installs it, so npm's registry verifies.
mkdir -p "$root/usr/local/share/ca-certificates"
cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/" 2>/dev/null || true
# debootstrap writes no /etc/hosts; every installed Debian has one (the installer, cloud images and
# containers write it), and without it `localhost` does not resolve.
printf '127.0.0.1\tlocalhost\n::1\t\tlocalhost ip6-localhost ip6-loopback\n' > "$root/etc/hosts"
echo "[$(stamp)] bootstrapped in $((SECONDS - started)) s"

# The tree as git sees it: tracked files with their working changes, plus new files not ignored.
mkdir -p "$root/src/meshtrain"
git ls-files -z --cached --others --exclude-standard |
  tar --null --ignore-failed-read -T - -cf - | tar -C "$root/src/meshtrain" -xf -

steps='./run.sh --steps 20'
[ "$run_only" = 1 ] || steps="$steps && ./test.sh"
# /proc, /sys, /dev and /dev/shm from the host; /run/netns so network-namespace tests can make hosts.
unshare -m bash -euo pipefail -c '
  root=$1 steps=$2
  mount --make-rprivate /
  # The root a mount point of its own, as / is on a machine: `ip netns exec` remounts it.
  mount --bind "$root" "$root"
  for d in proc sys dev dev/shm; do mount --rbind "/$d" "$root/$d"; done
  mkdir -p "$root/run/netns"
  exec chroot "$root" /usr/bin/env -i HOME=/root TERM=dumb LANG=C.UTF-8 \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin MT_FRESH_MACHINE=1 \
    bash -c "cd /src/meshtrain && $steps"
' fresh "$root" "$steps"
echo "[$(stamp)] fresh machine passed: $steps ($((SECONDS - started)) s in all)"
