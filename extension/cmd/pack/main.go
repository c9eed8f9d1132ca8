// Command pack writes the browser extension's zip: make extension runs
//
//	go run ./extension/cmd/pack -o bin/cheetah-extension.zip extension/src
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cheetahbroker/cheetah/extension/internal/pack"
)

func main() {
	out := flag.String("o", "bin/cheetah-extension.zip", "the zip to write")
	flag.Usage = func() {
		fmt.Fprintln(flag.CommandLine.Output(), "usage: pack [-o file.zip] [extension-source-dir]")
		flag.PrintDefaults()
	}
	flag.Parse()
	src := "extension/src"
	if flag.NArg() > 0 {
		src = flag.Arg(0)
	}
	if err := os.MkdirAll(filepath.Dir(*out), 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	m, err := pack.WriteFile(src, *out)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("wrote %s (%s %s)\n", *out, m.Name, m.Version)
}
