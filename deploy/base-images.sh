#!/usr/bin/env bash
# Makes sure the two base images that deploy/Dockerfile starts from exist in
# the local docker daemon, for builders that cannot reach Docker Hub
# (air-gapped CI, a closed network). For each image:
#
#   1. already present locally          -> nothing to do
#   2. `docker pull` works              -> pulled, nothing built
#   3. otherwise it is made here, under the very tag the Dockerfile names, so
#      that deploy/Dockerfile stays the standard one:
#        debian:<suite>-slim   `debootstrap --variant=minbase <suite>` from a
#                              Debian mirror, imported with `docker import`
#        rust:<ver>-<suite>    that image plus gcc, libc6-dev and
#                              ca-certificates from the mirror, and this
#                              machine's rustup toolchain of version <ver>
#                              (without its HTML docs), laid out as the
#                              official image is (RUSTUP_HOME=/usr/local/rustup,
#                              CARGO_HOME=/usr/local/cargo, rustup proxies on
#                              PATH). It also trusts this machine's local CA
#                              certificates (EXTRA_CA_DIR), as a builder behind
#                              a TLS-inspecting proxy needs to reach crates.io;
#                              only the build stage sees them, never the
#                              runtime image.
#
# Usage: bash deploy/base-images.sh            (from anywhere; needs root and
#                                               a docker daemon for step 3)
# Environment:
#   RUST_IMAGE, BASE_IMAGE  the tags (default: the Dockerfile's ARG defaults)
#   DEBIAN_MIRROR           default http://deb.debian.org/debian
#   RUST_TOOLCHAIN          host rustup toolchain to copy (default: the one
#                           whose rustc matches the RUST_IMAGE version)
#   EXTRA_CA_DIR            local CA certificates (*.crt) the made Rust image
#                           trusts (default /usr/local/share/ca-certificates,
#                           Debian's place for them; empty: none)
#   NO_PULL=1               skip step 2 (go straight to building)
#
# The made images are stand-ins: same tags, same layout where the build
# depends on it, not byte-identical to Docker Hub's. Remove them
# (`docker rmi`) to go back to the real ones once Docker Hub is reachable.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
dockerfile_arg() { sed -n "/^ARG $1=/{s///p;q}" "$here/Dockerfile"; }
RUST_IMAGE=${RUST_IMAGE:-$(dockerfile_arg RUST_IMAGE)}
BASE_IMAGE=${BASE_IMAGE:-$(dockerfile_arg BASE_IMAGE)}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
: "${RUST_IMAGE:?cannot read ARG RUST_IMAGE from $here/Dockerfile}"
: "${BASE_IMAGE:?cannot read ARG BASE_IMAGE from $here/Dockerfile}"

log() { printf 'base-images: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

present() { docker image inspect "$1" >/dev/null 2>&1; }

try_pull() {
  [[ "${NO_PULL:-}" == 1 ]] && return 1
  log "pulling $1"
  if docker pull -q "$1" >/dev/null 2>"$work/pull.err"; then
    log "pulled $1"
    return 0
  fi
  log "cannot pull $1: $(tail -n1 "$work/pull.err")"
  return 1
}

work=$(mktemp -d "${TMPDIR:-/var/tmp}/retry-budget-base.XXXXXX")
cleanup() { rm -rf "$work"; }
trap cleanup EXIT

docker info >/dev/null 2>&1 || die "no docker daemon (docker info fails)"

# --- debian:<suite>-slim --------------------------------------------------------
make_debian() {
  local image=$1 suite
  case "$image" in
    debian:*-slim) suite=${image#debian:}; suite=${suite%-slim} ;;
    debian:*) suite=${image#debian:} ;;
    *) die "cannot make $image locally: only debian:<suite>[-slim] images can be made" ;;
  esac
  [[ "$(id -u)" == 0 ]] || die "making $image needs root (debootstrap)"
  if ! command -v debootstrap >/dev/null 2>&1; then
    log "installing debootstrap (apt-get)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null \
      || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null; } \
      || die "cannot install debootstrap"
  fi
  local rootfs="$work/rootfs"
  log "debootstrap --variant=minbase $suite from $DEBIAN_MIRROR (a minute or two)"
  debootstrap --variant=minbase "$suite" "$rootfs" "$DEBIAN_MIRROR" >"$work/debootstrap.log" 2>&1 \
    || { tail -n 20 "$work/debootstrap.log" >&2; die "debootstrap failed"; }
  # What the official slim image leaves out: package lists, caches, and the
  # host's own name and resolver (docker provides both at run time).
  rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin \
    "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/log/*.log "$rootfs"/tmp/* "$rootfs"/var/tmp/*
  : >"$rootfs/etc/resolv.conf"
  echo localhost >"$rootfs/etc/hostname"
  log "docker import -> $image"
  tar --numeric-owner -C "$rootfs" -cf - . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["bash"]' \
    --message "retry-budget deploy/base-images.sh: debootstrap --variant=minbase $suite ($DEBIAN_MIRROR)" \
    - "$image" >/dev/null
  rm -rf "$rootfs"
}

# --- rust:<version>-<suite> -----------------------------------------------------
make_rust() {
  local image=$1 base=$2 tag want suite
  [[ "$image" == rust:* ]] || die "cannot make $image locally: only rust:<version>-<suite> images can be made"
  tag=${image#rust:}
  want=${tag%%-*}   # 1.95 of 1.95-bookworm
  suite=${tag#*-}   # bookworm
  [[ "$want" =~ ^[0-9]+\.[0-9]+(\.[0-9]+)?$ ]] || die "cannot read a Rust version from $image"
  [[ "$suite" != "$tag" && "$base" == debian:"$suite"* ]] \
    || die "$image is built here from $base, whose Debian suite must match ($suite)"
  command -v rustup >/dev/null 2>&1 || die "making $image needs this machine's rustup toolchains (rustup not found)"

  # The host toolchain whose rustc is version $want (1.95 matches 1.95.x).
  local toolchain="${RUST_TOOLCHAIN:-}" name version
  if [[ -z "$toolchain" ]]; then
    while read -r name _; do
      version=$(rustup run "$name" rustc --version 2>/dev/null | awk '{print $2}') || continue
      if [[ "$version" == "$want" || "$version" == "$want".* ]]; then toolchain=$name; break; fi
    done < <(rustup toolchain list)
  fi
  [[ -n "$toolchain" ]] || die "no rustup toolchain here has rustc $want (rustup toolchain list); set RUST_TOOLCHAIN"
  version=$(rustup run "$toolchain" rustc --version | awk '{print $2}')
  [[ "$version" == "$want" || "$version" == "$want".* ]] \
    || die "toolchain $toolchain is rustc $version, not $want"
  local sysroot host
  sysroot=$(rustup run "$toolchain" rustc --print sysroot)
  host=$(rustup run "$toolchain" rustc -vV | sed -n 's/^host: //p')
  [[ "$host" == x86_64-unknown-linux-gnu || "$host" == aarch64-unknown-linux-gnu ]] \
    || die "toolchain host $host cannot run in a Debian container"
  local name_in_image="$version-$host"
  log "copying toolchain $toolchain (rustc $version, $sysroot, without share/doc)"
  mkdir -p "$work/rust/toolchain"
  tar -C "$sysroot" --exclude=./share/doc -cf - . | tar -C "$work/rust/toolchain" -xf -
  cp "$(readlink -f "$(command -v rustup)")" "$work/rust/rustup"
  # This machine's local CAs (a TLS-inspecting proxy's, a company's), so that
  # cargo in the builder reaches crates.io as this machine does.
  local ca_dir=${EXTRA_CA_DIR-/usr/local/share/ca-certificates} ca_lines="" crt
  mkdir -p "$work/rust/ca"
  if [[ -n "$ca_dir" && -d "$ca_dir" ]]; then
    while IFS= read -r -d '' crt; do cp "$crt" "$work/rust/ca/"; done \
      < <(find "$ca_dir" -maxdepth 1 -name '*.crt' -type f -print0)
  fi
  if compgen -G "$work/rust/ca/*.crt" >/dev/null; then
    log "the builder trusts $(find "$work/rust/ca" -name '*.crt' | wc -l) local CA certificate(s) from $ca_dir"
    ca_lines="COPY ca/ /usr/local/share/ca-certificates/
RUN update-ca-certificates"
  fi
  cat >"$work/rust/Dockerfile" <<EOF
ARG BASE
FROM \${BASE}
RUN set -eux; \\
    apt-get update; \\
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ca-certificates gcc libc6-dev; \\
    rm -rf /var/lib/apt/lists/*
$ca_lines
ENV RUSTUP_HOME=/usr/local/rustup \\
    CARGO_HOME=/usr/local/cargo \\
    PATH=/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \\
    RUST_VERSION=$version
COPY toolchain /usr/local/rustup/toolchains/$name_in_image
COPY rustup /usr/local/cargo/bin/rustup
RUN set -eux; \\
    cd /usr/local/cargo/bin; \\
    for proxy in cargo cargo-clippy cargo-fmt clippy-driver rustc rustdoc rustfmt rust-gdb rust-gdbgui rust-lldb; do \\
      ln -s rustup "\$proxy"; \\
    done; \\
    rustup set profile minimal; \\
    rustup default $name_in_image; \\
    chmod -R a+w "\$RUSTUP_HOME" "\$CARGO_HOME"; \\
    rustup --version; cargo --version; rustc --version
EOF
  log "docker build -> $image (apt-get in the container, then the toolchain)"
  docker build -q --build-arg BASE="$base" -t "$image" "$work/rust" >"$work/build.log" 2>&1 \
    || { tail -n 30 "$work/build.log" >&2; die "building $image failed"; }
  rm -rf "$work/rust"
}

if present "$BASE_IMAGE"; then
  log "$BASE_IMAGE: present"
elif ! try_pull "$BASE_IMAGE"; then
  make_debian "$BASE_IMAGE"
  log "$BASE_IMAGE: made locally"
fi

if present "$RUST_IMAGE"; then
  log "$RUST_IMAGE: present"
elif ! try_pull "$RUST_IMAGE"; then
  make_rust "$RUST_IMAGE" "$BASE_IMAGE"
  log "$RUST_IMAGE: made locally"
fi

for image in "$BASE_IMAGE" "$RUST_IMAGE"; do
  present "$image" || die "$image is still missing"
done
log "ready: $BASE_IMAGE, $RUST_IMAGE"
