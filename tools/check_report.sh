#!/usr/bin/env bash
# Opens a `chunkpipe bench serve --report` HTML file in headless Chromium, takes a screenshot,
# and checks that every plot drew: histogram bars, both timeline phases and the throughput line
# must each cover some pixels. Installs Debian's chromium and python3-pil when missing.
#   tools/check_report.sh REPORT.html [SCREENSHOT.png]
set -euo pipefail
report=$(realpath "$1")
shot=${2:-/tmp/chunkpipe_report.png}
need=()
command -v chromium >/dev/null || need+=(chromium)
/usr/bin/python3 -c "import PIL" 2>/dev/null || need+=(python3-pil)
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
profile=$(mktemp -d)
timeout 120 chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync --user-data-dir="$profile" \
  --window-size=900,1700 --screenshot="$shot" "file://$report" >/dev/null 2>&1
rm -rf "$profile"
/usr/bin/python3 - "$shot" <<'PY'
import sys
from PIL import Image
img = Image.open(sys.argv[1]).convert("RGB")
counts = {}
for px in img.getdata():
    counts[px] = counts.get(px, 0) + 1
def near(rgb, tol=12):
    return sum(n for (r, g, b), n in counts.items()
               if abs(r - rgb[0]) <= tol and abs(g - rgb[1]) <= tol and abs(b - rgb[2]) <= tol)
checks = {"histogram bars": (0x44, 0x77, 0xaa), "timeline waiting": (0xcc, 0xbb, 0x44),
          "timeline decoding": (0x22, 0x88, 0x33), "throughput line": (0xaa, 0x33, 0x77)}
ok = True
for name, rgb in checks.items():
    n = near(rgb)
    print(f"{name}: {n} pixels")
    ok = ok and n > 50
print("report plots rendered" if ok else "report plots MISSING")
sys.exit(0 if ok else 1)
PY
