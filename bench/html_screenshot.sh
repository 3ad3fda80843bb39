#!/usr/bin/env bash
# Renders a `tierflow bench --html` page in headless Chromium and checks the screenshot is a
# real picture (a PNG of the requested size, not blank): the page needs no network and no
# script. Installs Debian's chromium when missing (root).
# Usage: bench/html_screenshot.sh [TIERFLOW_BINARY] [OUT_DIR]
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tierflow=${1:-$here/build/release/bin/tierflow}
out=${2:-$here/build/bench-html}
mkdir -p "$out"
if ! command -v chromium >/dev/null; then
  source "$here/scripts/setup.sh"
  tierflow_install_packages chromium
fi
"$tierflow" bench --buffer-mib 64 --link-mib 64 --samples 3 --no-cache \
  --html "$out/bench.html" --json >"$out/bench.json"
timeout 120 chromium --headless --no-sandbox --disable-gpu --hide-scrollbars \
  --window-size=1200,2400 --screenshot="$out/bench.png" "file://$out/bench.html" 2>/dev/null
/usr/bin/env python3 - "$out/bench.png" <<'PY'
import struct, sys, zlib
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
width, height = struct.unpack(">II", data[16:24])
assert (width, height) == (1200, 2400), f"unexpected size {width}x{height}"
# Distinct byte values in the image data: a blank page compresses to almost nothing.
chunks, at = [], 8
while at < len(data):
    n, kind = struct.unpack(">I4s", data[at:at + 8])
    if kind == b"IDAT":
        chunks.append(data[at + 8:at + 8 + n])
    at += 12 + n
raw = zlib.decompress(b"".join(chunks))
assert len(set(raw)) > 16, "the screenshot is (nearly) blank"
print(f"{sys.argv[1]}: {width}x{height}, {len(data)} bytes, {len(set(raw))} distinct byte values")
PY
echo "page: $out/bench.html"
