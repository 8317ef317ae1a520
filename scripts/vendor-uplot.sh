#!/usr/bin/env bash
# Vendors uPlot (https://github.com/leeoniya/uPlot, MIT), the charting library
# of the backend's live view, into backend/ui/vendor/uplot/: its minified
# script and stylesheet and its LICENSE, embedded in the binary by go:embed
# (backend/ui.go). The version is pinned here with the integrity npm's
# registry publishes for its tarball (`npm view uplot@<version> dist.integrity`);
# a tarball with another digest is refused. The output depends only on the
# tarball: re-running it leaves the tree unchanged (`--check` says whether the
# vendored files are what the pinned tarball gives, without writing).
#
#   scripts/vendor-uplot.sh           # (re-)vendor the pinned version
#   scripts/vendor-uplot.sh --check   # exit 1 if backend/ui/vendor/uplot differs
#
# To move to another version: set VERSION and INTEGRITY from `npm view uplot`
# and run it; backend's TestVendoredUPlot checks the files against the
# SHA256SUMS this writes.
set -euo pipefail

VERSION=1.6.32
INTEGRITY=sha512-KIMVnG68zvu5XXUbC4LQEPnhwOxBuLyW1AHtpm6IKTXImkbLgkMy+jabjLgSLMasNuGGzQm/ep3tOkyTxpiQIw==

root=$(cd "$(dirname "$0")/.." && pwd)
dest=$root/backend/ui/vendor/uplot
check=0
[ "${1:-}" = "--check" ] && check=1

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "uplot@$VERSION" >/dev/null)
tgz=$tmp/uplot-$VERSION.tgz
got="sha512-$(openssl dgst -sha512 -binary "$tgz" | base64 -w0)"
if [ "$got" != "$INTEGRITY" ]; then
	echo "vendor-uplot: uplot-$VERSION.tgz has integrity $got, want $INTEGRITY" >&2
	exit 1
fi

out=$tmp/out
mkdir -p "$out"
tar -xzf "$tgz" -C "$tmp" package/LICENSE package/dist/uPlot.iife.min.js package/dist/uPlot.min.css
install -m 0644 "$tmp/package/LICENSE" "$out/LICENSE"
install -m 0644 "$tmp/package/dist/uPlot.iife.min.js" "$out/uPlot.iife.min.js"
install -m 0644 "$tmp/package/dist/uPlot.min.css" "$out/uPlot.min.css"
{
	echo "# uPlot $VERSION from the npm registry ($INTEGRITY); written by scripts/vendor-uplot.sh"
	(cd "$out" && sha256sum LICENSE uPlot.iife.min.js uPlot.min.css)
} >"$tmp/SHA256SUMS"
mv "$tmp/SHA256SUMS" "$out/SHA256SUMS"

if [ $check = 1 ]; then
	if diff -r "$out" "$dest" >/dev/null 2>&1; then
		echo "vendor-uplot: $dest is uPlot $VERSION"
		exit 0
	fi
	echo "vendor-uplot: $dest differs from uPlot $VERSION (run scripts/vendor-uplot.sh)" >&2
	diff -r "$out" "$dest" >&2 || true
	exit 1
fi
rm -rf "$dest"
mkdir -p "$(dirname "$dest")"
cp -r "$out" "$dest"
echo "vendor-uplot: uPlot $VERSION in $dest"
