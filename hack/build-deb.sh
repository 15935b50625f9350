#!/usr/bin/env bash
# Build the Debian packages: $DIST/lifecycle-agent_<version>_amd64.deb (the
# node agent) and $DIST/kubectl-lifecycle_<version>_amd64.deb (the kubectl
# plugin, its own package so that a workstation gets no daemon).
#
#   hack/build-deb.sh [VERSION]        (make deb [DEB_VERSION=x.y.z] [DIST=dir])
#
# VERSION is the Debian package version, used verbatim (default 0.1.0): a
# native version, without a -revision. It is also what
# `lifecycle-agent --version` prints. Environment:
#   DIST            output directory (default dist, relative to the repo root)
#   GO              go command (default go)
#   COMMIT          commit recorded in the binary (default: git short hash)
#   DEB_MAINTAINER  the Maintainer field
#   SOURCE_DATE_EPOCH  timestamps in the package, the man pages and the
#                   changelog (default: the last commit's time), so that the
#                   same tree gives the same package
#
# What it does: builds the binaries with cgo, -trimpath, the tag
# kustomize_disable_go_plugin_support and -buildmode=pie (PIE and RELRO, as
# Debian's hardening wants), stripped. The agent is never BIND_NOW (`-z
# now`: go-nvml leaves its symbols unresolved until it dlopens
# libnvidia-ml, see docs/design-notes.md) and the script checks it; the
# plugin, without go-nvml, is. Stages the man pages (`lifecycle-agent
# gen-man`; the plugin's from its --help), the completions and the
# changelog; computes each binary's libc6 dependency with dpkg-shlibdeps;
# runs nfpm v2.45.2 from hack/tools on packaging/deb/nfpm.yaml and
# packaging/deb/nfpm-kubectl.yaml.
#
# Needs: go, gcc, gzip, readelf (binutils), dpkg-shlibdeps (dpkg-dev).
set -euo pipefail

cd "$(dirname "$0")/.."
version=${1:-0.1.0}
dist=${DIST:-dist}
GO=${GO:-go}
tags=kustomize_disable_go_plugin_support
commit=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
maintainer=${DEB_MAINTAINER:-lifecycle-agent maintainers <lifecycle-agent@lists.lifecycle-agent.dev>}
if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
	SOURCE_DATE_EPOCH=$(git log -1 --format=%ct 2>/dev/null || date +%s)
fi
export SOURCE_DATE_EPOCH

# A native Debian version (the project builds its own package: there is no
# separate Debian revision): starts with a digit; letters, digits and . + ~
# only, e.g. 0.1.0, 1.2.3~rc1, 1.2.3+hotfix1.
if ! [[ $version =~ ^[0-9][A-Za-z0-9.+~]*$ ]]; then
	echo "build-deb: bad package version '$version' (want e.g. 0.1.0 or 1.2.3~rc1; no '-revision': the package is native)" >&2
	exit 2
fi
for tool in gzip readelf dpkg-shlibdeps; do
	if ! command -v "$tool" >/dev/null; then
		echo "build-deb: $tool not found (Debian packages: gzip binutils dpkg-dev)" >&2
		exit 1
	fi
done

work=$(mktemp -d "${TMPDIR:-/tmp}/lifecycle-agent-deb.XXXXXX")
trap 'rm -rf "$work"' EXIT
stage=$work/stage
mkdir -p "$work/debian" "$stage/bin" "$stage/man8" "$stage/completion" "$stage/doc"

# Binaries. cgo is required (go-nvml); -s -w strips them as dh_strip would.
# Refuse flags that would make them BIND_NOW (dpkg-buildflags' bindnow).
case " ${CGO_LDFLAGS:-} ${GOFLAGS:-} " in
*"-z,now"* | *"-z now"* | *bindnow*)
	echo "build-deb: CGO_LDFLAGS/GOFLAGS ask for BIND_NOW (-z now); go-nvml needs lazy binding" >&2
	exit 1
	;;
esac
export CGO_ENABLED=1
export CGO_CFLAGS=${CGO_CFLAGS:-"-O2 -g -Wno-deprecated-declarations"}
ldflags="-s -w -X main.version=$version -X main.commit=$commit"
build() { # build PKG OUT
	"$GO" build -tags "$tags" -trimpath -buildmode=pie -ldflags "$ldflags" -o "$2" "$1"
}
build ./cmd/lifecycle-agent "$stage/bin/lifecycle-agent"
if readelf -d "$stage/bin/lifecycle-agent" | grep -Eq 'BIND_NOW|FLAGS.*[[:space:]]NOW'; then
	echo "build-deb: lifecycle-agent is linked with BIND_NOW (-z now): it would die at start on go-nvml's unresolved symbols; check CGO_LDFLAGS" >&2
	exit 1
fi
# The kubectl plugin, for its own package. It has no go-nvml, so it gets
# the full hardening Debian asks for: PIE and BIND_NOW (external link).
mkdir -p "$stage/plugin"
plugin=$stage/plugin/kubectl-lifecycle
"$GO" build -tags "$tags" -trimpath -buildmode=pie -ldflags "$ldflags -linkmode=external -extldflags=-Wl,-z,now" \
	-o "$plugin" ./cmd/kubectl-lifecycle

# Depends: libc6 (>= X) as dpkg-shlibdeps computes it from each package's
# binary (it wants a debian/control to run; its warning that the binaries
# are not in a debhelper package directory does not matter here).
printf 'Source: lifecycle-agent\n\nPackage: lifecycle-agent\nArchitecture: any\n' >"$work/debian/control"
libc_dep_of() { # BINARY
	local shlibs dep
	shlibs=$(cd "$work" && {
		dpkg-shlibdeps -O "-e$1" 2>&1 1>&3 3>&- |
			{ grep -v 'should already be installed' || true; } >&2
	} 3>&1)
	dep=$(sed -n 's/^shlibs:Depends=//p' <<<"$shlibs")
	if [ -z "$dep" ]; then
		echo "build-deb: dpkg-shlibdeps found no dependencies of $1: $shlibs" >&2
		exit 1
	fi
	echo "$dep"
}
libc_dep=$(libc_dep_of "$stage/bin/lifecycle-agent")
libc_dep_plugin=$(libc_dep_of "$plugin")

# Man pages: the agent's in section 8 (a system daemon), from the cobra
# command tree of the binary just built.
agent=$stage/bin/lifecycle-agent
"$agent" gen-man "$stage/man8"
# The plugin's in section 1 (a user command). Every program in /usr/bin
# needs one (Debian policy 12.1, lintian no-manual-page). The plugin has no
# cobra-generated pages (no hidden `gen-man DIR` like the agent's): one
# page, kubectl-lifecycle(1), made of its --help, as help2man would.
mkdir -p "$stage/man1"
help=$("$plugin" --help)
{
	printf '.TH "KUBECTL-LIFECYCLE" "1" "%s" "lifecycle-agent %s" "lifecycle-agent manual"\n' \
		"$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%d)" "$version"
	printf '.SH NAME\nkubectl-lifecycle \\- kubectl plugin that runs node lifecycle transitions through lifecycle-agent\n'
	printf '.SH DESCRIPTION\n.nf\n'
	# roff: a backslash is \e; a line may not start with . or '.
	sed -e 's/\\/\\e/g' -e "s/^\\([.']\\)/\\\\\\&\\1/" <<<"$help"
	printf '.fi\n.SH SEE ALSO\n\\fBlifecycle-agent\\fP(8)\n'
} >"$stage/man1/kubectl-lifecycle.1"
# kubectl_complete-lifecycle, the completion helper kubectl runs.
{
	printf '.TH "KUBECTL_COMPLETE-LIFECYCLE" "1" "%s" "lifecycle-agent %s" "lifecycle-agent manual"\n' \
		"$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%d)" "$version"
	printf '.SH NAME\nkubectl_complete-lifecycle \\- shell completion of kubectl lifecycle, for kubectl\n'
	printf '.SH DESCRIPTION\nkubectl (1.26 and later) runs this program from PATH to complete\n'
	printf '\\fBkubectl lifecycle\\fP command lines; it runs \\fBkubectl-lifecycle __complete\\fP with the words given.\n'
	printf 'It is not meant to be run by hand.\n.SH SEE ALSO\n\\fBkubectl-lifecycle\\fP(1)\n'
} >"$stage/man1/kubectl_complete-lifecycle.1"
gzip -9n "$stage"/man[18]/*
"$agent" completion bash >"$stage/completion/lifecycle-agent"
"$agent" completion zsh >"$stage/completion/_lifecycle-agent"
"$agent" completion fish >"$stage/completion/lifecycle-agent.fish"

# The changelog: one entry for this build. The package is native, so
# policy 12.7 (and lintian's wrong-name-for-changelog-of-native-package)
# names it changelog.gz, not changelog.Debian.gz.
date_rfc2822=$(LC_ALL=C date -u -R -d "@$SOURCE_DATE_EPOCH")
cat >"$stage/doc/changelog" <<EOF
lifecycle-agent ($version) unstable; urgency=medium

  * Build of lifecycle-agent $version from commit $commit.

 -- $maintainer  $date_rfc2822
EOF
gzip -9n "$stage/doc/changelog"

mkdir -p "$dist"
# nfpm v2.45.2, pinned in hack/tools. `go tool -n` builds it (cached) and
# prints its path, so that nfpm runs here, at the repository root, where the
# relative paths in the recipes start; `go -C hack/tools tool nfpm` would
# run it in hack/tools.
nfpm=$("$GO" -C hack/tools tool -n nfpm)
# The recipes read these through ${...}.
export DEB_VERSION=$version DEB_LIBC_DEP=$libc_dep DEB_LIBC_DEP_PLUGIN=$libc_dep_plugin DEB_MAINTAINER=$maintainer STAGE=$stage
umask 022
# Two packages, agent first: lifecycle-agent (the node daemon) and
# kubectl-lifecycle (the plugin, for workstations too). One path a line.
for pkg in lifecycle-agent:packaging/deb/nfpm.yaml kubectl-lifecycle:packaging/deb/nfpm-kubectl.yaml; do
	deb=$dist/${pkg%%:*}_${version}_amd64.deb
	rm -f "$deb"
	"$nfpm" package --config "${pkg#*:}" --packager deb --target "$deb" >&2
	echo "$deb"
done
