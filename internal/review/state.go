package review

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/kadmit/kadmit/internal/clustercache"
)

// errBudget ends a bounded read of cluster state.
var errBudget = errors.New("over budget")

// budgetReader counts the bytes read from every file of a state and fails
// once they exceed the bound, so an oversized state costs at most the
// bound plus one buffer.
type budgetReader struct {
	r    io.Reader
	left *int64
}

func (b budgetReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if *b.left -= int64(n); *b.left < 0 {
		return n, errBudget
	}
	return n, err
}

// ReadState loads cluster-state manifests from path (a file or a directory,
// as Read; not stdin), reading at most clustercache.MaxStaticBytes bytes and
// clustercache.MaxStaticObjects objects in all. Errors wrap ErrInput and
// name the file (and document).
func ReadState(path string) ([]Document, error) {
	return readState(path, clustercache.MaxStaticBytes, clustercache.MaxStaticObjects)
}

func readState(path string, maxBytes int64, maxObjects int) ([]Document, error) {
	if path == "-" {
		return nil, fmt.Errorf("%w: --state: a file or directory, not stdin", ErrInput)
	}
	files, err := manifestFiles(path)
	if err != nil {
		return nil, err
	}
	left := maxBytes
	var out []Document
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInput, err)
		}
		// The object bound is the rest of the state's; decodeAll stops at
		// the first object past it, so a huge List is refused after the
		// bound's worth of items, not after decoding it whole.
		docs, err := decodeAll(name, budgetReader{r: f, left: &left}, maxObjects-len(out))
		f.Close()
		if errors.Is(err, errBudget) {
			return nil, fmt.Errorf("%w: %s: cluster state is larger than %d bytes", ErrInput, name, maxBytes)
		}
		if errors.Is(err, errTooMany) {
			return nil, fmt.Errorf("%w: %s (document %d): cluster state has more than %d objects", ErrInput, name,
				maxObjects-len(out), maxObjects)
		}
		if err != nil {
			return nil, err
		}
		out = append(out, docs...)
	}
	return out, nil
}

// LoadState reads the cluster state at path (ReadState) and builds from it
// the informer caches of resources with clustercache.NewStatic, the caches
// `kadmit serve` would start against a cluster holding those objects. The
// informers run until ctx ends. Errors wrap ErrInput.
func LoadState(ctx context.Context, path string, resources []clustercache.Read) (*clustercache.Caches, error) {
	docs, err := ReadState(path)
	if err != nil {
		return nil, err
	}
	objs := make([]clustercache.StaticObject, len(docs))
	for i, d := range docs {
		objs[i] = clustercache.StaticObject{Source: d.Source, Index: d.Index, Raw: d.Object}
	}
	c, err := clustercache.NewStatic(ctx, resources, objs)
	if err != nil {
		return nil, fmt.Errorf("%w: --state %s: %w", ErrInput, path, err)
	}
	return c, nil
}
