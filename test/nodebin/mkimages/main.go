// Command mkimages writes the test node's container images as image
// tarballs that `ctr images import` reads, built with go-containerregistry
// (no registry is reachable from the VM): one layer holding a static binary
// at /<name>, its entrypoint, linux/amd64.
//
//	mkimages -out DIR NAME=BINARY=REF ...
//
// e.g. pause=bin/pause=lifecycle.test/pause:1 writes DIR/pause.tar.
package main

import (
	"archive/tar"
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

func main() {
	out := flag.String("out", ".", "output directory")
	flag.Parse()
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: mkimages -out DIR NAME=BINARY=REF ...")
		os.Exit(2)
	}
	for _, a := range flag.Args() {
		parts := strings.SplitN(a, "=", 3)
		if len(parts) != 3 {
			fmt.Fprintf(os.Stderr, "mkimages: %q: want NAME=BINARY=REF\n", a)
			os.Exit(2)
		}
		if err := build(parts[0], parts[1], parts[2], filepath.Join(*out, parts[0]+".tar")); err != nil {
			fmt.Fprintf(os.Stderr, "mkimages: %s: %v\n", parts[0], err)
			os.Exit(1)
		}
	}
}

// mtime is fixed so that the same binary gives the same image digest.
var mtime = time.Unix(0, 0)

func build(base, bin, ref, dst string) error {
	data, err := os.ReadFile(bin)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: base, Mode: 0o755, Size: int64(len(data)), ModTime: mtime, Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	if _, err := tw.Write(data); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(buf.Bytes())), nil
	})
	if err != nil {
		return err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Created = v1.Time{Time: mtime}
	cf.Config.Entrypoint = []string{"/" + base}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return err
	}
	tag, err := name.NewTag(ref)
	if err != nil {
		return err
	}
	tmp := dst + ".tmp"
	if err := tarball.WriteToFile(tmp, tag, img); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}
