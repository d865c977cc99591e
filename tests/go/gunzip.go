// gunzip writes to stdout what Go's compress/gzip (the reader KubeRay's history server
// uses, in its default multistream mode) decodes from the gzip file named by its argument.
// Used by tests/gzip_readers.rs.
package main

import (
	"compress/gzip"
	"fmt"
	"io"
	"os"
)

func main() {
	f, err := os.Open(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	r, err := gzip.NewReader(f)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if _, err := io.Copy(os.Stdout, r); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
