package journal

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// The clean-close marker, "<path>.clean", is written by Close after the
// database is closed and names the file exactly as it was left: inode,
// size, and modification and change times in nanoseconds. Open with
// Options.TrustCleanClose skips the check subprocess when the marker matches
// the file, and removes the marker (durably) before it opens the file for
// writing. So the marker exists only while no process has the journal open
// for writing, and only for the bytes the last Close left: a crash, a power
// cut, a restore from backup or any later write leaves no marker or one
// that does not match, and the next Open checks the whole file.

func cleanMarkerPath(path string) string { return path + ".clean" }

func fileIdentity(fi fs.FileInfo) (string, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return "", false
	}
	return fmt.Sprintf("v1 ino=%d size=%d mtime=%d ctime=%d", st.Ino, fi.Size(),
		st.Mtim.Sec*1e9+st.Mtim.Nsec, st.Ctim.Sec*1e9+st.Ctim.Nsec), true
}

func writeCleanMarker(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	id, ok := fileIdentity(fi)
	if !ok {
		return nil
	}
	tmp := cleanMarkerPath(path) + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, fileMode)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(id + "\n"); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, cleanMarkerPath(path)); err != nil {
		return err
	}
	return syncDir(filepath.Dir(path))
}

// cleanlyClosed reports whether the marker names fi.
func cleanlyClosed(path string, fi fs.FileInfo) bool {
	b, err := os.ReadFile(cleanMarkerPath(path))
	if err != nil {
		return false
	}
	id, ok := fileIdentity(fi)
	return ok && strings.TrimSpace(string(b)) == id
}

// dropCleanMarker removes the marker durably; a missing one is fine.
func dropCleanMarker(path string) error {
	err := os.Remove(cleanMarkerPath(path))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("journal: remove %s: %w", cleanMarkerPath(path), err)
	}
	if err := syncDir(filepath.Dir(path)); err != nil {
		return fmt.Errorf("journal: remove %s: %w", cleanMarkerPath(path), err)
	}
	return nil
}
