// Package manifests finds the manifest files a command is pointed at: one
// file, or the YAML and JSON files of a directory tree, and reads the
// objects in them one at a time (Objects). `kadmit review`, `--state`,
// `--policies` and `kadmit test` all find their inputs this way.
package manifests

import (
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Files returns path itself when it is not a directory; otherwise every
// regular *.yaml, *.yml and *.json file below it (any case, recursively)
// that keep accepts, in lexical order. keep may be nil (accept all); an
// error from keep, which is where callers enforce their bound on the count,
// stops the walk and is returned. Errors are returned unwrapped, so each
// caller marks them as its own input errors.
func Files(path string, keep func(path string) (bool, error)) ([]string, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !info.IsDir() {
		return []string{path}, nil
	}
	var files []string
	err = filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		switch strings.ToLower(filepath.Ext(p)) {
		case ".yaml", ".yml", ".json":
		default:
			return nil
		}
		if keep != nil {
			ok, err := keep(p)
			if err != nil || !ok {
				return err
			}
		}
		files = append(files, p)
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	return files, nil
}
