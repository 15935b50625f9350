package journal

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// corruptTimeFormat names a corrupt file: "<path>.corrupt-20261130T101500Z".
const corruptTimeFormat = "20060102T150405Z"

// moveAside renames the corrupt journal at path to
// "<path>.corrupt-<UTC time>" (adding "-2", "-3", ... if that name is taken)
// and fsyncs the directory. It refuses while another process holds the file.
func moveAside(path string, now time.Time) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	// bbolt locks with flock; hold an exclusive one across the rename so
	// that a file in use by another process is never moved.
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return "", fmt.Errorf("%w: %s", ErrLocked, path)
		}
		return "", fmt.Errorf("lock %s: %w", path, err)
	}
	base := path + ".corrupt-" + now.UTC().Format(corruptTimeFormat)
	target := base
	for i := 2; ; i++ {
		if _, err := os.Lstat(target); errors.Is(err, os.ErrNotExist) {
			break
		} else if err != nil {
			return "", err
		}
		target = fmt.Sprintf("%s-%d", base, i)
	}
	if err := os.Rename(path, target); err != nil {
		return "", err
	}
	if err := syncDir(filepath.Dir(path)); err != nil {
		return target, err
	}
	return target, nil
}

// syncDir makes the directory entries of dir durable (a created, renamed or
// removed file).
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	if err := d.Sync(); err != nil {
		_ = d.Close()
		return fmt.Errorf("fsync %s: %w", dir, err)
	}
	return d.Close()
}

// syncFile fsyncs the file at path.
func syncFile(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return fmt.Errorf("fsync %s: %w", path, err)
	}
	return f.Close()
}
