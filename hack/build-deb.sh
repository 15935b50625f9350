#!/usr/bin/env bash
# Build the Debian package: $DIST/lifecycle-agent_<version>_amd64.deb.
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
# Debian's hardening wants; Go adds -z relro, never -z now), stripped, and
# checks they are not BIND_NOW (never `-z now`: go-nvml leaves its symbols
# unresolved until it dlopens libnvidia-ml, see docs/design-notes.md);
# stages the man pages (`lifecycle-agent gen-man`), the bash completion and
# the changelog; computes the libc6 dependency with dpkg-shlibdeps; runs
# nfpm v2.45.2 from hack/tools on packaging/deb/nfpm.yaml.
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
bins=("$stage/bin/lifecycle-agent")
# The kubectl plugin ships when its sources exist (the same rule as
# `make build`). It is built here, like the agent, rather than copied from
# bin/, so that the package never carries a stale or differently built copy.
if compgen -G 'cmd/kubectl-lifecycle/*.go' >/dev/null; then
	build ./cmd/kubectl-lifecycle "$stage/bin/kubectl-lifecycle"
	bins+=("$stage/bin/kubectl-lifecycle")
fi
for b in "${bins[@]}"; do
	if readelf -d "$b" | grep -Eq 'BIND_NOW|FLAGS.*[[:space:]]NOW'; then
		echo "build-deb: $b is linked with BIND_NOW (-z now): it would die at start on go-nvml's unresolved symbols; check CGO_LDFLAGS" >&2
		exit 1
	fi
done

# Depends: libc6 (>= X) as dpkg-shlibdeps computes it from the binaries
# (it wants a debian/control to run; its warning that the binaries are not
# in a debhelper package directory does not matter here).
printf 'Source: lifecycle-agent\n\nPackage: lifecycle-agent\nArchitecture: any\n' >"$work/debian/control"
shlibs=$(cd "$work" && {
	dpkg-shlibdeps -O "${bins[@]/#/-e}" 2>&1 1>&3 3>&- |
		{ grep -v 'should already be installed' || true; } >&2
} 3>&1)
libc_dep=$(sed -n 's/^shlibs:Depends=//p' <<<"$shlibs")
if [ -z "$libc_dep" ]; then
	echo "build-deb: dpkg-shlibdeps found no dependencies: $shlibs" >&2
	exit 1
fi

# The nfpm config: packaging/deb/nfpm.yaml, plus the kubectl plugin.
config=$work/nfpm.yaml
cp packaging/deb/nfpm.yaml "$config"

# Man pages (section 8, the agent is a system daemon) and bash completion,
# from the cobra command tree of the binary just built.
agent=$stage/bin/lifecycle-agent
"$agent" gen-man "$stage/man8"
if [ -x "$stage/bin/kubectl-lifecycle" ]; then
	cat >>"$config" <<'END'

  # Appended by hack/build-deb.sh: the kubectl plugin, and the helper
  # kubectl runs to complete `kubectl lifecycle <TAB>`.
  - src: ${STAGE}/bin/kubectl-lifecycle
    dst: /usr/bin/kubectl-lifecycle
    expand: true
    file_info: {mode: 0755, owner: root, group: root}
  - src: packaging/completion/kubectl_complete-lifecycle
    dst: /usr/bin/kubectl_complete-lifecycle
    file_info: {mode: 0755, owner: root, group: root}
END
	# Every program in /usr/bin needs a man page (Debian policy 12.1,
	# lintian no-manual-page); the plugin, a user command, most likely
	# writes section 1. Each page goes to the directory of its section.
	plugin_man=$work/plugin-man
	if ! "$stage/bin/kubectl-lifecycle" gen-man "$plugin_man" >/dev/null 2>&1 ||
		! compgen -G "$plugin_man/*.[1-9]" >/dev/null; then
		# No cobra-generated pages (the plugin has no hidden `gen-man DIR`
		# like the agent's): one page, kubectl-lifecycle(1), made of its
		# --help, as help2man would.
		echo "build-deb: kubectl-lifecycle has no 'gen-man DIR' command; its man page is its --help" >&2
		rm -rf "$plugin_man"
		mkdir -p "$plugin_man"
		help=$("$stage/bin/kubectl-lifecycle" --help)
		{
			printf '.TH "KUBECTL-LIFECYCLE" "1" "%s" "lifecycle-agent %s" "lifecycle-agent manual"\n' \
				"$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%d)" "$version"
			printf '.SH NAME\nkubectl-lifecycle \\- kubectl plugin that runs node lifecycle transitions through lifecycle-agent\n'
			printf '.SH DESCRIPTION\n.nf\n'
			# roff: a backslash is \e; a line may not start with . or '.
			sed -e 's/\\/\\e/g' -e "s/^\\([.']\\)/\\\\\\&\\1/" <<<"$help"
			printf '.fi\n.SH SEE ALSO\n\\fBlifecycle-agent\\fP(8)\n'
		} >"$plugin_man/kubectl-lifecycle.1"
	fi
	# kubectl_complete-lifecycle, the completion helper kubectl runs.
	{
		printf '.TH "KUBECTL_COMPLETE-LIFECYCLE" "1" "%s" "lifecycle-agent %s" "lifecycle-agent manual"\n' \
			"$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%d)" "$version"
		printf '.SH NAME\nkubectl_complete-lifecycle \\- shell completion of kubectl lifecycle, for kubectl\n'
		printf '.SH DESCRIPTION\nkubectl (1.26 and later) runs this program from PATH to complete\n'
		printf '\\fBkubectl lifecycle\\fP command lines; it runs \\fBkubectl-lifecycle __complete\\fP with the words given.\n'
		printf 'It is not meant to be run by hand.\n.SH SEE ALSO\n\\fBkubectl-lifecycle\\fP(1)\n'
	} >"$plugin_man/kubectl_complete-lifecycle.1"
	for page in "$plugin_man"/*.[1-9]; do
		section=${page##*.}
		if [ ! -d "$stage/man$section" ]; then
			mkdir -p "$stage/man$section"
			cat >>"$config" <<END
  - src: \${STAGE}/man$section/*
    dst: /usr/share/man/man$section/
    expand: true
    file_info: {mode: 0644, owner: root, group: root}
END
		fi
		mv "$page" "$stage/man$section/"
	done
fi
gzip -9n "$stage"/man[1-9]/*
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
deb=$dist/lifecycle-agent_${version}_amd64.deb
rm -f "$deb"
# nfpm v2.45.2, pinned in hack/tools. `go tool -n` builds it (cached) and
# prints its path, so that nfpm runs here, at the repository root, where the
# relative paths in nfpm.yaml start; `go -C hack/tools tool nfpm` would run
# it in hack/tools.
nfpm=$("$GO" -C hack/tools tool -n nfpm)
# nfpm.yaml reads these through ${...}.
export DEB_VERSION=$version DEB_LIBC_DEP=$libc_dep DEB_MAINTAINER=$maintainer STAGE=$stage
umask 022
"$nfpm" package --config "$config" --packager deb --target "$deb" >&2
echo "$deb"
