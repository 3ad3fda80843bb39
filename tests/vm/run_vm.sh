#!/usr/bin/env bash
# Boots a 3-node NUMA VM (QEMU, TCG) with HMAT values and runs tierflow inside it:
#   node 0: 2 CPUs, DRAM, 100 ns / 20 GB/s
#   node 1: CPU-less (a CXL expander once onlined), 300 ns / 5 GB/s, small enough to fill
#   node 2: CPU-less, 600 ns / 2 GB/s
# Inside: `tierflow topo --json` and the multi-node placement tests. The guest's verdict is
# this script's exit code; 77 (CTest's skip) with the reason when QEMU or a kernel cannot be had.
# Usage: run_vm.sh TIERFLOW_CLI MULTINODE_TESTS CACHE_DIR
set -uo pipefail
cli=$1 tests=$2
mkdir -p "$3" && cache=$(cd "$3" && pwd)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
skip() { echo "SKIPPED: $*"; exit 77; }

command -v qemu-system-x86_64 >/dev/null || skip "qemu-system-x86_64 is not installed (apt-get install qemu-system-x86)"
[ -x /bin/busybox ] || skip "busybox-static is not installed"
command -v cpio >/dev/null || skip "cpio is not installed"
python=$(command -v /usr/bin/python3 || command -v python3) || skip "python3 is needed to check the guest's JSON"


# --- a Debian kernel, unpacked from its package (6.12 preferred: it sorts CPU-less HMAT
# nodes into slower memory tiers; 6.1 is accepted) ---------------------------------------
kernel=$(ls "$cache"/boot/vmlinuz-* 2>/dev/null | head -n 1)
if [ -z "$kernel" ]; then
  pkg=""
  for meta in linux-image-6.12-amd64 linux-image-amd64; do
    pkg=$(apt-cache depends "$meta" 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
    [ -n "$pkg" ] && break
  done
  [ -n "$pkg" ] || skip "no Debian kernel package found (run apt-get update)"
  (cd "$cache" && apt-get download "$pkg" >/dev/null 2>&1) || skip "apt-get download $pkg failed"
  deb=$(ls "$cache"/linux-image-*.deb | head -n 1)
  (cd "$cache" && dpkg-deb --fsys-tarfile "$deb" | tar -x ./boot) || skip "cannot unpack $deb"
  rm -f "$deb"
  kernel=$(ls "$cache"/boot/vmlinuz-* | head -n 1)
fi

# --- the initramfs: busybox, the binaries and the shared libraries they load ---------------
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root"/{bin,sbin,proc,sys,dev,tmp,etc}
cp /bin/busybox "$root/bin/busybox"
for applet in sh mount mkdir cat echo poweroff sleep; do ln -s busybox "$root/bin/$applet"; done
cp "$cli" "$root/bin/tierflow"
cp "$tests" "$root/bin/multinode_tests"
for binary in "$cli" "$tests"; do
  ldd "$binary" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' | while read -r lib; do
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
  done
done
cp "$here/guest_init.sh" "$root/init"
chmod +x "$root/init"
(cd "$root" && find . | cpio -o -H newc 2>/dev/null | gzip -1) > "$cache/initramfs.gz"

# --- boot ---------------------------------------------------------------------------------
log="$cache/serial.log"
timeout 170 qemu-system-x86_64 \
  -accel tcg,thread=multi -machine q35,hmat=on -cpu qemu64 \
  -smp 2,sockets=1,cores=2,threads=1 -m 3G \
  -object memory-backend-ram,id=m0,size=2G \
  -object memory-backend-ram,id=m1,size=512M \
  -object memory-backend-ram,id=m2,size=512M \
  -numa node,nodeid=0,memdev=m0 \
  -numa node,nodeid=1,memdev=m1,initiator=0 \
  -numa node,nodeid=2,memdev=m2,initiator=0 \
  -numa cpu,node-id=0,socket-id=0,core-id=0,thread-id=0 \
  -numa cpu,node-id=0,socket-id=0,core-id=1,thread-id=0 \
  -numa dist,src=0,dst=1,val=20 -numa dist,src=0,dst=2,val=30 -numa dist,src=1,dst=2,val=40 \
  -numa hmat-lb,initiator=0,target=0,hierarchy=memory,data-type=access-latency,latency=100 \
  -numa hmat-lb,initiator=0,target=0,hierarchy=memory,data-type=access-bandwidth,bandwidth=20G \
  -numa hmat-lb,initiator=0,target=1,hierarchy=memory,data-type=access-latency,latency=300 \
  -numa hmat-lb,initiator=0,target=1,hierarchy=memory,data-type=access-bandwidth,bandwidth=5G \
  -numa hmat-lb,initiator=0,target=2,hierarchy=memory,data-type=access-latency,latency=600 \
  -numa hmat-lb,initiator=0,target=2,hierarchy=memory,data-type=access-bandwidth,bandwidth=2G \
  -kernel "$kernel" -initrd "$cache/initramfs.gz" \
  -append "console=ttyS0 panic=-1 rdinit=/init quiet" \
  -nographic -no-reboot -nodefaults -serial stdio </dev/null >"$log.raw" 2>&1
status=$?
# The serial log carries \r and terminal escapes.
sed -e 's/\r//g' -e 's/\x1b\[[0-9;?]*[A-Za-z]//g' "$log.raw" >"$log"
if [ $status -eq 124 ]; then
  echo "the VM did not finish within 170 s; its log:"; cat "$log"; exit 1
fi
if ! grep -q '^TIERFLOW-VM-DONE' "$log"; then
  echo "the VM stopped before the tests finished (qemu exit $status); its log:"; cat "$log"; exit 1
fi
"$python" "$here/check_guest.py" "$log"
