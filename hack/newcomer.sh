#!/usr/bin/env bash
# The README's first screen, run as a newcomer runs it, on the built tools:
#   1. `make run ARGS="--once"` converges and says so;
#   2. `bin/matbus dev` (what `make run` starts) prints "Next steps", and the
#      README's copy of that block is the same, addresses aside;
#   3. each next-step command, exactly as dev printed it, exits 0 and prints
#      the key lines the README shows (`errors` follows: it must say that it
#      is following, then exit 0 on Ctrl-C);
#   4. the last one makes a simulator fail: status shows it out of rotation
#      with a fetch error and dev prints the error; healed, it is back in
#      rotation;
#   5. `bin/matbus status` with no flags (namespace default) exits non-zero
#      and names the namespace that has a pipeline.
# kubectl and curl are optional for a newcomer: without one, its step is
# reported as skipped. Needs etcd and kube-apiserver in .bin/ (`make run` builds them)
# and port 4222, as `make run` does. Takes about half a minute.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
devpid=
cleanup() {
	if [ -n "$devpid" ] && kill -0 "$devpid" 2>/dev/null; then
		kill -INT "$devpid" 2>/dev/null || true
		wait "$devpid" 2>/dev/null || true
	fi
	# dev keeps its process log file after a run, for reading; these runs' go.
	for f in "$work"/*.txt; do
		[ -f "$f" ] || continue
		sed -n 's/^Process logs  *\([^ ]*\) .*/\1/p' "$f" | while read -r l; do rm -f "$l"; done
	done
	rm -rf "$work"
}
trap cleanup EXIT
fail() {
	echo "newcomer: FAIL: $1" >&2
	if [ -n "${2:-}" ] && [ -f "$2" ]; then echo "--- $2:" >&2; tail -40 "$2" >&2; fi
	exit 1
}
step() { echo ">> newcomer: $*"; }
# need FILE TEXT: FILE has a line containing TEXT (fixed string), and so does the README.
need() {
	grep -qF -- "$2" "$1" || fail "output has no line with '$2'" "$1"
	grep -qF -- "$2" README.md || fail "README.md does not show '$2' (README and output disagree)"
}
# addresses of one run: ports and temporary folders differ from run to run.
normalize() { sed -E -e 's#127\.0\.0\.1:[0-9]+#127.0.0.1:PORT#g' -e 's#/tmp/matbus-dev-[0-9]+#/tmp/matbus-dev-N#g'; }
# nextsteps FILE: the "Next steps (" line and the indented lines after it.
nextsteps() { awk '/^Next steps \(/{p=1; print; next} p && /^  /{print; next} p{exit}' "$1"; }
# status_until CMD OUT REGEX WHAT: run the status command until a line matches.
status_until() {
	for _ in $(seq 1 60); do
		bash -c "$1" >"$2" 2>&1 || fail "status exited $?" "$2"
		grep -qE "$3" "$2" && return 0
		sleep 0.5
	done
	fail "status: after 30 s, $4" "$2"
}

step 'make run ARGS="--once"'
make run ARGS="--once" >"$work/once.txt" 2>&1 || fail "make run ARGS=\"--once\" exited $?" "$work/once.txt"
need "$work/once.txt" "All 22 Services in place after"
need "$work/once.txt" '{"converged":true,"services":22,"expected":22,"errors":0,'

step "bin/matbus dev (in the background) until it prints its next steps"
bin/matbus dev >"$work/dev.txt" 2>"$work/dev.err" &
devpid=$!
for _ in $(seq 1 360); do
	nextsteps "$work/dev.txt" | grep -q "matsim/fault" && break
	kill -0 "$devpid" 2>/dev/null || fail "bin/matbus dev exited before printing its next steps" "$work/dev.txt"
	sleep 0.5
done
nextsteps "$work/dev.txt" >"$work/next.txt"
grep -q "matsim/fault" "$work/next.txt" || fail "no next steps from bin/matbus dev within 3 minutes" "$work/dev.txt"
need "$work/dev.txt" "All 22 Services in place after"

step "the README's next steps are the ones dev prints"
nextsteps README.md >"$work/readme-next.txt"
[ -s "$work/readme-next.txt" ] || fail "README.md has no \"Next steps (\" block"
if ! diff <(normalize <"$work/readme-next.txt") <(normalize <"$work/next.txt") >"$work/next.diff"; then
	fail "README.md's next steps (<) differ from those bin/matbus dev prints (>)" "$work/next.diff"
fi

grep -v '^  #' "$work/next.txt" | sed -n 's/^  //p' >"$work/cmds.txt"
[ "$(wc -l <"$work/cmds.txt")" -eq 6 ] || fail "want 6 next-step commands" "$work/cmds.txt"
status=$(grep '^bin/matbus status ' "$work/cmds.txt") || fail "no status command" "$work/cmds.txt"
n=0
while IFS= read -r cmd; do
	n=$((n + 1))
	out="$work/cmd$n.txt"
	case "$cmd" in
	*"bin/matbus status "*)
		step "$cmd"
		# The discovery leader writes each instance's state within a second
		# or two of its first sync, and a person takes longer than that to
		# paste: until then a row may say "never" and "-".
		for try in $(seq 1 20); do
			bash -c "$cmd" >"$out" 2>&1 || fail "status exited $?" "$out"
			grep -qE '^INSTANCE +URL +ROTATION +LAST SYNC +SERVICES \(BMC/NVOS\) +HELD +LAST ERROR +WORKER +PUBLISHED' "$out" || fail "status: no header" "$out"
			ok=1
			for i in 0 1; do
				grep -qE "^matbus-dev\.mat-$i +https://127\.0\.0\.1:[0-9]+ +in \(poll [0-9.]+m?s\) +[0-9]+s ago +10/1 +- +- +dev-worker-[0-9] +yes" "$out" || ok=
			done
			[ -n "$ok" ] && break
			[ "$try" -lt 20 ] || fail "status: after 10 s an instance is still not in rotation with a good sync, 10/1 Services, nothing held, no error, a worker, published" "$out"
			sleep 0.5
		done
		need "$out" "2 instances, 22 Services; matbus-sync-matbus-dev 0 pending, 0 ack-pending; matbus-delete-matbus-dev 0 pending, 0 ack-pending; discovery leader discovery/dev (leading"
		;;
	*"bin/matbus errors "*)
		step "$cmd (then Ctrl-C)"
		bash -c "exec $cmd" >"$out" 2>&1 &
		epid=$!
		for _ in $(seq 1 60); do
			grep -q "^following error events" "$out" && break
			kill -0 "$epid" 2>/dev/null || break
			sleep 0.25
		done
		need "$out" "following error events on mat.errors.> of stream MAT_ERRORS: those of the last 1h0m0s, then new ones (Ctrl-C stops)"
		kill -INT "$epid"
		code=0
		wait "$epid" || code=$?
		[ "$code" -eq 0 ] || fail "errors exited $code on Ctrl-C" "$out"
		;;
	*"bin/matbus plan "*)
		step "$cmd"
		bash -c "$cmd" >"$out" 2>&1 || fail "plan exited $?" "$out"
		need "$out" "no change (0 adoptions that only add matbus's labels and annotation)"
		;;
	*"bin/matbus check "*)
		step "$cmd"
		bash -c "$cmd" >"$out" 2>&1 || fail "check exited $?" "$out"
		need "$out" "no problem found."
		;;
	*"kubectl get svc "*)
		if ! command -v kubectl >/dev/null; then
			step "SKIP (no kubectl on this machine): $cmd"
			continue
		fi
		step "$cmd"
		bash -c "$cmd" >"$out" 2>&1 || fail "kubectl exited $?" "$out"
		[ "$(grep -c ' ClusterIP ' "$out")" -eq 22 ] || fail "kubectl: want 22 Services" "$out"
		;;
	*"curl -sSk -X PUT --data 500 "*"/matsim/fault")
		if ! command -v curl >/dev/null; then
			step "SKIP (no curl on this machine): $cmd"
			continue
		fi
		step "$cmd"
		bash -c "$cmd" >"$out" 2>&1 || fail "curl exited $?" "$out"
		need "$out" "fault 500: every status request fails that way; PUT none to heal"
		step "status shows mat-1 out of rotation with a fetch error"
		status_until "$status" "$work/failed.txt" "^matbus-dev\.mat-1 .* OUT \(probe [0-9.]+m?s, [0-9]+ failed\) .* fetch [0-9]+s ago " "mat-1 is not OUT of rotation with a fetch error"
		grep -qE "^matbus-dev\.mat-0 .* in \(poll " "$work/failed.txt" || fail "status: mat-0 left rotation too" "$work/failed.txt"
		need "$work/failed.txt" "OUT (probe"
		need "$work/dev.txt" "instance taken out of rotation after 3 consecutive failed status fetches"
		heal=${cmd/--data 500/--data none}
		step "$heal"
		bash -c "$heal" >"$work/heal.txt" 2>&1 || fail "curl exited $?" "$work/heal.txt"
		need "$work/heal.txt" "fault none: status requests are served normally"
		status_until "$status" "$work/healed.txt" "^matbus-dev\.mat-1 .* in \(poll " "mat-1 is not back in rotation"
		for _ in $(seq 1 20); do
			grep -qF "resolved: instance recovered" "$work/dev.txt" && break
			sleep 0.5
		done
		need "$work/dev.txt" "resolved: instance recovered"
		;;
	*) fail "unexpected next-step command: $cmd" ;;
	esac
done <"$work/cmds.txt"

step "bin/matbus status with no flags (namespace default) names the namespace that has a pipeline"
code=0
bin/matbus status >"$work/noflags.txt" 2>&1 || code=$?
[ "$code" -ne 0 ] || fail "status in a namespace without a pipeline exited 0" "$work/noflags.txt"
grep -qF 'no matbus pipeline in namespace "default"' "$work/noflags.txt" &&
	grep -qF "namespace matbus-dev has one on this NATS: give --namespace matbus-dev" "$work/noflags.txt" ||
	fail "status without flags does not say where the pipeline is" "$work/noflags.txt"

step "Ctrl-C stops bin/matbus dev"
kill -INT "$devpid"
code=0
wait "$devpid" || code=$?
devpid=
[ "$code" -eq 0 ] || fail "bin/matbus dev exited $code on Ctrl-C" "$work/dev.txt"
echo ">> newcomer: ok"
