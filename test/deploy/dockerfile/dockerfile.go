// Package dockerfile runs the build stage of kadmit's Dockerfile as a
// script on this machine (no container engine is needed) and checks that
// the binary it produces is static, which is what lets the final stage be
// distroless "static".
//
// It understands the instructions that stage uses: FROM, WORKDIR, COPY
// (from the build context, honouring .dockerignore), ARG, ENV and RUN, with
// backslash continuations. Anything else in the build stage is an error, so
// a Dockerfile change that this emulation cannot follow fails loudly.
package dockerfile

import (
	"bufio"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strings"
)

// Instruction is one Dockerfile instruction.
type Instruction struct {
	Cmd  string // upper case: FROM, RUN, ...
	Args string
	Line int
}

// Stage is one FROM ... [AS name] and what follows.
type Stage struct {
	Name, Base   string
	Instructions []Instruction
}

// Parse reads a Dockerfile into stages.
func Parse(r io.Reader) ([]Stage, error) {
	var stages []Stage
	sc := bufio.NewScanner(r)
	var cur strings.Builder
	lineNo, start := 0, 0
	flush := func() error {
		s := strings.TrimSpace(cur.String())
		cur.Reset()
		if s == "" {
			return nil
		}
		cmd, args, _ := strings.Cut(s, " ")
		in := Instruction{Cmd: strings.ToUpper(cmd), Args: strings.TrimSpace(args), Line: start}
		if in.Cmd == "FROM" {
			f := strings.Fields(in.Args)
			st := Stage{}
			for i := 0; i < len(f); i++ {
				switch {
				case strings.HasPrefix(f[i], "--"):
				case strings.EqualFold(f[i], "AS") && i+1 < len(f):
					st.Name = f[i+1]
					i++
				case st.Base == "":
					st.Base = f[i]
				}
			}
			stages = append(stages, st)
			return nil
		}
		if len(stages) == 0 {
			if in.Cmd == "ARG" {
				return nil // global ARG before the first FROM
			}
			return fmt.Errorf("line %d: %s before FROM", in.Line, in.Cmd)
		}
		stages[len(stages)-1].Instructions = append(stages[len(stages)-1].Instructions, in)
		return nil
	}
	for sc.Scan() {
		lineNo++
		l := sc.Text()
		t := strings.TrimSpace(l)
		if cur.Len() == 0 && (t == "" || strings.HasPrefix(t, "#")) {
			continue
		}
		if cur.Len() > 0 && strings.HasPrefix(t, "#") {
			continue // comment inside a continued instruction
		}
		if cur.Len() == 0 {
			start = lineNo
		}
		if strings.HasSuffix(t, "\\") {
			cur.WriteString(strings.TrimSuffix(t, "\\") + " ")
			continue
		}
		cur.WriteString(t)
		if err := flush(); err != nil {
			return nil, err
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return stages, flush()
}

// Ignore is a parsed .dockerignore.
type Ignore struct {
	rules []ignoreRule
}

type ignoreRule struct {
	re     *regexp.Regexp
	negate bool
}

// ParseIgnore reads .dockerignore patterns (Go filepath.Match syntax plus
// "**", "!" negation, last match wins, as Docker does).
func ParseIgnore(r io.Reader) (*Ignore, error) {
	ig := &Ignore{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		p := strings.TrimSpace(sc.Text())
		if p == "" || strings.HasPrefix(p, "#") {
			continue
		}
		neg := strings.HasPrefix(p, "!")
		p = strings.TrimPrefix(p, "!")
		p = strings.Trim(path.Clean(strings.TrimPrefix(p, "/")), "/")
		var re strings.Builder
		re.WriteString("^")
		for i := 0; i < len(p); i++ {
			switch {
			case strings.HasPrefix(p[i:], "**/"):
				re.WriteString("(.*/)?")
				i += 2
			case strings.HasPrefix(p[i:], "**"):
				re.WriteString(".*")
				i++
			case p[i] == '*':
				re.WriteString("[^/]*")
			case p[i] == '?':
				re.WriteString("[^/]")
			default:
				re.WriteString(regexp.QuoteMeta(string(p[i])))
			}
		}
		re.WriteString("$")
		rx, err := regexp.Compile(re.String())
		if err != nil {
			return nil, fmt.Errorf(".dockerignore %q: %w", p, err)
		}
		ig.rules = append(ig.rules, ignoreRule{rx, neg})
	}
	return ig, sc.Err()
}

// Excluded reports whether rel (slash-separated, relative to the context)
// stays out of the build context: the last pattern matching it or one of
// its parent directories decides.
func (ig *Ignore) Excluded(rel string) bool {
	excluded := false
	parts := strings.Split(rel, "/")
	for _, r := range ig.rules {
		for i := 1; i <= len(parts); i++ {
			if r.re.MatchString(strings.Join(parts[:i], "/")) {
				excluded = !r.negate
				break
			}
		}
	}
	return excluded
}

// Result of running a build stage.
type Result struct {
	// Root stands for the image's filesystem root: WORKDIR /src is Root/src.
	Root string
	// Workdir is the stage's final WORKDIR inside Root.
	Workdir string
	// Log is the RUN commands' combined output.
	Log string
}

// RunStage runs stage name of the Dockerfile in contextDir, with build
// args, in root (a fresh directory). RUN commands run with bash in the
// emulated WORKDIR, with the build args and ENV set, and with the host's Go
// caches so modules are not downloaded twice.
func RunStage(contextDir, dockerfile, name, root string, buildArgs map[string]string) (*Result, error) {
	f, err := os.Open(dockerfile)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	stages, err := Parse(f)
	if err != nil {
		return nil, err
	}
	var st *Stage
	for i := range stages {
		if stages[i].Name == name {
			st = &stages[i]
		}
	}
	if st == nil {
		return nil, fmt.Errorf("no stage %q", name)
	}
	ig := &Ignore{}
	if b, err := os.Open(filepath.Join(contextDir, ".dockerignore")); err == nil {
		ig, err = ParseIgnore(b)
		b.Close()
		if err != nil {
			return nil, err
		}
	}
	res := &Result{Root: root, Workdir: "/"}
	env := map[string]string{}
	var log strings.Builder
	for _, in := range st.Instructions {
		switch in.Cmd {
		case "WORKDIR":
			res.Workdir = path.Join(res.Workdir, in.Args)
			if err := os.MkdirAll(filepath.Join(root, res.Workdir), 0o755); err != nil {
				return nil, err
			}
		case "ARG":
			k, def, _ := strings.Cut(in.Args, "=")
			if v, ok := buildArgs[k]; ok {
				def = v
			}
			env[k] = def
		case "ENV":
			k, v, _ := strings.Cut(in.Args, "=")
			env[k] = v
		case "COPY":
			f := strings.Fields(in.Args)
			if strings.HasPrefix(f[0], "--") {
				return nil, fmt.Errorf("line %d: COPY %s not emulated in the build stage", in.Line, f[0])
			}
			dest := f[len(f)-1]
			if !path.IsAbs(dest) {
				dest = path.Join(res.Workdir, dest)
			}
			for _, src := range f[:len(f)-1] {
				if err := copyContext(contextDir, src, filepath.Join(root, dest), ig, len(f) > 2 || strings.HasSuffix(f[len(f)-1], "/")); err != nil {
					return nil, fmt.Errorf("line %d: COPY %s: %w", in.Line, src, err)
				}
			}
		case "RUN":
			cmd := exec.Command("bash", "-euo", "pipefail", "-c", in.Args)
			cmd.Dir = filepath.Join(root, res.Workdir)
			cmd.Env = os.Environ()
			for k, v := range env {
				cmd.Env = append(cmd.Env, k+"="+v)
			}
			out, err := cmd.CombinedOutput()
			fmt.Fprintf(&log, "# line %d: RUN %s\n%s", in.Line, in.Args, out)
			if err != nil {
				res.Log = log.String()
				return res, fmt.Errorf("line %d: RUN %s: %w\n%s", in.Line, in.Args, err, out)
			}
		default:
			return nil, fmt.Errorf("line %d: %s not emulated in the build stage", in.Line, in.Cmd)
		}
	}
	res.Log = log.String()
	return res, nil
}

// copyContext copies src (relative to the context; a file or a directory's
// contents) to dest, leaving out what .dockerignore excludes. A missing or
// fully excluded source is an error, as in docker build.
func copyContext(contextDir, src, dest string, ig *Ignore, destIsDir bool) error {
	base := filepath.Join(contextDir, filepath.FromSlash(src))
	info, err := os.Stat(base)
	if err != nil {
		return err
	}
	copied := 0
	if !info.IsDir() {
		if ig.Excluded(path.Clean(src)) {
			return errors.New("excluded by .dockerignore")
		}
		target := dest
		if destIsDir {
			target = filepath.Join(dest, filepath.Base(base))
		}
		return copyFile(base, target)
	}
	err = filepath.WalkDir(base, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(contextDir, p)
		if d.IsDir() || ig.Excluded(filepath.ToSlash(rel)) {
			return nil
		}
		inner, _ := filepath.Rel(base, p)
		copied++
		return copyFile(p, filepath.Join(dest, inner))
	})
	if err == nil && copied == 0 {
		return errors.New("nothing to copy after .dockerignore")
	}
	return err
}

func copyFile(src, dst string) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o644)
}

// CheckStatic fails unless path is an ELF executable with no program
// interpreter and no dynamic section: it needs no libc or loader, so it
// runs on distroless "static" (or scratch).
func CheckStatic(p string) error {
	f, err := elf.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	for _, prog := range f.Progs {
		switch prog.Type {
		case elf.PT_INTERP:
			return fmt.Errorf("%s has a program interpreter (dynamically linked)", p)
		case elf.PT_DYNAMIC:
			return fmt.Errorf("%s has a dynamic section", p)
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		return fmt.Errorf("%s needs shared libraries %v", p, libs)
	}
	return nil
}
