#!/usr/bin/env bash
# `make compose-e2e`: docker-compose.yaml under a real container engine
# (docs/adr/0011-compose-e2e.md). Run as root on a Debian machine:
#
#   1. installs dockerd/containerd/runc (Debian's docker.io), busybox-static
#      and curl with apt when missing; builds the Compose v2 CLI plugin from
#      its Go module into .bin/ and installs it for this run only (a private
#      DOCKER_CONFIG);
#   2. starts a private dockerd (own data root, exec root, socket, pid file,
#      containerd namespace, bridge on 10.213.0.0/24, compose networks from
#      10.213.16.0/20) with --iptables=false --ip-forward=false: published
#      ports work through docker-proxy on 127.0.0.1, nothing is routed or
#      NATed, the host's firewall is not touched. Its data root is kept in
#      $MATBUS_COMPOSE_E2E_CACHE (/var/cache/matbus-compose-e2e) so that the
#      next run's image build finds its Go build cache (a cold build of
#      matbus in the image takes minutes); containers, networks and volumes
#      left there by a killed run are removed at the start;
#   3. builds local stand-ins of the images the compose file names (no
#      registry is reachable) from the binaries hack/tools.sh builds from Go
#      modules, and the Go builder and runtime base images deploy/Dockerfile
#      takes as build arguments; builds the matbus image with
#      `docker compose build` (module downloads from a file:// proxy made of
#      the host's module cache);
#   4. runs deploytest/composee2e (`docker compose up --wait`, Services,
#      --scale worker=4, a stopped simulator, a NATS restart, down -v);
#   5. on any exit: prints the compose logs on failure, stops dockerd, and
#      removes every change to the host (mounts, links, iptables, sysctls),
#      then verifies the host is as before.
#
# Each phase prints its time. COMPOSE_E2E_KEEP=1 leaves the engine running
# for a look after a failure (its DOCKER_HOST is printed). To start cold:
# rm -rf /var/cache/matbus-compose-e2e.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
# The images' root file systems are made here: whatever umask the caller
# has (077 made / untraversable for the curl image's user), give them the
# usual modes.
umask 022

compose_module=github.com/docker/compose/v2
compose_version=v2.40.3
bridge=mbce2e0
bridge_cidr=10.213.0.1/24
pool=10.213.16.0/20

trap 'echo ">> compose-e2e: failed at line $LINENO: $BASH_COMMAND" >&2' ERR
log() { printf '>> compose-e2e: %s\n' "$*"; }
die() { printf '>> compose-e2e: FAIL: %s\n' "$*" >&2; exit 1; }

if [ "$(id -u)" != 0 ]; then
	die "runs as root (it installs packages and starts a private dockerd)"
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
	printf '>> compose-e2e: phase times\n'
	for l in "${timings[@]}"; do printf '   %s\n' "$l"; done
	printf '   %-34s %4ds\n' "total" $((SECONDS - start_t0))
}

# --- 1. packages ------------------------------------------------------------
phase "packages (apt)"
need=()
for c in dockerd:docker.io containerd:docker.io runc:docker.io docker:docker.io iptables-save:iptables curl:curl ip:iproute2 sysctl:procps flock:util-linux; do
	command -v "${c%%:*}" >/dev/null 2>&1 || need+=("${c#*:}")
done
# The images need a static busybox (ldd fails on a static binary).
if [ ! -x /bin/busybox ] || ldd /bin/busybox >/dev/null 2>&1; then need+=(busybox-static); fi
if [ ${#need[@]} -gt 0 ]; then
	mapfile -t need < <(printf '%s\n' "${need[@]}" | sort -u)
	log "installing ${need[*]} (Debian packages)"
	# No system dockerd may start from the install (it would change the
	# host's network before the private one runs): deny service starts.
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
dockerd --version

# --- 2. tools: static nats-server, etcd, etcdctl, kube-apiserver ------------
phase "tools (hack/tools.sh)"
bash hack/tools.sh
for b in nats-server etcd etcdctl kube-apiserver; do
	go version -m ".bin/$b" | grep -q 'CGO_ENABLED=0' ||
		die ".bin/$b is not a static build (CGO_ENABLED=0); remove .bin/*.stamp and run make tools"
done

phase "compose plugin ($compose_version)"
plugin=$root/.bin/docker-compose-$compose_version
if [ ! -x "$plugin" ]; then
	dir=$(cd / && go mod download -json "$compose_module@$compose_version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
	[ -d "$dir" ] || die "go mod download $compose_module@$compose_version gave no source folder"
	log "building the Compose CLI plugin from $compose_module@$compose_version (CGO_ENABLED=0)"
	(cd "$dir" && CGO_ENABLED=0 GOFLAGS=-buildvcs=false go build -trimpath \
		-ldflags "-s -w -X $compose_module/internal.Version=$compose_version" -o "$plugin.tmp" ./cmd)
	mv "$plugin.tmp" "$plugin"
fi

# The compose services run as uid 65532 and read deploy/compose/ through bind
# mounts, which keep the checkout's modes: a checkout made under umask 077
# would crash-loop them (matbus then names the file and this fix).
unreadable=$(find deploy/compose -type f ! -perm -o+r)
if [ -n "$unreadable" ]; then
	log "making deploy/compose/ readable by the containers (checkout made under a restrictive umask): chmod a+r" $unreadable
	chmod a+r $unreadable
fi

# --- host state before, and cleanup on every exit ---------------------------
cache=${MATBUS_COMPOSE_E2E_CACHE:-/var/cache/matbus-compose-e2e}
mkdir -p "$cache"
exec 9>"$cache/lock"
flock -n 9 || die "another make compose-e2e is running (lock $cache/lock)"
data_root=$cache/docker
run=$(mktemp -d /tmp/matbus-ce2e.XXXXXX)
snapshot() { # <suffix>
	# (sed, not grep: an empty rule set must not fail the pipeline)
	{ iptables-save 2>/dev/null || true; } | sed -e '/^#/d' -e 's/\[[0-9]*:[0-9]*\]//' >"$run/iptables.$1"
	{ ip6tables-save 2>/dev/null || true; } | sed -e '/^#/d' -e 's/\[[0-9]*:[0-9]*\]//' >"$run/ip6tables.$1"
	{ sysctl -a 2>/dev/null || true; } | sed -n -E '/^net\.(ipv4\.ip_forward|ipv4\.conf\.all\.forwarding|ipv6\.conf\.all\.forwarding|bridge\.)/p' | sort >"$run/sysctl.$1"
	ip -o link show | awk -F': ' '{print $2}' | sed 's/@.*//' | sort >"$run/links.$1"
	awk '{print $5}' /proc/self/mountinfo | sort >"$run/mounts.$1"
}

export DOCKER_HOST=unix://$run/docker.sock
export DOCKER_CONFIG=$run/docker-config
export DOCKER_BUILDKIT=1 COMPOSE_BAKE=false COMPOSE_PROGRESS=plain
mkdir -p "$DOCKER_CONFIG/cli-plugins"
cp "$plugin" "$DOCKER_CONFIG/cli-plugins/docker-compose"
dockerd_pid=""

cleanup() {
	local rc=$?
	set +e
	trap - EXIT INT TERM
	phase "cleanup"
	if [ -n "$dockerd_pid" ] && [ "${COMPOSE_E2E_KEEP:-}" = 1 ] && [ $rc != 0 ]; then
		log "COMPOSE_E2E_KEEP=1: the engine keeps running: DOCKER_HOST=$DOCKER_HOST DOCKER_CONFIG=$DOCKER_CONFIG (stop: kill $dockerd_pid)"
		print_timings
		exit $rc
	fi
	if [ -n "$dockerd_pid" ] && kill -0 "$dockerd_pid" 2>/dev/null; then
		if [ $rc != 0 ]; then
			log "failed (exit $rc): compose state and logs"
			docker compose ps -a 2>&1 | sed 's/^/   /'
			docker compose logs --no-color --timestamps --tail 150 2>&1 | sed 's/^/   /'
		fi
		docker compose down -v --remove-orphans --timeout 5 >/dev/null 2>&1
		kill -TERM "$dockerd_pid"
		for _ in $(seq 60); do kill -0 "$dockerd_pid" 2>/dev/null || break; sleep 0.5; done
		if kill -0 "$dockerd_pid" 2>/dev/null; then
			log "dockerd $dockerd_pid did not stop in 30s: SIGKILL"
			kill -KILL "$dockerd_pid"
		fi
		wait "$dockerd_pid" 2>/dev/null
	fi
	# containerd and shims this dockerd started name the run folder.
	for p in /proc/[0-9]*; do
		if tr '\0' ' ' <"$p/cmdline" 2>/dev/null | grep -q "$run/"; then
			log "stopping leftover ${p#/proc/}: $(tr '\0' ' ' <"$p/cmdline" | cut -c1-100)"
			kill -KILL "${p#/proc/}" 2>/dev/null
		fi
	done
	awk '{print $5}' /proc/self/mountinfo | grep -E "^($run|$data_root)/" | sort -r | while read -r m; do umount -l "$m"; done
	# Links: the bridge made here and any bridge or veth the engine left.
	ip link del "$bridge" 2>/dev/null
	ip -o link show | awk -F': ' '{print $2}' | sed 's/@.*//' | sort | comm -13 "$run/links.before" - |
		grep -E '^(br-|veth|docker)' | while read -r l; do log "removing link $l"; ip link del "$l"; done
	[ "$(sysctl -n net.ipv4.ip_forward)" = "$ip_forward_before" ] || sysctl -qw net.ipv4.ip_forward="$ip_forward_before"
	snapshot after
	local changed=0 f
	for f in iptables ip6tables sysctl links mounts; do
		if ! diff -u "$run/$f.before" "$run/$f.after" >"$run/$f.diff"; then
			changed=1
			log "the host's $f changed:"
			sed 's/^/   /' "$run/$f.diff"
		fi
	done
	if [ $changed = 1 ]; then
		grep -q . "$run/iptables.diff" 2>/dev/null && iptables-restore <"$run/iptables.restore" && log "iptables restored"
		[ $rc = 0 ] && rc=1
	else
		log "host unchanged: iptables, ip6tables, forwarding sysctls, network links, mounts (diffed before/after)"
	fi
	chmod -R u+w "$run" 2>/dev/null
	rm -rf "$run"
	log "engine data (images, build cache) kept for the next run: $data_root"
	print_timings
	if [ $rc = 0 ]; then log "PASS"; else log "FAIL (exit $rc)"; fi
	exit $rc
}
ip_forward_before=$(sysctl -n net.ipv4.ip_forward)
trap cleanup EXIT
trap 'exit 130' INT TERM
snapshot before
iptables-save >"$run/iptables.restore" 2>/dev/null || true

# --- 3. engine -------------------------------------------------------------
phase "engine (private dockerd)"
if ip route | grep -q '^10\.213\.'; then die "10.213.0.0/16 is already routed on this host; the private engine's bridge would collide"; fi
ip link add "$bridge" type bridge
ip addr add "$bridge_cidr" dev "$bridge"
ip link set "$bridge" up
start_dockerd() {
	dockerd --data-root "$data_root" --exec-root "$run/exec" -H "$DOCKER_HOST" --pidfile "$run/dockerd.pid" \
		--bridge "$bridge" --default-address-pool "base=$pool,size=24" \
		--iptables=false --ip6tables=false --ip-forward=false --ip-masq=false --userland-proxy=true \
		--containerd-namespace matbus-ce2e --containerd-plugins-namespace matbus-ce2e-plugins \
		--storage-driver overlay2 --log-level warn >>"$run/dockerd.log" 2>&1 &
	dockerd_pid=$!
	for _ in $(seq 120); do
		docker version >/dev/null 2>&1 && return 0
		kill -0 "$dockerd_pid" 2>/dev/null || break
		sleep 0.5
	done
	kill -TERM "$dockerd_pid" 2>/dev/null
	wait "$dockerd_pid" 2>/dev/null
	dockerd_pid=""
	return 1
}
if ! start_dockerd; then
	cat "$run/dockerd.log"
	log "dockerd did not start on the kept data root $data_root: starting again on an empty one"
	awk '{print $5}' /proc/self/mountinfo | grep "^$data_root/" | sort -r | while read -r m; do umount -l "$m"; done
	rm -rf "$data_root"
	start_dockerd || { cat "$run/dockerd.log"; die "dockerd does not start"; }
fi
docker version --format 'engine {{.Server.Version}} (API {{.Server.APIVersion}}), client {{.Client.Version}}'
# Whatever a killed run left in the kept data root.
left=$(docker ps -aq)
[ -z "$left" ] || { log "removing containers of an earlier run"; docker rm -f $left >/dev/null; }
docker network prune -f >/dev/null
docker volume prune -f >/dev/null
docker compose version

# --- 4. images ---------------------------------------------------------------
# Each stand-in is a root file system imported as an image with the
# upstream image's entrypoint, command and environment.
import_image() { # <rootfs> <tag> [--change ...]
	local dir=$1 tag=$2
	shift 2
	tar --numeric-owner -C "$dir" -cf - . | docker import "$@" - "$tag" >/dev/null
	log "image $tag"
}
busybox_into() { # <rootfs> <applets...>
	local dir=$1 a
	shift
	mkdir -p "$dir/bin"
	cp /bin/busybox "$dir/bin/busybox"
	for a in "$@"; do ln -sf busybox "$dir/bin/$a"; done
}
image_of() { # the image a compose service names (a literal `image:` line)
	local i
	i=$(sed -n "/^  $1:\$/,/^  [a-z]/s/^    image: *//p" docker-compose.yaml | head -1)
	[ -n "$i" ] || die "docker-compose.yaml: no image line for service $1"
	echo "$i"
}
path_env='ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'

phase "images (stand-ins)"
img=$run/img
# nats:<v>-alpine: nats-server, the image's docker-entrypoint.sh (flags
# alone mean `nats-server <flags>`), busybox sh and wget for the healthcheck.
r=$img/nats
mkdir -p "$r/usr/local/bin" "$r/etc/nats" "$r/tmp"
chmod 1777 "$r/tmp"
cp .bin/nats-server "$r/usr/local/bin/"
busybox_into "$r" sh wget
cat >"$r/usr/local/bin/docker-entrypoint.sh" <<'EOF'
#!/bin/sh
set -e
# flags only: run them with nats-server (as the upstream image does)
if [ "$#" -eq 0 ] || [ "${1#-}" != "$1" ]; then
	set -- nats-server "$@"
fi
exec "$@"
EOF
chmod 755 "$r/usr/local/bin/docker-entrypoint.sh"
printf 'port: 4222\nmonitor_port: 8222\n' >"$r/etc/nats/nats-server.conf"
import_image "$r" "$(image_of nats)" --change "$path_env" --change 'ENTRYPOINT ["docker-entrypoint.sh"]' \
	--change 'CMD ["nats-server", "--config", "/etc/nats/nats-server.conf"]' --change 'EXPOSE 4222 6222 8222'

# registry.k8s.io/etcd: etcd and etcdctl (the healthcheck) in /usr/local/bin.
r=$img/etcd
mkdir -p "$r/usr/local/bin" "$r/var/lib/etcd" "$r/tmp"
chmod 1777 "$r/tmp"
cp .bin/etcd .bin/etcdctl "$r/usr/local/bin/"
import_image "$r" "$(image_of etcd)" --change "$path_env" --change 'CMD ["/usr/local/bin/etcd"]'

# registry.k8s.io/kube-apiserver: the binary on PATH, no shell.
r=$img/kube-apiserver
mkdir -p "$r/usr/local/bin" "$r/tmp"
chmod 1777 "$r/tmp"
cp .bin/kube-apiserver "$r/usr/local/bin/"
import_image "$r" "$(image_of kube-apiserver)" --change "$path_env"

# curlimages/curl: Debian's curl with its libraries, the image's
# entrypoint.sh (arguments that start with - go to curl), user curl_user.
r=$img/curl
mkdir -p "$r/usr/bin" "$r/etc/ssl/certs" "$r/tmp" "$r/home/curl_user"
chmod 1777 "$r/tmp"
cp /usr/bin/curl "$r/usr/bin/curl"
ldd /usr/bin/curl | awk '/=> \//{print $3} /^[[:space:]]*\/lib/{print $1}' | while read -r lib; do cp -L --parents "$lib" "$r/"; done
[ -f /etc/ssl/certs/ca-certificates.crt ] && cp /etc/ssl/certs/ca-certificates.crt "$r/etc/ssl/certs/"
busybox_into "$r" sh
printf 'root:x:0:0:root:/root:/bin/sh\ncurl_user:x:100:101:curl_user:/home/curl_user:/bin/sh\n' >"$r/etc/passwd"
printf 'root:x:0:\ncurl_group:x:101:\n' >"$r/etc/group"
chown 100:101 "$r/home/curl_user"
cat >"$r/entrypoint.sh" <<'EOF'
#!/bin/sh
set -e
if [ "${1#-}" != "${1}" ] || [ -z "$(command -v "${1}")" ]; then
	set -- curl "$@"
fi
exec "$@"
EOF
chmod 755 "$r/entrypoint.sh"
import_image "$r" "$(image_of kube-apiserver-ready)" --change "$path_env" --change 'USER curl_user' \
	--change 'ENTRYPOINT ["/entrypoint.sh"]' --change 'CMD ["curl"]'

# deploy/Dockerfile's base images, passed as build arguments:
# GO_IMAGE = this machine's Go toolchain with a module proxy folder
# (/goproxy, file:// proxy layout) holding exactly what `go mod download`
# of the project needs, made from the host's module cache;
# RUNTIME_IMAGE = a distroless-like static root (passwd with nonroot 65532,
# CA certificates, /tmp).
goversion=$(go env GOVERSION)
r=$img/golang
mkdir -p "$r/usr/local" "$r/go" "$r/root" "$r/etc" "$r/tmp"
chmod 1777 "$r/tmp"
cp -a "$(go env GOROOT)" "$r/usr/local/go"
rm -rf "$r/usr/local/go/test" "$r/usr/local/go/api"
busybox_into "$r" sh
printf 'root:x:0:0:root:/root:/bin/sh\n' >"$r/etc/passwd"
(GOMODCACHE=$run/gomod GOFLAGS=-mod=readonly GOPROXY="file://$(go env GOMODCACHE)/cache/download,$(go env GOPROXY)" go mod download)
cp -a "$run/gomod/cache/download" "$r/goproxy"
rm -rf "$r/goproxy/sumdb"
go_image=matbus-e2e/golang:${goversion#go}
import_image "$r" "$go_image" \
	--change 'ENV PATH=/usr/local/go/bin:/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
	--change 'ENV GOPATH=/go' --change 'ENV GOTOOLCHAIN=local' --change 'WORKDIR /go'

r=$img/static
mkdir -p "$r/etc/ssl/certs" "$r/tmp" "$r/home/nonroot"
chmod 1777 "$r/tmp"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$r/etc/passwd"
printf 'root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n' >"$r/etc/group"
chown 65532:65532 "$r/home/nonroot"
[ -f /etc/ssl/certs/ca-certificates.crt ] && cp /etc/ssl/certs/ca-certificates.crt "$r/etc/ssl/certs/"
runtime_image=matbus-e2e/static:nonroot
import_image "$r" "$runtime_image" --change 'USER 65532:65532' --change 'WORKDIR /home/nonroot'
docker image prune -f >/dev/null # stand-ins of earlier runs
docker images --format '   {{.Repository}}:{{.Tag}} {{.Size}}'

phase "matbus image (compose build)"
docker compose build \
	--build-arg "GO_IMAGE=$go_image" --build-arg "RUNTIME_IMAGE=$runtime_image" \
	--build-arg GOPROXY=file:///goproxy --build-arg GOSUMDB=off \
	--build-arg "REVISION=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
# The kept build cache stays bounded (least recently used first; the Go
# build cache mount is used by every run). Through the engine's API: the
# docker CLI wants the buildx plugin for this with BuildKit on.
curl -fsS --unix-socket "$run/docker.sock" -X POST "http://engine/build/prune?keep-storage=3000000000" >/dev/null ||
	log "warning: the build cache was not pruned"
matbus_image=$(docker compose config --images matbus-image)
docker run --rm "$matbus_image" version
# Every image the compose file names is here now: nothing will be pulled.
for i in $(docker compose config --images | sort -u); do
	docker image inspect "$i" >/dev/null 2>&1 || die "image $i (named by docker-compose.yaml) was not built"
done

# --- 5. the check -------------------------------------------------------------
phase "compose scenario (deploytest/composee2e)"
MATBUS_COMPOSE_E2E=1 go test -count=1 -v -timeout 20m ./deploytest/composee2e/
