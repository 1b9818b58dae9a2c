#!/usr/bin/env bash
# Builds the guest image of the `microvm` runtime driver (docs/microvm.md)
# from this host's Debian packages, reproducibly:
#
#   $GSHARE_MICROVM_IMAGE (default target/microvm)/
#     vmlinuz          Debian's linux-image-cloud-amd64 kernel (apt-get download + dpkg -x:
#                      no boot hooks run on the host)
#     initramfs.cpio   busybox (static), the kernel's virtio modules, /init, and the host's
#                      python3 (/usr/bin/python3.11) with the stdlib modules listed below
#     SHA256SUMS       of both; the same packages give the same bytes (fixed mtimes,
#                      owners and inode numbers, sorted entries)
#
# The function's own files are not in it: the driver appends a small
# per-function cpio archive (the kernel unpacks concatenated archives in
# order) holding /fn/<files> and /fn/run, which /init executes.
#
# Needs: apt-get (for the kernel, unless $GSHARE_MICROVM_KERNEL_DEB names the .deb),
# busybox-static, python3.11. Takes ~10 s when the kernel package is cached.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${GSHARE_MICROVM_IMAGE:-target/microvm}"
mkdir -p "$out/cache"
out="$(cd "$out" && pwd)"
python=/usr/bin/python3.11
busybox=/bin/busybox
[ -x "$python" ] || { echo "microvm-image: $python missing (apt-get install python3.11)" >&2; exit 1; }
case "$("$busybox" 2>&1 || true)" in
  *BusyBox*) ;;
  *) echo "microvm-image: $busybox missing (apt-get install busybox-static)" >&2; exit 1 ;;
esac
if ldd "$busybox" >/dev/null 2>&1; then
  echo "microvm-image: $busybox is dynamically linked (install busybox-static)" >&2; exit 1
fi

# The kernel: the versioned package that linux-image-cloud-amd64 depends on.
deb="${GSHARE_MICROVM_KERNEL_DEB:-}"
if [ -z "$deb" ]; then
  deb="$(ls "$out"/cache/linux-image-6.*-cloud-amd64_*.deb 2>/dev/null | sort | tail -1 || true)"
fi
if [ -z "$deb" ]; then
  # apt-get download needs the package lists (absent on a fresh machine).
  apt-cache show linux-image-cloud-amd64 >/dev/null 2>&1 || apt-get update -qq
  (cd "$out/cache" && apt-get download -q linux-image-cloud-amd64 2>&1 | grep -v '^W: Download is performed unsandboxed' || true)
  meta="$(ls "$out"/cache/linux-image-cloud-amd64_*.deb | sort | tail -1)"
  dep="$(dpkg-deb -f "$meta" Depends | grep -o 'linux-image-[0-9][^ ,]*-cloud-amd64' | head -1)"
  (cd "$out/cache" && apt-get download -q "$dep" 2>&1 | grep -v '^W: Download is performed unsandboxed' || true)
  deb="$(ls "$out"/cache/"$dep"_*.deb | sort | tail -1)"
fi
kdir="$out/cache/kernel"
rm -rf "$kdir" && mkdir -p "$kdir" && dpkg -x "$deb" "$kdir"
cp "$(ls "$kdir"/boot/vmlinuz-* | head -1)" "$out/vmlinuz"
kver="$(ls "$kdir/lib/modules" | head -1)"

root="$out/cache/root"
rm -rf "$root" && mkdir -p "$root"/{bin,dev,proc,sys,tmp,fn,modules,etc}
cp "$busybox" "$root/bin/busybox"
for a in sh mount insmod ip cat echo sleep poweroff ls; do ln -s busybox "$root/bin/$a"; done
# In load order (virtio_net needs net_failover needs failover; virtio_mmio
# is the microvm machine's transport).
for m in drivers/virtio/virtio_ring drivers/virtio/virtio drivers/virtio/virtio_mmio \
         net/core/failover drivers/net/net_failover drivers/net/virtio_net; do
  cp "$kdir/lib/modules/$kver/kernel/$m.ko" "$root/modules/"
done
cat > "$root/init" <<'INIT'
#!/bin/sh
# gshare microVM guest init: modules, network (QEMU user net), then the
# function (it becomes PID 1: when it exits the kernel panics, panic=-1
# reboots and -no-reboot ends QEMU, which the driver sees as a crash).
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in virtio_ring virtio virtio_mmio failover net_failover virtio_net; do
  insmod /modules/$m.ko || echo "gshare-init: insmod $m failed"
done
ip link set lo up
ip link set eth0 up
ip addr add 10.0.2.15/24 dev eth0
ip route add default via 10.0.2.2
echo "gshare-init: network up; starting the function"
cd /fn
exec /bin/sh /fn/run
INIT
chmod 755 "$root/init"

# python3 with the stdlib modules an HTTP function server typically needs.
modules="runpy json http.server socketserver argparse threading signal subprocess
  time os sys socket select selectors email.parser email.message email.utils urllib.parse
  html mimetypes shutil posixpath io base64 hashlib random struct datetime logging
  traceback collections functools itertools typing dataclasses copy re codecs
  encodings.idna encodings.utf_8 encodings.latin_1 encodings.ascii stat errno"
files="$("$python" -S -c '
import sys, importlib
for m in sys.argv[1:]:
    importlib.import_module(m)
import site  # the start-up imports of a normal run
out = set()
for mod in list(sys.modules.values()):
    f = getattr(mod, "__file__", None)
    if f and f.startswith("/usr/lib/python3"):
        out.add(f)
        c = getattr(mod, "__cached__", None)
        if c:
            out.add(c)
print("\n".join(sorted(out)))
' $modules)"
# The landmark python uses to find its prefix, and what `site` reads.
files="$files
/usr/lib/python3.11/os.py
/usr/lib/python3.11/encodings/__init__.py"
mkdir -p "$root/usr/bin"
cp "$python" "$root/usr/bin/python3.11"
ln -s python3.11 "$root/usr/bin/python3"
for f in $files; do
  [ -f "$f" ] || continue
  mkdir -p "$root$(dirname "$f")"
  cp "$f" "$root$f"
done
for lib in $(ldd "$python" | grep -o '/[^ ]*'); do
  real="$(readlink -f "$lib")"
  mkdir -p "$root$(dirname "$lib")"
  cp "$real" "$root$lib"
done

# A deterministic newc archive (no cpio binary needed).
"$python" - "$root" "$out/initramfs.cpio" <<'PY'
import os, stat, sys
root, dest = sys.argv[1], sys.argv[2]
paths = []
for d, dirs, names in os.walk(root):
    for n in dirs + names:
        paths.append(os.path.relpath(os.path.join(d, n), root))
paths.sort()
def header(ino, mode, size, name, nlink=1):
    fields = [ino, mode, 0, 0, nlink, 0, size, 0, 0, 0, 0, len(name) + 1, 0]
    return b"070701" + b"".join(b"%08X" % f for f in fields)
def pad(n):
    return b"\0" * ((4 - n % 4) % 4)
with open(dest, "wb") as out:
    for ino, p in enumerate(paths, 1):
        full = os.path.join(root, p)
        st = os.lstat(full)
        name = p.encode()
        if stat.S_ISLNK(st.st_mode):
            data, mode = os.readlink(full).encode(), 0o120777
        elif stat.S_ISDIR(st.st_mode):
            data, mode = b"", 0o40755
        else:
            data = open(full, "rb").read()
            mode = 0o100755 if st.st_mode & 0o111 else 0o100644
        h = header(ino, mode, len(data), name, 2 if stat.S_ISDIR(st.st_mode) else 1)
        out.write(h + name + b"\0" + pad(len(h) + len(name) + 1) + data + pad(len(data)))
    t = header(0, 0, 0, b"TRAILER!!!")
    out.write(t + b"TRAILER!!!\0" + pad(len(t) + 11))
PY
(cd "$out" && sha256sum vmlinuz initramfs.cpio > SHA256SUMS)
echo "microvm-image: $out (kernel $kver, initramfs $(($(stat -c %s "$out/initramfs.cpio") / 1024 / 1024)) MiB)"
