package host

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode"

	"github.com/fsnotify/fsnotify"
)

// DropInPath returns the path of the drop-in EnsureInhibitDelay writes.
func (l *Logind) DropInPath() string {
	return filepath.Join(l.cfg.LogindConfDir, dropInName)
}

// EnsureInhibitDelay makes logind's InhibitDelayMaxSec at least budget by
// writing the drop-in 99-lifecycle-agent.conf in Config.LogindConfDir:
//
//	[Login]
//	InhibitDelayMaxSec=N
//
// N is max(budget, the value in the kubelet's 99-kubelet.conf in the same
// directory), in whole seconds rounded up. Our file sorts after the
// kubelet's and so wins; taking the max keeps the kubelet's graceful node
// shutdown budget intact.
//
// The file is written atomically (temp file, fsync, rename, fsync of the
// directory), then logind is told to reload with systemd's
// Manager.KillUnit("systemd-logind.service", "all", SIGHUP).
//
// It is idempotent: when the file already has the wanted content it is not
// rewritten, and logind is reloaded only if its InhibitDelayMaxUSec is
// still below N (an earlier reload failed). changed reports whether the
// file was written or logind reloaded. Logind applies the reload
// asynchronously; read InhibitDelayMax to see the effective value.
func (l *Logind) EnsureInhibitDelay(ctx context.Context, budget time.Duration) (changed bool, err error) {
	if budget <= 0 {
		return false, fmt.Errorf("host: ensure inhibit delay: %w: budget %s", ErrInvalidArgument, budget)
	}
	dir := l.cfg.LogindConfDir
	kubelet, err := readInhibitDelayMaxSec(filepath.Join(dir, kubeletDropInName))
	if err != nil {
		return false, fmt.Errorf("host: ensure inhibit delay: %w", err)
	}
	want := max(budget, kubelet)
	secs := int64(math.Ceil(want.Seconds()))
	content := []byte(fmt.Sprintf("# Written by lifecycle-agent: the shutdown budget, or the kubelet's\n"+
		"# %s if larger. Rewritten by the agent; do not edit.\n"+
		"[Login]\nInhibitDelayMaxSec=%d\n", kubeletDropInName, secs))
	path := l.DropInPath()
	log := l.log.With("path", path, "inhibit_delay_max_sec", secs)

	old, err := os.ReadFile(path)
	switch {
	case err == nil && bytes.Equal(old, content):
		effective, err := l.inhibitDelayMax(ctx)
		if err != nil {
			return false, fmt.Errorf("host: ensure inhibit delay: %w", err)
		}
		if effective >= time.Duration(secs)*time.Second {
			log.Debug("logind drop-in up to date")
			return false, nil
		}
		log.Warn("logind drop-in up to date but not in effect; reloading logind", "effective", effective)
	case err == nil || errors.Is(err, fs.ErrNotExist):
		if err := ensureDir(dir); err != nil {
			return false, fmt.Errorf("host: ensure inhibit delay: %w", err)
		}
		if err := WriteFileAtomic(path, content, 0o644); err != nil {
			return false, fmt.Errorf("host: ensure inhibit delay: %w", err)
		}
		log.Info("logind drop-in written", "budget", budget, "kubelet", kubelet)
	default:
		return false, fmt.Errorf("host: ensure inhibit delay: read %s: %w", path, err)
	}
	if err := l.reloadLogind(ctx); err != nil {
		return true, fmt.Errorf("host: ensure inhibit delay: %w", err)
	}
	return true, nil
}

// ReloadLogind makes systemd-logind re-read its configuration by sending it
// SIGHUP through systemd's Manager.KillUnit.
func (l *Logind) ReloadLogind(ctx context.Context) error {
	if err := l.reloadLogind(ctx); err != nil {
		return fmt.Errorf("host: %w", err)
	}
	return nil
}

func (l *Logind) reloadLogind(ctx context.Context) error {
	if _, err := l.call(ctx, systemd1Dest, systemd1Path, systemd1Manager+".KillUnit", logindUnit, "all", int32(syscall.SIGHUP)); err != nil {
		return fmt.Errorf("reload logind (KillUnit %s SIGHUP): %w", logindUnit, err)
	}
	l.log.Info("logind reload requested")
	return nil
}

// readInhibitDelayMaxSec returns the last InhibitDelayMaxSec of the [Login]
// section of a logind configuration file, or 0 when the file or the key is
// absent.
func readInhibitDelayMaxSec(path string) (time.Duration, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", path, err)
	}
	var (
		section string
		value   time.Duration
	)
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || line[0] == '#' || line[0] == ';':
			continue
		case line[0] == '[':
			section = strings.Trim(line, "[]")
			continue
		}
		key, val, ok := strings.Cut(line, "=")
		if !ok || section != "Login" || strings.TrimSpace(key) != "InhibitDelayMaxSec" {
			continue
		}
		d, err := parseTimespan(strings.TrimSpace(val))
		if err != nil {
			return 0, fmt.Errorf("%w: %s:%d: InhibitDelayMaxSec: %w", ErrInvalidConfig, path, n, err)
		}
		value = d
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("read %s: %w", path, err)
	}
	return value, nil
}

// timespanUnits are systemd's time span units (systemd.time(7)).
var timespanUnits = map[string]time.Duration{
	"us": time.Microsecond, "usec": time.Microsecond, "µs": time.Microsecond,
	"ms": time.Millisecond, "msec": time.Millisecond,
	"": time.Second, "s": time.Second, "sec": time.Second, "second": time.Second, "seconds": time.Second,
	"m": time.Minute, "min": time.Minute, "minute": time.Minute, "minutes": time.Minute,
	"h": time.Hour, "hr": time.Hour, "hour": time.Hour, "hours": time.Hour,
	"d": 24 * time.Hour, "day": 24 * time.Hour, "days": 24 * time.Hour,
}

// parseTimespan parses a systemd time span such as "30", "30s", "1min 30s"
// or "2.5s"; a bare number is seconds. "infinity" is refused: nothing here
// can honour it.
func parseTimespan(s string) (time.Duration, error) {
	if s == "" {
		return 0, errors.New("empty time span")
	}
	var total time.Duration
	rest := s
	for rest = strings.TrimSpace(rest); rest != ""; rest = strings.TrimSpace(rest) {
		i := strings.IndexFunc(rest, func(r rune) bool { return !unicode.IsDigit(r) && r != '.' })
		if i == 0 {
			return 0, fmt.Errorf("time span %q: expected a number at %q", s, rest)
		}
		if i < 0 {
			i = len(rest)
		}
		num, err := strconv.ParseFloat(rest[:i], 64)
		if err != nil {
			return 0, fmt.Errorf("time span %q: %w", s, err)
		}
		rest = strings.TrimLeft(rest[i:], " ")
		j := strings.IndexFunc(rest, func(r rune) bool { return unicode.IsDigit(r) || r == ' ' })
		if j < 0 {
			j = len(rest)
		}
		unit, ok := timespanUnits[rest[:j]]
		if !ok {
			return 0, fmt.Errorf("time span %q: unknown unit %q", s, rest[:j])
		}
		rest = rest[j:]
		total += time.Duration(num * float64(unit))
	}
	return total, nil
}

// WriteFileAtomic replaces path with data so that a crash leaves either the
// old or the new content: it writes a temporary file in the same directory,
// fsyncs it, renames it over path and fsyncs the directory.
func WriteFileAtomic(path string, data []byte, perm os.FileMode) (err error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	tmp, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	if _, err = tmp.Write(data); err != nil {
		return fmt.Errorf("write %s: %w", tmp.Name(), err)
	}
	if err = tmp.Chmod(perm); err != nil {
		return fmt.Errorf("chmod %s: %w", tmp.Name(), err)
	}
	if err = tmp.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", tmp.Name(), err)
	}
	if err = tmp.Close(); err != nil {
		return fmt.Errorf("close %s: %w", tmp.Name(), err)
	}
	if err = os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("rename %s to %s: %w", tmp.Name(), path, err)
	}
	return syncDir(dir)
}

// ensureDir creates dir (0755) if missing and fsyncs its parent so that the
// new entry survives a crash.
func ensureDir(dir string) error {
	if _, err := os.Stat(dir); err == nil {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	return syncDir(filepath.Dir(filepath.Clean(dir)))
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open directory %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync directory %s: %w", dir, err)
	}
	return nil
}

// FollowKubeletDropIn keeps the drop-in at max(budget, the kubelet's) after
// start, until ctx ends: it watches Config.LogindConfDir (inotify) and runs
// EnsureInhibitDelay whenever 99-kubelet.conf is written or removed. The
// case it exists for: on a node's first boot the agent starts before the
// kubelet (Before=kubelet.service) and writes its budget; the kubelet then
// writes its larger shutdownGracePeriod into 99-kubelet.conf and reloads
// logind, but our file sorts after it and wins, so logind keeps the smaller
// value, the kubelet's check of it times out after about 3 s and it runs
// without graceful node shutdown. Following the kubelet's file within
// milliseconds lets that check pass. It returns an error only when the
// directory cannot be watched.
func (l *Logind) FollowKubeletDropIn(ctx context.Context, budget time.Duration) error {
	dir := l.cfg.LogindConfDir
	if err := ensureDir(dir); err != nil {
		return fmt.Errorf("host: follow %s: %w", kubeletDropInName, err)
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("host: follow %s: %w", kubeletDropInName, err)
	}
	defer w.Close()
	if err := w.Add(dir); err != nil {
		return fmt.Errorf("host: follow %s: watch %s: %w", kubeletDropInName, dir, err)
	}
	ensure := func(why string) {
		changed, err := l.EnsureInhibitDelay(ctx, budget)
		switch {
		case err != nil:
			l.log.Warn("could not follow the kubelet's logind drop-in", "why", why, "err", err)
		case changed:
			l.log.Info("logind drop-in follows the kubelet's", "why", why, "path", l.DropInPath())
		}
	}
	ensure("watch started") // a change between the agent's start and the watch
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return fmt.Errorf("host: follow %s: watcher closed", kubeletDropInName)
			}
			if filepath.Base(ev.Name) == kubeletDropInName {
				ensure(ev.Op.String())
			}
		case err, ok := <-w.Errors:
			if !ok {
				return fmt.Errorf("host: follow %s: watcher closed", kubeletDropInName)
			}
			l.log.Warn("watching the logind drop-in directory", "dir", dir, "err", err)
		}
	}
}
