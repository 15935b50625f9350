package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"go.yaml.in/yaml/v3"

	"github.com/lifecycle-agent/lifecycle-agent/internal/maintenance"
)

// maxFileSize bounds what Load reads; a config file is a few KiB.
const maxFileSize = 1 << 20

// fileDecoder holds what one config file says, already typed and checked.
type fileDecoder struct {
	path   string
	values map[string]any  // layered key → typed value; null values are absent
	lines  map[string]int  // every key written in the file (null too) → its line
	set    map[string]bool // file-only keys (osUpgrade.profiles, ...) given a non-null value

	osUpgrade OSUpgrade
	exec      Exec
	windows   maintenance.Windows
}

func (d *fileDecoder) at(line int) string { return fmt.Sprintf("%s:%d", d.path, line) }

// nested turns flat values (dotted key → value) into the nested map viper
// layers under env and flags.
func nested(values map[string]any) map[string]any {
	root := map[string]any{}
	for name, v := range values {
		parts := strings.Split(name, ".")
		m := root
		for _, p := range parts[:len(parts)-1] {
			next, ok := m[p].(map[string]any)
			if !ok {
				next = map[string]any{}
				m[p] = next
			}
			m = next
		}
		m[parts[len(parts)-1]] = v
	}
	return root
}

// readFile opens, checks and decodes the config file. It returns (nil, nil)
// when path does not exist and was not given explicitly.
func readFile(path string, explicit bool) (*fileDecoder, error) {
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) && !explicit {
			return nil, nil
		}
		return nil, &Error{Source: path, Msg: "cannot read config file: " + unwrapPath(err), Err: err}
	}
	defer f.Close()
	// Check the file we opened, not the name: no window between check and read.
	fi, err := f.Stat()
	if err != nil {
		return nil, &Error{Source: path, Msg: "stat: " + unwrapPath(err), Err: err}
	}
	if !fi.Mode().IsRegular() {
		return nil, &Error{Source: path, Msg: "not a regular file"}
	}
	if err := checkOwnership(path, fi, os.Geteuid()); err != nil {
		return nil, err
	}
	data, err := io.ReadAll(io.LimitReader(f, maxFileSize+1))
	if err != nil {
		return nil, &Error{Source: path, Msg: "read: " + unwrapPath(err), Err: err}
	}
	if len(data) > maxFileSize {
		return nil, &Error{Source: path, Msg: fmt.Sprintf("file is larger than %d bytes", maxFileSize)}
	}
	return decodeFile(path, data)
}

// checkOwnership refuses a config file that someone other than its owner
// could change: the file carries commands run as root (DESIGN §7).
//   - file or its directory group- or world-writable (a sticky directory,
//     like /tmp, is fine for the directory);
//   - when running as root: file or directory not owned by root.
func checkOwnership(path string, fi fs.FileInfo, euid int) error {
	if m := fi.Mode().Perm(); m&0o022 != 0 {
		return &Error{Source: path, Msg: fmt.Sprintf(
			"file is group- or world-writable (mode %04o); run chmod 600 %s", m, path)}
	}
	if uid, ok := ownerOf(fi); ok && euid == 0 && uid != 0 {
		return &Error{Source: path, Msg: fmt.Sprintf(
			"file is owned by uid %d, not root; run chown root:root %s", uid, path)}
	}
	dir := filepath.Dir(path)
	di, err := os.Stat(dir)
	if err != nil {
		return &Error{Source: dir, Msg: "stat: " + unwrapPath(err), Err: err}
	}
	if m := di.Mode(); m.Perm()&0o022 != 0 && m&fs.ModeSticky == 0 {
		return &Error{Source: dir, Msg: fmt.Sprintf(
			"directory of the config file is group- or world-writable (mode %04o); run chmod go-w %s",
			m.Perm(), dir)}
	}
	if uid, ok := ownerOf(di); ok && euid == 0 && uid != 0 && di.Mode()&fs.ModeSticky == 0 {
		return &Error{Source: dir, Msg: fmt.Sprintf(
			"directory of the config file is owned by uid %d, not root; run chown root:root %s", uid, dir)}
	}
	return nil
}

func ownerOf(fi fs.FileInfo) (int, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	return int(st.Uid), true
}

// unwrapPath drops the "open /path:" part of a *fs.PathError: the path is
// already in the message.
func unwrapPath(err error) string {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err.Error()
	}
	return err.Error()
}

// decodeFile parses one YAML document and checks every key in it against
// the key table: unknown keys, wrong types and bad values are refused with
// the file and line.
func decodeFile(path string, data []byte) (*fileDecoder, error) {
	d := &fileDecoder{path: path, values: map[string]any{}, lines: map[string]int{}, set: map[string]bool{}}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) { // empty, or comments only
			return d, nil
		}
		return nil, &Error{Source: path, Msg: "invalid YAML: " + strings.TrimPrefix(err.Error(), "yaml: "), Err: err}
	}
	var more yaml.Node
	if err := dec.Decode(&more); !errors.Is(err, io.EOF) {
		return nil, &Error{Source: path, Msg: "more than one YAML document (---); keep one"}
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	if isNull(root) {
		return d, nil
	}
	if err := d.walk(root, ""); err != nil {
		return nil, err
	}
	return d, nil
}

// walk checks one mapping at prefix ("" for the top level) and descends
// into the sections it knows.
func (d *fileDecoder) walk(n *yaml.Node, prefix string) error {
	n = deref(n)
	if n.Kind != yaml.MappingNode {
		if prefix != "" {
			return &Error{Source: d.at(n.Line), Key: prefix, Msg: "want a mapping of keys, got " + describe(n)}
		}
		return &Error{Source: d.at(n.Line), Msg: "the file must be a mapping of keys, got " + describe(n)}
	}
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		kn, vn := deref(n.Content[i]), deref(n.Content[i+1])
		name := kn.Value
		full := join(prefix, name)
		if kn.Kind != yaml.ScalarNode || kn.ShortTag() != "!!str" {
			return &Error{Source: d.at(kn.Line), Msg: fmt.Sprintf("unknown key %s", describe(kn))}
		}
		if first, dup := seen[name]; dup {
			return &Error{Source: d.at(kn.Line), Key: full, Msg: fmt.Sprintf("given twice (first at line %d)", first)}
		}
		seen[name] = kn.Line

		k := lookupKey(full)
		switch {
		case k != nil && !k.notInFile:
			d.lines[full] = kn.Line
			if isNull(vn) {
				continue // empty: same as not written
			}
			if k.decode != nil {
				if err := k.decode(d, vn, full); err != nil {
					return err
				}
				d.set[full] = true
				continue
			}
			v, err := k.kind.fromNode(vn)
			if err == nil {
				err = k.validate(v)
			} else if len(k.enum) > 0 {
				err = fmt.Errorf("want %s, got %s", orList(k.enum), describe(vn))
			}
			if err != nil {
				return &Error{Source: d.at(vn.Line), Key: full, Msg: err.Error()}
			}
			d.values[full] = v
		case isSection(full):
			if isNull(vn) {
				continue
			}
			if err := d.walk(vn, full); err != nil {
				return err
			}
		default:
			return &Error{Source: d.at(kn.Line), Msg: fmt.Sprintf("unknown key %q%s",
				full, suggest(name, childNames(prefix), prefix))}
		}
	}
	return nil
}

// isSection reports whether name is a proper prefix of a file key
// (host, drivers, drivers.drain, ...).
func isSection(name string) bool {
	for _, k := range keys {
		if !k.notInFile && strings.HasPrefix(k.name, name+".") {
			return true
		}
	}
	return false
}

// childNames lists the names allowed directly under prefix.
func childNames(prefix string) []string {
	var out []string
	for _, k := range keys {
		if k.notInFile {
			continue
		}
		rest := k.name
		if prefix != "" {
			if !strings.HasPrefix(rest, prefix+".") {
				continue
			}
			rest = strings.TrimPrefix(rest, prefix+".")
		}
		child, _, _ := strings.Cut(rest, ".")
		if !slices.Contains(out, child) {
			out = append(out, child)
		}
	}
	return out
}
