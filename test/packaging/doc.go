// Package packaging holds the tests of the Debian package and of the
// systemd unit; it has no non-test code.
//
// The tests build the package once with `make deb` (hack/build-deb.sh,
// nfpm v2.45.2 from hack/tools) into a temporary DIST directory and then
// check what an administrator would get:
//
//   - dpkg-deb --info and --contents: fields, dependencies, every file with
//     its mode and owner, the conffile (/etc/lifecycle-agent/config.yaml,
//     0600 root:root), a man page for every program;
//   - the extracted binary runs (`--version` prints the package version), is
//     PIE and never BIND_NOW, and was built with the kustomize tag and cgo;
//   - lintian --fail-on error,warning is clean (bookworm's lintian 2.116; the
//     few findings that are intended are overridden with a reason in
//     packaging/deb/lintian-overrides);
//   - systemd-analyze verify is clean on the unit as installed, with
//     --root on the extracted package so that ExecStart= and the man page of
//     Documentation= are checked for real; systemd-analyze security
//     --offline=yes gives the exposure recorded in the unit's header, and the
//     hardening that must stay off (device access, /sys) stays off;
//   - the maintainer scripts pass sh -n and shellcheck, and run against
//     recording stubs of deb-systemd-helper, deb-systemd-invoke and systemctl:
//     without systemd as PID 1 (a chroot), and, in a private mount namespace
//     where /run/systemd/system exists, with it (install, upgrade, remove,
//     purge);
//   - an upgrade with plain dpkg -i (dpkg --root on an empty root, no
//     --force-conf*, stdin not a terminal) over an edited config.yaml and an
//     admin drop-in, to a version whose vendor defaults
//     (/usr/lib/lifecycle-agent/config.d) changed: no conffile question, the
//     admin's files kept, each value loaded from the right layer; and, as
//     the control, the same upgrade to a package whose conffile changed
//     stops at dpkg's question (TestUpgradeKeepsAdminConfig).
//
// What these tests cannot show is dpkg installing, upgrading, removing and
// purging the package on a machine booted with systemd, the agent starting
// under the unit's sandbox and reaching logind; the VM tests (make test-vm)
// do that.
//
// Tools: make, dpkg, dpkg-deb, dpkg-query, dpkg-shlibdeps, readelf,
// lintian, systemd-analyze, man, shellcheck, unshare.
// When one is missing and the test runs as root on Debian, it installs the
// Debian package with apt-get (CI lists them in .ci/run); otherwise it fails
// and names the package. In -short mode the tests are skipped.
package packaging
