#!/usr/bin/env bash
# `make kube-e2e`: the Helm chart on a real single-node Kubernetes cluster
# made on this machine from the project's own files
# (docs/adr/0021-kube-e2e-node.md). Run as root on a Debian machine:
#
#   1. installs containerd, runc, the CNI plugins, iptables, nftables, curl
#      and dnsutils with apt when missing (no service may start);
#   2. builds the node with hack/tools.sh node: etcd, kube-apiserver,
#      kube-controller-manager, kube-scheduler, kubelet, kube-proxy and kubectl
#      of one Kubernetes module (tools/k8s), CoreDNS (tools/coredns), the
#      image builder and the pause program (tools/image), nats-server;
#   3. builds the images (no registry is reachable): the pause image, the
#      matbus image (a static matbus as deploy/Dockerfile's runtime stage has
#      it; also the MAT simulator's), a NATS image and a stand-in of the MAT
#      protocol gateway (deploytest/gatewaystandin), with .bin/ociimage;
#   4. starts, all under one run folder (mktemp -d /tmp/matbus-ke2e.XXXXXX):
#      a private containerd (own root, state, socket, CNI config), a bridge
#      mbke2e0 with the pod network 10.214.0.0/24 (gateway 10.214.0.1), a
#      PKI made with openssl, etcd, kube-apiserver, kube-controller-manager,
#      kube-scheduler, kubelet (cgroupfs, cgroup v1, its own cgroup root),
#      kube-proxy (iptables) and CoreDNS on 10.214.0.1:53; services get
#      ClusterIPs from 10.96.0.0/12, routed onto the bridge only;
#   5. checks the node: Ready, a pod of the matbus image runs to completion, a
#      pod reaches https://kubernetes.default.svc (cluster DNS, ClusterIP
#      routing), the host reaches it through the ClusterIP with the CA the
#      pods get (kube-root-ca.crt), CoreDNS answers;
#   6. runs the scenario, deploytest/kubee2e (skipped with a message while
#      that folder does not exist);
#   7. on any exit: prints state and log tails on failure, stops the kubelet,
#      kills and deletes every container, stops every process it started
#      (each names the run folder), `kube-proxy --cleanup`, unmounts, removes
#      the bridge, veths, netns, cgroups, and the paths containerd and CNI
#      made, restores sysctls and the firewall, then diffs the host against a
#      snapshot taken before and fails on any difference.
#
# Each phase prints its time. KUBE_E2E_KEEP=1 leaves the cluster running
# (its KUBECONFIG is printed); `bash hack/kube-e2e.sh down <run folder>` then
# stops it and restores the host. KUBE_E2E_SKIP_SCENARIO=1 brings the node up,
# checks it and tears it down without the scenario.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
bin=$root/.bin
# Image root file systems are made here: give them the usual modes whatever
# the caller's umask.
umask 022

bridge=mbke2e0
node_ip=10.214.0.1
pod_cidr=10.214.0.0/24
service_cidr=10.96.0.0/12
api_cluster_ip=10.96.0.1
node=matbus-ke2e
pause_image=registry.k8s.io/pause:3.10
matbus_image=docker.io/matbus/matbus:kube-e2e
nats_image=docker.io/library/nats:kube-e2e
gateway_image=docker.io/matbus/gateway-standin:kube-e2e
# What a run may make outside its folder (containerd's shim sockets, CNI's
# result cache, kubelet's legacy log links, the netns folder): removed at the
# end when the run made them.
host_paths=(/run/containerd /var/lib/cni /var/log/containers /var/log/pods /var/run/netns /var/lib/kubelet
	/etc/cni /opt/cni /opt/containerd /var/lib/containerd /etc/kubernetes /usr/libexec/kubernetes /run/runc /var/run/kubernetes)

trap 'echo ">> kube-e2e: failed at line $LINENO: $BASH_COMMAND" >&2' ERR
log() { printf '>> kube-e2e: %s\n' "$*"; }
die() { printf '>> kube-e2e: FAIL: %s\n' "$*" >&2; exit 1; }

if [ "$(id -u)" != 0 ]; then
	die "runs as root (it installs packages, starts containerd and a kubelet, and changes the network)"
fi

# --- phase timing ---------------------------------------------------------
timings=()
phase_name="" phase_t0=$SECONDS start_t0=$SECONDS
phase() {
	local now=$SECONDS
	if [ -n "$phase_name" ]; then
		timings+=("$(printf '%-34s %4ds' "$phase_name" $((now - phase_t0)))")
	fi
	phase_name=$1 phase_t0=$now
	[ -n "$1" ] && log "phase: $1"
	return 0
}
print_timings() {
	phase ""
	printf '>> kube-e2e: phase times\n'
	for l in "${timings[@]}"; do printf '   %s\n' "$l"; done
	printf '   %-34s %4ds\n' "total" $((SECONDS - start_t0))
}

# --- host snapshot ----------------------------------------------------------
# Everything a run may change, one file each; `cleanup` diffs them.
snap_files="iptables ip6tables nft sysctl links addrs routes mounts netns cgroups paths modules"
snapshot() { # <run> <suffix>
	local r=$1 s=$2 p
	# (sed, not grep: an empty rule set must not fail the pipeline)
	{ iptables-save 2>/dev/null || true; } | sed -e '/^#/d' -e 's/\[[0-9]*:[0-9]*\]//' >"$r/iptables.$s"
	{ ip6tables-save 2>/dev/null || true; } | sed -e '/^#/d' -e 's/\[[0-9]*:[0-9]*\]//' >"$r/ip6tables.$s"
	{ nft list ruleset 2>/dev/null || true; } >"$r/nft.$s"
	# Every sysctl but the counters that move by themselves.
	{ sysctl -a 2>/dev/null || true; } |
		sed -E '/^(fs\.(dentry-state|file-nr|inode-nr|inode-state|aio-nr|quota\.[a-z_]+)|kernel\.(ns_last_pid|pty\.nr|random\.[a-z_]+)|net\.netfilter\.nf_conntrack_count) = /d' |
		sort >"$r/sysctl.$s"
	ip -o link show | awk -F': ' '{print $2}' | sed 's/@.*//' | sort >"$r/links.$s"
	ip -o addr show | awk '{print $2, $3, $4}' | sort >"$r/addrs.$s"
	{ ip route show table all; ip rule show; } | sort >"$r/routes.$s"
	awk '{print $5}' /proc/self/mountinfo | sort >"$r/mounts.$s"
	{ ip netns list 2>/dev/null || true; } | sort >"$r/netns.$s"
	# cgroup folders two levels deep (the per-command ones of this machine's
	# process manager come and go by themselves) and everything under ours.
	find /sys/fs/cgroup -mindepth 1 -maxdepth 2 -type d 2>/dev/null | grep -v '/process_api/' | sort >"$r/cgroups.$s" || true
	find /sys/fs/cgroup -mindepth 2 -maxdepth 2 -type d -name "$(basename "$r")" 2>/dev/null | sort >>"$r/cgroups.$s" || true
	for p in "${host_paths[@]}"; do
		if [ -e "$p" ]; then find "$p" -maxdepth 2 2>/dev/null | sort; fi
	done >"$r/paths.$s"
	{ awk '{print $1}' /proc/modules 2>/dev/null || true; } | sort >"$r/modules.$s"
}

# --- cleanup ----------------------------------------------------------------
# Works from the run folder alone, so `down <run>` can undo a kept run.
kill_run_processes() { # <run> <signal>
	local r=$1 sig=$2 p found=1
	for p in /proc/[0-9]*; do
		[ "${p#/proc/}" = $$ ] && continue
		if tr '\0' ' ' 2>/dev/null <"$p/cmdline" | grep -q "$r/"; then
			kill "-$sig" "${p#/proc/}" 2>/dev/null && found=0
		fi
	done
	return $found
}
run_processes_left() { # <run>
	local p
	for p in /proc/[0-9]*; do
		[ "${p#/proc/}" = $$ ] && continue
		tr '\0' ' ' 2>/dev/null <"$p/cmdline" | grep -q "$1/" && return 0
	done
	return 1
}
stop_matching() { # <run> <program>: its processes of this run; SIGTERM, 15 s, SIGKILL
	local r=$1 prog=$2 p pids=() argv0
	for p in /proc/[0-9]*; do
		argv0=$(tr '\0' '\n' 2>/dev/null <"$p/cmdline" | head -1) || continue
		[ "${argv0##*/}" = "$prog" ] || continue
		tr '\0' ' ' 2>/dev/null <"$p/cmdline" | grep -q "$r/" && pids+=("${p#/proc/}")
	done
	[ ${#pids[@]} -gt 0 ] || return 0
	kill -TERM "${pids[@]}" 2>/dev/null
	for _ in $(seq 30); do
		kill -0 "${pids[@]}" 2>/dev/null || return 0
		sleep 0.5
	done
	log "$prog (${pids[*]}) did not stop in 15s: SIGKILL"
	kill -KILL "${pids[@]}" 2>/dev/null
	sleep 0.5
}
cgroup_kill_and_remove() { # <cgroup folder name>
	local cg=$1 d pid
	for d in /sys/fs/cgroup/*/"$cg"; do
		[ -d "$d" ] || continue
		find "$d" -name cgroup.procs -exec cat {} + 2>/dev/null | while read -r pid; do kill -KILL "$pid" 2>/dev/null; done
	done
	sleep 0.5
	for d in /sys/fs/cgroup/*/"$cg"; do
		[ -d "$d" ] || continue
		find "$d" -depth -type d -exec rmdir {} + 2>/dev/null
		[ ! -d "$d" ] || log "cgroup $d is still there: $(find "$d" -name cgroup.procs -exec cat {} + 2>/dev/null | tr '\n' ' ')"
	done
}
undo_host() { # <run>: everything but the processes, then the diff; returns 1 on a changed host
	local r=$1 m l p f changed=0 k v
	# Mounts under the run folder (rootfs, netns, kubelet volumes), deepest first.
	awk '{print $5}' /proc/self/mountinfo | grep -E "^$r/" | sort -r | while read -r m; do umount -l "$m" 2>/dev/null; done
	cgroup_kill_and_remove "$(basename "$r")"
	# Links: our bridge, and veths the CNI plugin left (a pod netns gone
	# takes its veth along; this catches the rest).
	ip link del "$bridge" 2>/dev/null
	ip -o link show | awk -F': ' '{print $2}' | sed 's/@.*//' | sort | comm -13 "$r/links.before" - |
		grep -E '^veth' | while read -r l; do log "removing link $l"; ip link del "$l"; done
	# Paths containerd, CNI and the kubelet made outside the run folder (the
	# kubelet links every container's log into /var/log/containers).
	[ ! -d /var/log/containers ] || find /var/log/containers -maxdepth 1 -lname "$r/*" -delete
	for p in "${host_paths[@]}"; do
		if [ -e "$p" ] && ! grep -qxF "$p" "$r/paths.before"; then
			log "removing $p (made by this run: $(find "$p" -mindepth 1 -maxdepth 2 | head -5 | tr '\n' ' '))"
			awk '{print $5}' /proc/self/mountinfo | grep -E "^$p/" | sort -r | while read -r m; do umount -l "$m"; done
			rm -rf "$p"
		fi
	done
	# Sysctls: the kubelet sets vm.overcommit_memory, kernel.panic,
	# kernel.panic_on_oops and the key quotas; the CNI bridge and this script
	# net.ipv4.ip_forward. Back to what they were.
	# net.ipv4.ip_forward first: it sets every interface's forwarding (and
	# what follows from it), then whatever still differs.
	sysctl -qw net.ipv4.ip_forward="$(sed -n 's/^net\.ipv4\.ip_forward = //p' "$r/sysctl.before")"
	snapshot "$r" after
	diff "$r/sysctl.before" "$r/sysctl.after" | sed -n 's/^< //p' | while IFS= read -r l; do
		k=${l%% = *} v=${l#* = }
		grep -q "^$k = " "$r/sysctl.after" || continue # a link's, gone with the link
		sysctl -qw "$k=$v" >/dev/null 2>&1 && log "sysctl $k restored to $v"
	done
	# Firewall: tables made by this run go; tables that were there get their
	# saved rules back.
	if ! diff -q "$r/nft.before" "$r/nft.after" >/dev/null || ! diff -q "$r/iptables.before" "$r/iptables.after" >/dev/null ||
		! diff -q "$r/ip6tables.before" "$r/ip6tables.after" >/dev/null; then
		if command -v nft >/dev/null; then
			nft list tables 2>/dev/null | while read -r _ fam name; do
				grep -q "^table $fam $name {" "$r/nft.before" && continue
				log "removing nftables table $fam $name (made by this run)"
				nft delete table "$fam" "$name"
			done
		fi
		[ ! -s "$r/iptables.restore" ] || iptables-restore <"$r/iptables.restore" 2>/dev/null
		[ ! -s "$r/ip6tables.restore" ] || ip6tables-restore <"$r/ip6tables.restore" 2>/dev/null
	fi
	snapshot "$r" after
	for f in $snap_files; do
		if ! diff -u "$r/$f.before" "$r/$f.after" >"$r/$f.diff"; then
			changed=1
			log "the host's $f changed:"
			sed 's/^/   /' "$r/$f.diff" | head -40
		fi
	done
	if [ $changed = 0 ]; then
		log "host unchanged: iptables, ip6tables, nftables, sysctls, links, addresses, routes, mounts, netns, cgroups, paths (diffed before/after)"
	fi
	return $changed
}
teardown() { # <run>: stop the node and undo the host; returns 1 on a changed host
	local r=$1 ctr_a t c
	ctr_a=(ctr --address "$r/containerd/containerd.sock" --namespace k8s.io)
	# The kubelet first, so it restarts nothing; then every container.
	stop_matching "$r" kubelet
	if [ -S "$r/containerd/containerd.sock" ] && "${ctr_a[@]}" version >/dev/null 2>&1; then
		for t in $("${ctr_a[@]}" tasks ls -q 2>/dev/null); do "${ctr_a[@]}" tasks kill -s SIGKILL "$t" >/dev/null 2>&1; done
		sleep 1
		for t in $("${ctr_a[@]}" tasks ls -q 2>/dev/null); do "${ctr_a[@]}" tasks delete -f "$t" >/dev/null 2>&1; done
		for c in $("${ctr_a[@]}" containers ls -q 2>/dev/null); do "${ctr_a[@]}" containers delete "$c" >/dev/null 2>&1; done
	fi
	# Whatever is still in the pods' cgroups.
	cgroup_kill_and_remove "$(basename "$r")/kubepods"
	# The rest: kube-proxy, CoreDNS, the control plane, containerd, shims.
	stop_matching "$r" kube-proxy
	[ ! -x "$bin/kube-proxy" ] || "$bin/kube-proxy" --cleanup >"$r/kube-proxy-cleanup.log" 2>&1 ||
		{ log "kube-proxy --cleanup failed:"; tail -5 "$r/kube-proxy-cleanup.log"; }
	stop_matching "$r" coredns
	stop_matching "$r" kube-scheduler
	stop_matching "$r" kube-controller-manager
	stop_matching "$r" kube-apiserver
	stop_matching "$r" etcd
	stop_matching "$r" containerd
	if kill_run_processes "$r" TERM; then
		sleep 2
		if run_processes_left "$r"; then
			log "processes naming $r left: SIGKILL"
			kill_run_processes "$r" KILL
			sleep 0.5
		fi
	fi
	undo_host "$r"
}

if [ "${1:-}" = down ]; then
	r=${2:-}
	if [ -z "$r" ] || [ ! -f "$r/links.before" ]; then die "usage: $0 down <run folder of a KUBE_E2E_KEEP=1 run>"; fi
	r=$(cd "$r" && pwd)
	rc=0
	teardown "$r" || rc=1
	rm -rf "$r"
	exit $rc
fi

# --- 1. packages ------------------------------------------------------------
phase "packages (apt)"
need=()
for c in containerd:containerd ctr:containerd runc:runc /usr/lib/cni/bridge:containernetworking-plugins \
	iptables-save:iptables nft:nftables curl:curl dig:dnsutils openssl:openssl ip:iproute2 sysctl:procps flock:util-linux; do
	if [ "${c:0:1}" = / ]; then [ -x "${c%%:*}" ] || need+=("${c#*:}"); else command -v "${c%%:*}" >/dev/null 2>&1 || need+=("${c#*:}"); fi
done
if [ ${#need[@]} -gt 0 ]; then
	mapfile -t need < <(printf '%s\n' "${need[@]}" | sort -u)
	log "installing ${need[*]} (Debian packages)"
	# No system containerd may start from the install: deny service starts.
	policy_made=""
	if [ ! -e /usr/sbin/policy-rc.d ]; then
		printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
		chmod 755 /usr/sbin/policy-rc.d
		policy_made=1
	fi
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
	[ -z "$policy_made" ] || rm -f /usr/sbin/policy-rc.d
fi
for p in bridge host-local portmap loopback; do
	[ -x "/usr/lib/cni/$p" ] || die "/usr/lib/cni/$p is missing (Debian's containernetworking-plugins)"
done
containerd --version
runc --version | head -1

# --- 2. tools ---------------------------------------------------------------
phase "tools (hack/tools.sh node)"
bash hack/tools.sh node
for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl coredns nats-server ociimage pause; do
	[ -x "$bin/$b" ] || die ".bin/$b is missing after hack/tools.sh node"
done
for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy coredns nats-server pause; do
	go version -m "$bin/$b" | grep -q 'CGO_ENABLED=0' ||
		die ".bin/$b is not a static build (CGO_ENABLED=0); remove .bin/*.stamp and run hack/tools.sh node"
done
"$bin/kubelet" --version

# --- host state before, and cleanup on every exit ---------------------------
# One run at a time (the lock is this script: no file is made for it).
exec 9<"$root/hack/kube-e2e.sh"
flock -n 9 || die "another make kube-e2e is running"
run=$(mktemp -d /tmp/matbus-ke2e.XXXXXX)
chmod 755 "$run"
cgroot=$(basename "$run")
export KUBECONFIG=$run/admin.kubeconfig
ctr_a=(ctr --address "$run/containerd/containerd.sock" --namespace k8s.io)
kc() { "$bin/kubectl" --kubeconfig "$run/admin.kubeconfig" "$@"; }
bg_pids=()

dump_state() {
	log "node state"
	kc get nodes -o wide 2>&1 | sed 's/^/   /'
	kc get pods -A -o wide 2>&1 | sed 's/^/   /'
	kc get events -A --sort-by=.lastTimestamp 2>&1 | tail -40 | sed 's/^/   /'
	"${ctr_a[@]}" tasks ls 2>&1 | sed 's/^/   /'
	local f
	for f in "$run"/logs/*.log; do
		[ -f "$f" ] || continue
		log "last lines of $(basename "$f")"
		tail -n 40 "$f" | cut -c1-400 | sed 's/^/   /'
	done
}
cleanup() {
	local rc=$?
	set +e
	trap - EXIT INT TERM ERR
	phase "cleanup"
	local p
	for p in "${bg_pids[@]}"; do kill -TERM -- "-$p" 2>/dev/null; done
	if [ $rc = 130 ]; then
		log "interrupted"
	elif [ $rc != 0 ] && [ -d "$run/logs" ]; then
		log "failed (exit $rc)"
		dump_state
	fi
	if [ "${KUBE_E2E_KEEP:-}" = 1 ] && [ -f "$run/admin.kubeconfig" ]; then
		log "KUBE_E2E_KEEP=1: the cluster keeps running: KUBECONFIG=$KUBECONFIG (kubectl: $bin/kubectl)"
		log "stop it and restore the host: bash hack/kube-e2e.sh down $run"
		print_timings
		exit $rc
	fi
	teardown "$run" || { [ $rc = 0 ] && rc=1; }
	rm -rf "$run"
	print_timings
	if [ $rc = 0 ]; then log "PASS"; else log "FAIL (exit $rc)"; fi
	exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM
snapshot "$run" before
iptables-save >"$run/iptables.restore" 2>/dev/null || true
ip6tables-save >"$run/ip6tables.restore" 2>/dev/null || true
mkdir -p "$run/logs" "$run/pki" "$run/img" "$run/cni/net.d" "$run/cni/ipam" "$run/containerd" "$run/kubelet" "$run/pod-logs"

# Long steps run in their own process group, so that a signal to this script
# ends them at once (wait returns, the trap runs, cleanup kills the group).
run_waited() { # <cmd...>
	setsid "$@" &
	local pid=$!
	bg_pids+=("$pid")
	wait "$pid"
}

start() { # <log name> <cmd...>: a daemon, without this script's open files (a
	# caller's `flock` lock among them: a kept cluster must not hold it)
	local name=$1
	shift
	(
		for fd in /proc/"$BASHPID"/fd/*; do
			fd=${fd##*/}
			if [ "$fd" -gt 2 ] && [ "$fd" != 255 ]; then eval "exec $fd>&-"; fi
		done
		exec "$@"
	) >>"$run/logs/$name.log" 2>&1 </dev/null &
}

# --- 3. images ----------------------------------------------------------------
phase "images (ociimage)"
img=$run/img
rev=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
# pause: the sandbox of every pod (containerd's sandbox_image).
r=$img/pause-root
mkdir -p "$r"
cp "$bin/pause" "$r/pause"
"$bin/ociimage" --rootfs "$r" --tag "$pause_image" --out "$img/pause.tar" --entrypoint /pause --user 65535:65535
# matbus: what deploy/Dockerfile's runtime stage has (distroless static
# nonroot: passwd, CA certificates, /tmp, /home/nonroot).
r=$img/matbus-root
mkdir -p "$r/usr/local/bin" "$r/etc/ssl/certs" "$r/tmp" "$r/home/nonroot"
chmod 1777 "$r/tmp"
run_waited env CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.commit=$rev" -o "$r/usr/local/bin/matbus" ./cmd/matbus
printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$r/etc/passwd"
printf 'root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n' >"$r/etc/group"
[ -f /etc/ssl/certs/ca-certificates.crt ] && cp /etc/ssl/certs/ca-certificates.crt "$r/etc/ssl/certs/"
"$bin/ociimage" --rootfs "$r" --tag "$matbus_image" --out "$img/matbus.tar" \
	--entrypoint /usr/local/bin/matbus --cmd --help --user 65532:65532 --workdir /home/nonroot \
	--env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
	--chown 65532:65532=/home/nonroot --label "org.opencontainers.image.revision=$rev"
# nats: nats-server of go.mod's version.
r=$img/nats-root
mkdir -p "$r/usr/local/bin" "$r/tmp"
chmod 1777 "$r/tmp"
cp "$bin/nats-server" "$r/usr/local/bin/nats-server"
"$bin/ociimage" --rootfs "$r" --tag "$nats_image" --out "$img/nats.tar" --entrypoint /usr/local/bin/nats-server \
	--env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# gateway: the stand-in for the MAT protocol gateway (deploytest/gatewaystandin)
# that the chart's gateway.* runs beside discovery in the scenario.
r=$img/gateway-root
mkdir -p "$r/usr/local/bin"
run_waited env CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$r/usr/local/bin/gateway" ./deploytest/gatewaystandin
"$bin/ociimage" --rootfs "$r" --tag "$gateway_image" --out "$img/gateway.tar" --entrypoint /usr/local/bin/gateway --user 65532:65532
for t in "$img"/*.tar; do printf '   %s %s bytes\n' "$(basename "$t")" "$(stat -c %s "$t")"; done

# --- 4. network and containerd --------------------------------------------------
phase "containerd (private)"
if ip route | grep -q '^10\.214\.'; then
	left=$(find /tmp -maxdepth 1 -name 'matbus-ke2e.*' -type d ! -path "$run" | tr '\n' ' ')
	die "10.214.0.0/16 is already routed on this host; the node's bridge would collide${left:+ (a kept or killed run? bash hack/kube-e2e.sh down <folder>: $left)}"
fi
if ip route | grep -qE '^10\.(9[6-9]|10[0-9]|11[01])\.'; then die "part of $service_cidr is already routed on this host; the node's service range would collide"; fi
ip link add "$bridge" type bridge
ip addr add "$node_ip/24" dev "$bridge"
ip link set "$bridge" up
# ClusterIPs go onto the bridge: kube-proxy's DNAT sends them on to a pod or
# the API server, and one with no Service behind it ends there instead of at
# the default route.
ip route add "$service_cidr" dev "$bridge" src "$node_ip"
# Pods talk to each other and to the host only: nothing from the bridge is
# forwarded anywhere else (no NAT, no route out).
iptables -w -I FORWARD 1 -i "$bridge" ! -o "$bridge" -j DROP
sysctl -qw net.ipv4.ip_forward=1
sysctl -qw net.bridge.bridge-nf-call-iptables=1
# The kubelet's cgroup root: every pod's cgroup is made under it (all v1
# hierarchies; cpuset needs its cpus and mems filled in).
for h in /sys/fs/cgroup/*/; do
	[ -e "$h/cgroup.procs" ] || continue
	mkdir "$h$cgroot"
	if [ -e "$h/cpuset.cpus" ]; then
		cat "$h/cpuset.cpus" >"$h$cgroot/cpuset.cpus"
		cat "$h/cpuset.mems" >"$h$cgroot/cpuset.mems"
	fi
done
cat >"$run/cni/net.d/10-mbke2e.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "mbke2e",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$bridge",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$run/cni/ipam",
        "ranges": [[{"subnet": "$pod_cidr", "rangeStart": "10.214.0.10", "rangeEnd": "10.214.0.250", "gateway": "$node_ip"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
ctd=$run/containerd
# Without CAP_SYS_RESOURCE (some sandboxes drop it, even for root) no process
# may lower its oom_score_adj, and runc fails the kubelet's -998 for every pod
# sandbox ("failed to update /proc/self/oom_score_adj: Permission denied", seen
# as "can't get final child's PID from pipe: EOF"): containerd then keeps the
# containers' scores at or above its own.
restrict_oom=false
if [ $((0x$(sed -n 's/^CapBnd:[[:space:]]*//p' /proc/self/status) >> 24 & 1)) = 0 ]; then
	restrict_oom=true
	log "no CAP_SYS_RESOURCE here: containerd's restrict_oom_score_adj = true"
fi
cat >"$ctd/config.toml" <<EOF
version = 2
root = "$ctd/root"
state = "$ctd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs"]

[grpc]
  address = "$ctd/containerd.sock"

[plugins."io.containerd.internal.v1.opt"]
  path = "$ctd/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$pause_image"
  netns_mounts_under_state_dir = true
  restrict_oom_score_adj = $restrict_oom
  enable_unprivileged_ports = true
  enable_unprivileged_icmp = true
  stream_server_address = "127.0.0.1"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$ctd/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$run/cni/net.d"
    max_conf_num = 1
EOF
start containerd containerd --config "$ctd/config.toml" --log-level info
for _ in $(seq 60); do "${ctr_a[@]}" version >/dev/null 2>&1 && break; sleep 0.5; done
"${ctr_a[@]}" version >/dev/null || die "containerd did not start (logs/containerd.log)"
"${ctr_a[@]}" plugins ls | awk '$2 == "cri" && $4 != "ok" {bad=1} $2 == "cri" {found=1} END {exit !(found && !bad)}' ||
	die "containerd's CRI plugin is not loaded: $("${ctr_a[@]}" plugins ls | grep -w cri)"
for t in pause matbus nats gateway; do "${ctr_a[@]}" images import --no-unpack=false "$img/$t.tar" >/dev/null; done
"${ctr_a[@]}" images ls -q | grep -v '^sha256:' | sed 's/^/   image /'
rm -rf "$img"

# --- 5. PKI, control plane ------------------------------------------------------
phase "control plane"
pki=$run/pki
openssl_key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }
openssl_key "$pki/ca.key"
openssl req -x509 -new -key "$pki/ca.key" -subj "/CN=matbus-kube-e2e-ca" -days 2 -out "$pki/ca.crt" \
	-addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" 2>/dev/null
cert() { # <name> <subject> <extendedKeyUsage> [subjectAltName]
	openssl_key "$pki/$1.key"
	openssl req -new -key "$pki/$1.key" -subj "$2" -out "$pki/$1.csr" 2>/dev/null
	{
		echo "basicConstraints=critical,CA:FALSE"
		echo "keyUsage=critical,digitalSignature,keyEncipherment"
		echo "extendedKeyUsage=$3"
		[ -z "${4:-}" ] || echo "subjectAltName=$4"
	} >"$pki/$1.ext"
	openssl x509 -req -in "$pki/$1.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial -days 2 \
		-extfile "$pki/$1.ext" -out "$pki/$1.crt" 2>/dev/null
	rm -f "$pki/$1.csr" "$pki/$1.ext"
}
cert apiserver "/CN=kube-apiserver" serverAuth \
	"IP:$api_cluster_ip,IP:$node_ip,IP:127.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost"
cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" clientAuth
cert admin "/O=system:masters/CN=kube-e2e-admin" clientAuth
cert controller-manager "/CN=system:kube-controller-manager" clientAuth
cert scheduler "/CN=system:kube-scheduler" clientAuth
cert kube-proxy "/CN=system:kube-proxy" clientAuth
cert coredns "/CN=system:coredns" clientAuth
cert kubelet "/O=system:nodes/CN=system:node:$node" clientAuth
# The kubelet, kube-controller-manager and kube-scheduler serve on the node address.
cert node-serving "/CN=$node" serverAuth "IP:$node_ip,DNS:$node"
openssl_key "$pki/sa.key"
openssl pkey -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
kubeconfig() { # <file> <cert name>
	cat >"$run/$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: kube-e2e
  cluster:
    server: https://$node_ip:6443
    certificate-authority-data: $(base64 -w0 "$pki/ca.crt")
users:
- name: $2
  user:
    client-certificate-data: $(base64 -w0 "$pki/$2.crt")
    client-key-data: $(base64 -w0 "$pki/$2.key")
contexts:
- name: kube-e2e
  context:
    cluster: kube-e2e
    user: $2
current-context: kube-e2e
EOF
	chmod 600 "$run/$1"
}
for u in admin controller-manager scheduler kube-proxy coredns kubelet; do kubeconfig "$u.kubeconfig" "$u"; done

wait_for() { # <what> <seconds> <cmd...>
	local what=$1 secs=$2
	shift 2
	for _ in $(seq $((secs * 2))); do
		"$@" >/dev/null 2>&1 && return 0
		sleep 0.5
	done
	die "$what is not up after ${secs}s (logs in $run/logs)"
}
start etcd "$bin/etcd" --name "$node" --data-dir "$run/etcd" \
	--listen-client-urls "http://$node_ip:2379" --advertise-client-urls "http://$node_ip:2379" \
	--listen-peer-urls "http://$node_ip:2380" --initial-advertise-peer-urls "http://$node_ip:2380" \
	--initial-cluster "$node=http://$node_ip:2380" --unsafe-no-fsync --log-level warn
wait_for etcd 30 curl -fsS "http://$node_ip:2379/health"
start kube-apiserver "$bin/kube-apiserver" --etcd-servers "http://$node_ip:2379" \
	--advertise-address "$node_ip" --bind-address "$node_ip" --secure-port 6443 \
	--tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" --client-ca-file "$pki/ca.crt" \
	--service-cluster-ip-range "$service_cidr" --service-node-port-range 30000-32767 \
	--service-account-issuer https://kubernetes.default.svc.cluster.local \
	--service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
	--authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction --allow-privileged=true \
	--kubelet-client-certificate "$pki/apiserver-kubelet-client.crt" --kubelet-client-key "$pki/apiserver-kubelet-client.key" \
	--kubelet-certificate-authority "$pki/ca.crt" --kubelet-preferred-address-types InternalIP \
	--profiling=false --v=1
wait_for kube-apiserver 120 curl -fsS --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key" "https://$node_ip:6443/readyz"
start kube-controller-manager "$bin/kube-controller-manager" --kubeconfig "$run/controller-manager.kubeconfig" \
	--authentication-kubeconfig "$run/controller-manager.kubeconfig" --authorization-kubeconfig "$run/controller-manager.kubeconfig" \
	--bind-address "$node_ip" --tls-cert-file "$pki/node-serving.crt" --tls-private-key-file "$pki/node-serving.key" \
	--leader-elect=false --use-service-account-credentials \
	--service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" \
	--cluster-signing-cert-file "$pki/ca.crt" --cluster-signing-key-file "$pki/ca.key" \
	--kube-api-qps 100 --kube-api-burst 200 \
	--allocate-node-cidrs=false --cluster-name kube-e2e --flex-volume-plugin-dir "$run/kcm-flexvolume" --profiling=false --v=1
cat >"$run/scheduler.yaml" <<EOF
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: $run/scheduler.kubeconfig
leaderElection:
  leaderElect: false
EOF
start kube-scheduler "$bin/kube-scheduler" --config "$run/scheduler.yaml" \
	--authentication-kubeconfig "$run/scheduler.kubeconfig" --authorization-kubeconfig "$run/scheduler.kubeconfig" \
	--bind-address "$node_ip" --tls-cert-file "$pki/node-serving.crt" --tls-private-key-file "$pki/node-serving.key" \
	--profiling=false --v=1
wait_for kube-controller-manager 60 curl -fsS --cacert "$pki/ca.crt" "https://$node_ip:10257/healthz"
wait_for kube-scheduler 60 curl -fsS --cacert "$pki/ca.crt" "https://$node_ip:10259/healthz"
# CoreDNS reads Services, EndpointSlices, Pods and Namespaces as system:coredns.
kc apply -f - >/dev/null <<EOF
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: system:coredns
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: system:coredns
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: system:coredns
subjects:
- apiGroup: rbac.authorization.k8s.io
  kind: User
  name: system:coredns
EOF
"$bin/kube-apiserver" --version | sed 's/^/   /'

# --- 6. node ------------------------------------------------------------------
phase "node ready (kubelet, proxy, DNS)"
# Pods resolve cluster names only: the kubelet gives them CoreDNS and no
# nameserver of the host.
printf '# matbus kube-e2e: pods resolve cluster.local names only (CoreDNS on %s)\n' "$node_ip" >"$run/resolv.conf"
cat >"$run/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# v1.37 still runs on cgroup v1 when told to (the v1beta1 default is true).
failCgroupV1: false
# Debian's containerd 1.6 has no RuntimeConfig RPC: the kubelet falls back to
# this driver, which containerd's runc options match (SystemdCgroup = false).
cgroupDriver: cgroupfs
cgroupRoot: /$cgroot
cgroupsPerQOS: true
enforceNodeAllocatable: [pods]
containerRuntimeEndpoint: unix://$ctd/containerd.sock
address: $node_ip
port: 10250
readOnlyPort: 0
healthzBindAddress: $node_ip
healthzPort: 10248
tlsCertFile: $pki/node-serving.crt
tlsPrivateKeyFile: $pki/node-serving.key
rotateCertificates: false
serverTLSBootstrap: false
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: $pki/ca.crt
authorization:
  mode: Webhook
clusterDNS: [$node_ip]
clusterDomain: cluster.local
resolvConf: $run/resolv.conf
podLogsDir: $run/pod-logs
volumePluginDir: $run/kubelet/volume-plugins
failSwapOn: false
maxPods: 110
serializeImagePulls: false
# No image is ever pulled (no registry): none may be collected either, and a
# fuller disk must not evict the scenario's pods.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
  imagefs.inodesFree: 1%
protectKernelDefaults: false
EOF
start kubelet "$bin/kubelet" --config "$run/kubelet.yaml" --kubeconfig "$run/kubelet.kubeconfig" \
	--root-dir "$run/kubelet" --hostname-override "$node" --node-ip "$node_ip" --v=1
cat >"$run/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: $run/kube-proxy.kubeconfig
mode: iptables
hostnameOverride: $node
bindAddress: $node_ip
healthzBindAddress: $node_ip:10256
metricsBindAddress: $node_ip:10249
clusterCIDR: $pod_cidr
nodePortAddresses: ["$node_ip/32"]
iptables:
  localhostNodePorts: false
  masqueradeAll: false
# Leave the host's conntrack settings as they are.
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
  udpTimeout: 0s
  udpStreamTimeout: 0s
EOF
start kube-proxy "$bin/kube-proxy" --config "$run/kube-proxy.yaml" --v=1
cat >"$run/Corefile" <<EOF
cluster.local:53 in-addr.arpa:53 ip6.arpa:53 {
    bind $node_ip
    errors
    health $node_ip:8180
    ready $node_ip:8181
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $run/coredns.kubeconfig kube-e2e
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 30
    }
    cache 30
}
EOF
start coredns "$bin/coredns" -conf "$run/Corefile"
wait_for kubelet 60 curl -fsS "http://$node_ip:10248/healthz"
wait_for "node $node Ready" 120 kc wait --for=condition=Ready "node/$node" --timeout=5s
wait_for kube-proxy 60 curl -fsS "http://$node_ip:10256/healthz"
wait_for CoreDNS 60 curl -fsS "http://$node_ip:8181/ready"
wait_for "the default ServiceAccount" 60 kc get serviceaccount default
wait_for "the kube-root-ca.crt ConfigMap" 60 kc get configmap kube-root-ca.crt
kc get nodes -o wide | sed 's/^/   /'

# --- 7. smoke check ------------------------------------------------------------
phase "smoke (pods, DNS, ClusterIP)"
smoke_pod() { # <name> <args as a JSON list>
	kc apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: $1
  namespace: default
spec:
  restartPolicy: Never
  enableServiceLinks: false
  containers:
  - name: c
    image: $matbus_image
    imagePullPolicy: Never
    args: $2
    securityContext:
      runAsNonRoot: true
      readOnlyRootFilesystem: true
      allowPrivilegeEscalation: false
      capabilities: {drop: [ALL]}
EOF
}
smoke_wait() { # <name>: Succeeded, or its log and a failure
	local phase_now
	for _ in $(seq 240); do
		phase_now=$(kc get pod "$1" -o jsonpath='{.status.phase}' 2>/dev/null || true)
		case $phase_now in
		Succeeded) kc logs "$1" | sed "s/^/   $1: /"; return 0 ;;
		Failed) break ;;
		esac
		sleep 0.5
	done
	kc describe pod "$1" | tail -30 | sed 's/^/   /'
	kc logs "$1" 2>&1 | sed "s/^/   $1: /"
	die "pod $1 did not succeed (phase ${phase_now:-none})"
}
# The matbus image runs (as 65532, read-only root).
smoke_pod ke2e-version '["version"]'
# Cluster DNS (the search path finds kubernetes.default.svc) and ClusterIP
# routing to the API server from a pod.
smoke_pod ke2e-api '["probe", "--insecure-skip-verify", "--url", "https://kubernetes.default.svc/readyz", "--timeout", "5s"]'
smoke_wait ke2e-version
smoke_wait ke2e-api
# The CA every pod gets verifies the API server under its in-cluster name
# through the ClusterIP (from the host, where the route sends it to kube-proxy).
kc get configmap kube-root-ca.crt -o jsonpath='{.data.ca\.crt}' >"$run/kube-root-ca.crt"
cmp -s "$run/kube-root-ca.crt" "$pki/ca.crt" || die "kube-root-ca.crt is not the cluster's CA"
curl -fsS --cacert "$run/kube-root-ca.crt" --resolve "kubernetes.default.svc:443:$api_cluster_ip" \
	https://kubernetes.default.svc/readyz >/dev/null || die "https://kubernetes.default.svc via $api_cluster_ip does not verify with kube-root-ca.crt"
got=$(dig +short +time=2 +tries=2 @"$node_ip" kubernetes.default.svc.cluster.local A)
[ "$got" = "$api_cluster_ip" ] || die "CoreDNS answers kubernetes.default.svc.cluster.local with '$got', want $api_cluster_ip"
log "pods run, DNS answers, kubernetes.default.svc -> $api_cluster_ip -> $node_ip:6443 verifies with kube-root-ca.crt"
kc delete pod ke2e-version ke2e-api --wait=false >/dev/null

# --- 8. scenario -----------------------------------------------------------------
phase "scenario (deploytest/kubee2e)"
if [ "${KUBE_E2E_SKIP_SCENARIO:-}" = 1 ]; then
	log "KUBE_E2E_SKIP_SCENARIO=1: no scenario run (the node came up and passed its checks)"
elif [ -d deploytest/kubee2e ]; then
	run_waited env MATBUS_KUBE_E2E=1 KUBECONFIG="$run/admin.kubeconfig" MATBUS_BIN_DIR="$bin" \
		MATBUS_KUBE_E2E_IMAGE="$matbus_image" MATBUS_KUBE_E2E_NATS_IMAGE="$nats_image" \
		MATBUS_KUBE_E2E_GATEWAY_IMAGE="$gateway_image" \
		MATBUS_KUBE_E2E_SERVICE_CIDR="$service_cidr" \
		go test -count=1 -v -timeout 30m ./deploytest/kubee2e/ > >(tee "$run/logs/scenario.log") 2>&1
	# The gateway sidecars' restart counts after each step (each discovery
	# pod's gateway container; deploytest/kubee2e/gateway_test.go).
	grep -o 'gateway restarts: after .*' "$run/logs/scenario.log" | while IFS= read -r l; do log "$l"; done || true
else
	log "deploytest/kubee2e does not exist yet: no scenario run (the node came up and passed its checks)"
fi
