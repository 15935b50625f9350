package config

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// DropInSuffix ends the name of every file read from a config.d directory;
// other names are ignored.
const DropInSuffix = ".yaml"

// layers reads every config file Load layers, lowest first (see doc.go,
// "Files and drop-ins"):
//
//  1. vendor/*.yaml, only when path is the default config file, less those
//     masked by a drop-in of the same name in dir(path)/config.d;
//  2. path itself (absent is "no file" unless explicit);
//  3. dir(path)/config.d/*.yaml.
//
// Within a directory the files come in lexical order of their names. Each
// one gets readFile's ownership check and decodeFile's validation.
func layers(path string, explicit bool, vendor string) ([]*fileDecoder, error) {
	dropInDir := filepath.Join(filepath.Dir(path), "config.d")
	dropIns, err := listDropIns(dropInDir)
	if err != nil {
		return nil, err
	}
	var files []*fileDecoder
	if vendor != "" {
		names, err := listDropIns(vendor)
		if err != nil {
			return nil, err
		}
		for _, name := range names {
			if slices.Contains(dropIns, name) {
				continue // masked by the administrator's file of that name
			}
			d, err := readFile(filepath.Join(vendor, name), true)
			if err != nil {
				return nil, err
			}
			files = append(files, d)
		}
	}
	main, err := readFile(path, explicit)
	if err != nil {
		return nil, err
	}
	if main != nil {
		files = append(files, main)
	}
	for _, name := range dropIns {
		d, err := readFile(filepath.Join(dropInDir, name), true)
		if err != nil {
			return nil, err
		}
		files = append(files, d)
	}
	return files, nil
}

// listDropIns returns the names of the drop-ins in dir, in lexical order:
// every entry whose name ends in DropInSuffix and does not start with a
// dot. Anything else (README, x.yaml.dpkg-dist, x.yaml.dpkg-old, x.yml,
// editor backups) is ignored, as systemd ignores files without the .conf
// suffix in its drop-in directories. A missing directory has none.
func listDropIns(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir) // sorted by name
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		return nil, &Error{Source: dir, Msg: "cannot read drop-in directory: " + unwrapPath(err), Err: err}
	}
	var names []string
	for _, e := range entries {
		name := e.Name()
		if strings.HasSuffix(name, DropInSuffix) && !strings.HasPrefix(name, ".") {
			names = append(names, name)
		}
	}
	return names, nil
}

// vendorDir is the vendor directory Load reads for the config file path:
// the package's defaults belong to the package's config file, so they are
// read only when path is the default one (named by --config or not). A
// config file elsewhere (a test's, a second instance's) gets the drop-ins
// beside it and no vendor defaults. Options.DefaultPath without
// Options.VendorDir (a test's own tree) has no vendor directory either.
func vendorDir(o Options, path string) string {
	def, vendor := DefaultPath, o.VendorDir
	if o.DefaultPath != "" {
		def = o.DefaultPath
	} else if vendor == "" {
		vendor = VendorDir
	}
	if filepath.Clean(path) != filepath.Clean(def) {
		return ""
	}
	return vendor
}
