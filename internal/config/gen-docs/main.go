// Command gen-docs writes docs/configuration.md and packaging/config.yaml
// from the key table of package config. Run it from the repository root:
//
//	go run ./internal/config/gen-docs
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/lifecycle-agent/lifecycle-agent/internal/config"
)

func main() {
	root := flag.String("root", ".", "repository root")
	flag.Parse()
	if err := run(*root); err != nil {
		fmt.Fprintln(os.Stderr, "gen-docs:", err)
		os.Exit(1)
	}
}

func run(root string) error {
	for name, data := range map[string][]byte{
		config.ReferenceFile: config.Reference(),
		config.ExampleFile:   config.Example(),
	} {
		path := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(path, data, 0o644); err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
	}
	return nil
}
