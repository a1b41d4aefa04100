#!/usr/bin/env bash
# Fails when a tracked file is larger than 1 MiB, or is a symbolic link: the
# repository holds source, not build outputs (a binary built at the root and
# added by mistake is the usual case; a link to a local tools folder, such as
# .bin, breaks every clone). Known large fixtures may be listed in ALLOWED,
# one path each.
set -euo pipefail
cd "$(dirname "$0")/.."
limit=$((1024 * 1024))
ALLOWED=()
status=0
while IFS= read -r -d '' f; do
	[ -f "$f" ] || continue # deleted in the work tree, not yet committed
	size=$(stat -c %s "$f")
	[ "$size" -le "$limit" ] && continue
	for a in "${ALLOWED[@]}"; do [ "$a" = "$f" ] && continue 2; done
	echo "tracked file larger than 1 MiB: $f ($size bytes); build outputs are not committed (git rm --cached '$f', and add it to .gitignore)" >&2
	status=1
done < <(git ls-files -z)
# Mode 120000 is a symbolic link in git's index.
while IFS= read -r f; do
	echo "tracked symbolic link: $f (a clone gets a link to a path of this machine); git rm --cached '$f', and ignore it in .gitignore" >&2
	status=1
done < <(git ls-files -s | awk '$1 == "120000" { sub(/^[^\t]*\t/, ""); print }')
exit $status
