package image

// A reader of the small part of the Dockerfile language the image uses, and an
// interpreter of its build and final stages on the local file system. It
// refuses, naming the instruction, whatever it does not know, so that a change
// to the Dockerfile it cannot follow fails the tests instead of passing them.

import (
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
)

// instruction is one Dockerfile instruction, its continuation lines joined.
type instruction struct {
	line int    // first line, 1-based
	cmd  string // keyword, upper case
	args string // the rest, as written
}

func (in instruction) String() string {
	return fmt.Sprintf("Dockerfile:%d: %s %s", in.line, in.cmd, in.args)
}

// stage is one FROM and the instructions up to the next.
type stage struct {
	from     instruction
	base     string // image, ARGs expanded
	platform string // --platform, as written
	name     string // AS name
	instrs   []instruction
}

// dockerfile is a parsed Dockerfile.
type dockerfile struct {
	globalArgs map[string]string // ARGs before the first FROM, with their defaults
	stages     []*stage
}

// parseDockerfile reads a Dockerfile: comment lines are dropped (inside
// continuations too, as Docker does), lines ending in a backslash continue.
func parseDockerfile(text string) (*dockerfile, error) {
	var instrs []instruction
	var cur strings.Builder
	start := 0
	for i, raw := range strings.Split(text, "\n") {
		line := strings.TrimSpace(raw)
		if strings.HasPrefix(line, "#") || (line == "" && cur.Len() > 0) {
			continue
		}
		if line == "" {
			continue
		}
		if cur.Len() == 0 {
			start = i + 1
		} else {
			cur.WriteByte(' ')
		}
		if strings.HasSuffix(line, `\`) {
			cur.WriteString(strings.TrimSuffix(line, `\`))
			continue
		}
		cur.WriteString(line)
		kw, rest, _ := strings.Cut(cur.String(), " ")
		instrs = append(instrs, instruction{line: start, cmd: strings.ToUpper(kw), args: strings.TrimSpace(rest)})
		cur.Reset()
	}
	if cur.Len() > 0 {
		return nil, fmt.Errorf("Dockerfile:%d: continuation at the end of the file", start)
	}
	df := &dockerfile{globalArgs: map[string]string{}}
	for _, in := range instrs {
		switch {
		case in.cmd == "FROM":
			words, err := shellWords(in.args, nil)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", in, err)
			}
			st := &stage{from: in}
			for len(words) > 0 && strings.HasPrefix(words[0], "--") {
				if p, ok := strings.CutPrefix(words[0], "--platform="); ok {
					st.platform = p
				}
				words = words[1:]
			}
			// The image is expanded with the global ARGs only.
			raw := strings.Fields(in.args)
			for len(raw) > 0 && strings.HasPrefix(raw[0], "--") {
				raw = raw[1:]
			}
			if len(raw) != 1 && !(len(raw) == 3 && strings.EqualFold(raw[1], "AS")) {
				return nil, fmt.Errorf("%s: want FROM [--platform=P] IMAGE [AS NAME]", in)
			}
			base, err := expandWord(raw[0], lookupIn(df.globalArgs))
			if err != nil {
				return nil, fmt.Errorf("%s: %w", in, err)
			}
			st.base = base
			if len(raw) == 3 {
				st.name = raw[2]
			}
			df.stages = append(df.stages, st)
		case len(df.stages) == 0:
			if in.cmd != "ARG" {
				return nil, fmt.Errorf("%s: only ARG may come before the first FROM", in)
			}
			name, def, _ := strings.Cut(in.args, "=")
			v, err := expandWord(def, lookupIn(df.globalArgs))
			if err != nil {
				return nil, fmt.Errorf("%s: %w", in, err)
			}
			df.globalArgs[name] = v
		default:
			st := df.stages[len(df.stages)-1]
			st.instrs = append(st.instrs, in)
		}
	}
	if len(df.stages) == 0 {
		return nil, fmt.Errorf("Dockerfile: no FROM")
	}
	return df, nil
}

// stageNamed returns the stage called name (or with that index).
func (df *dockerfile) stageNamed(name string) *stage {
	for i, st := range df.stages {
		if st.name == name || fmt.Sprint(i) == name {
			return st
		}
	}
	return nil
}

func lookupIn(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

// expandWord expands one word the way a shell would (quotes removed).
func expandWord(s string, lookup func(string) (string, bool)) (string, error) {
	words, err := shellWords(s, lookup)
	if err != nil {
		return "", err
	}
	return strings.Join(words, " "), nil
}

// opAnd is the token shellWords returns for an unquoted &&.
const opAnd = "\x00&&"

// shellWords splits s into words as /bin/sh would: single and double quotes,
// backslash escapes, $NAME, ${NAME}, ${NAME:-default} and ${NAME-default}
// (unset names expand to nothing; a nil lookup leaves $ alone), and && as the
// token opAnd. Other operators (; | || > < & backquotes $( ) are refused: the
// interpreter would not run them as a shell does.
func shellWords(s string, lookup func(string) (string, bool)) ([]string, error) {
	var words []string
	var w strings.Builder
	inWord := false
	flush := func() {
		if inWord {
			words = append(words, w.String())
		}
		w.Reset()
		inWord = false
	}
	expand := func(i int) (int, error) { // s[i] == '$'
		if lookup == nil {
			w.WriteByte('$')
			return i + 1, nil
		}
		j := i + 1
		if j < len(s) && s[j] == '{' {
			end := strings.IndexByte(s[j:], '}')
			if end < 0 {
				return 0, fmt.Errorf("unclosed ${ in %q", s)
			}
			expr := s[j+1 : j+end]
			name, def, hasDef := expr, "", false
			if k := strings.Index(expr, ":-"); k >= 0 {
				name, def, hasDef = expr[:k], expr[k+2:], true
			} else if k := strings.IndexByte(expr, '-'); k >= 0 {
				name, def = expr[:k], expr[k+1:]
				if v, ok := lookup(name); ok {
					w.WriteString(v)
				} else {
					w.WriteString(def)
				}
				return j + end + 1, nil
			}
			if !regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`).MatchString(name) {
				return 0, fmt.Errorf("unsupported expansion ${%s}", expr)
			}
			v, _ := lookup(name)
			if v == "" && hasDef {
				v = def
			}
			w.WriteString(v)
			return j + end + 1, nil
		}
		k := j
		for k < len(s) && (s[k] == '_' || ('a' <= s[k] && s[k] <= 'z') || ('A' <= s[k] && s[k] <= 'Z') || (k > j && '0' <= s[k] && s[k] <= '9')) {
			k++
		}
		if k == j {
			if j < len(s) && s[j] == '(' {
				return 0, fmt.Errorf("command substitution in %q", s)
			}
			w.WriteByte('$')
			return j, nil
		}
		v, _ := lookup(s[j:k])
		w.WriteString(v)
		return k, nil
	}
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n':
			flush()
			i++
		case c == '&' && i+1 < len(s) && s[i+1] == '&':
			flush()
			words = append(words, opAnd)
			i += 2
		case strings.IndexByte(";|<>&`()", c) >= 0:
			return nil, fmt.Errorf("shell operator %q in %q: not supported by the test's interpreter", c, s)
		case c == '\\':
			inWord = true
			if i+1 < len(s) {
				w.WriteByte(s[i+1])
			}
			i += 2
		case c == '\'':
			inWord = true
			end := strings.IndexByte(s[i+1:], '\'')
			if end < 0 {
				return nil, fmt.Errorf("unclosed ' in %q", s)
			}
			w.WriteString(s[i+1 : i+1+end])
			i += end + 2
		case c == '"':
			inWord = true
			i++
			for {
				if i >= len(s) {
					return nil, fmt.Errorf("unclosed \" in %q", s)
				}
				if s[i] == '"' {
					i++
					break
				}
				if s[i] == '\\' && i+1 < len(s) && strings.IndexByte("$\"\\`", s[i+1]) >= 0 {
					w.WriteByte(s[i+1])
					i += 2
					continue
				}
				if s[i] == '`' {
					return nil, fmt.Errorf("command substitution in %q", s)
				}
				if s[i] == '$' {
					var err error
					if i, err = expand(i); err != nil {
						return nil, err
					}
					continue
				}
				w.WriteByte(s[i])
				i++
			}
		case c == '$':
			inWord = true
			var err error
			if i, err = expand(i); err != nil {
				return nil, err
			}
		default:
			inWord = true
			w.WriteByte(c)
			i++
		}
	}
	flush()
	return words, nil
}

// keyValues parses the arguments of LABEL or ENV: k=v pairs (quoted values),
// or ENV's legacy "k v".
func keyValues(in instruction, lookup func(string) (string, bool)) ([][2]string, error) {
	words, err := shellWords(in.args, lookup)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", in, err)
	}
	if len(words) >= 1 && !strings.Contains(words[0], "=") && in.cmd == "ENV" {
		return [][2]string{{words[0], strings.Join(words[1:], " ")}}, nil
	}
	var kv [][2]string
	for _, w := range words {
		k, v, ok := strings.Cut(w, "=")
		if !ok {
			return nil, fmt.Errorf("%s: %q is not key=value", in, w)
		}
		kv = append(kv, [2]string{k, v})
	}
	return kv, nil
}

// command is one simple command of a RUN: its inline variable assignments and
// its arguments.
type command struct {
	env  []string
	argv []string
}

func (c command) String() string {
	return strings.Join(append(append([]string{}, c.env...), c.argv...), " ")
}

var assignment = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*=`)

// runCommands splits a shell-form RUN into its commands (joined by &&), its
// options (--mount=..., --network=...) dropped.
func runCommands(in instruction, lookup func(string) (string, bool)) ([]command, error) {
	if strings.HasPrefix(in.args, "[") {
		return nil, fmt.Errorf("%s: exec-form RUN is not supported by the test's interpreter", in)
	}
	words, err := shellWords(in.args, lookup)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", in, err)
	}
	for len(words) > 0 && strings.HasPrefix(words[0], "--") {
		words = words[1:]
	}
	var cmds []command
	var cur command
	for _, w := range append(words, opAnd) {
		if w == opAnd {
			if len(cur.argv) == 0 {
				return nil, fmt.Errorf("%s: empty command", in)
			}
			cmds = append(cmds, cur)
			cur = command{}
			continue
		}
		if len(cur.argv) == 0 && assignment.MatchString(w) {
			cur.env = append(cur.env, w)
			continue
		}
		cur.argv = append(cur.argv, w)
	}
	return cmds, nil
}

// stageFS maps the paths of a build stage onto the local file system: the
// directory the build context was copied to onto ctx, every other path under
// root.
type stageFS struct {
	ctxMount string // where COPY . put the context, in the stage
	ctx      string // the local copy of the context
	root     string // the local directory standing for the stage's /
}

func (m stageFS) local(p string) string {
	p = path.Clean(p)
	if m.ctxMount != "" && (p == m.ctxMount || strings.HasPrefix(p, m.ctxMount+"/")) {
		return filepath.Join(m.ctx, filepath.FromSlash(strings.TrimPrefix(p, m.ctxMount)))
	}
	return filepath.Join(m.root, filepath.FromSlash(p))
}

// abs resolves p against the working directory wd (both stage paths).
func abs(wd, p string) string {
	if path.IsAbs(p) {
		return path.Clean(p)
	}
	return path.Join(wd, p)
}

// copyTree copies the file or directory src to dst, keeping symbolic links
// inside directories as links and following src itself when it is one, as
// COPY does.
func copyTree(src, dst string) error {
	fi, err := os.Stat(src)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return copyFile(src, dst, fi.Mode())
	}
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		target := filepath.Join(dst, rel)
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			link, err := os.Readlink(p)
			if err != nil {
				return err
			}
			os.Remove(target)
			return os.Symlink(link, target)
		case d.IsDir():
			return os.MkdirAll(target, 0o755)
		case d.Type().IsRegular():
			info, err := d.Info()
			if err != nil {
				return err
			}
			return copyFile(p, target, info.Mode())
		}
		return nil
	})
}

func copyFile(src, dst string, mode fs.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode.Perm())
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// resolveIn resolves the path p of an image whose root is the local
// directory root, following symbolic links inside that root (an absolute
// link target is relative to root, not to the local /).
func resolveIn(root, p string) (string, error) {
	cur := "/"
	parts := strings.Split(strings.Trim(path.Clean(p), "/"), "/")
	for hops := 0; len(parts) > 0; {
		next := path.Join(cur, parts[0])
		parts = parts[1:]
		local := filepath.Join(root, filepath.FromSlash(next))
		fi, err := os.Lstat(local)
		if err != nil {
			return "", fmt.Errorf("%s: %w", next, err)
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			cur = next
			continue
		}
		if hops++; hops > 40 {
			return "", fmt.Errorf("%s: too many links", p)
		}
		link, err := os.Readlink(local)
		if err != nil {
			return "", err
		}
		if !path.IsAbs(link) {
			link = path.Join(cur, link)
		}
		parts = append(strings.Split(strings.Trim(path.Clean(link), "/"), "/"), parts...)
		cur = "/"
	}
	return filepath.Join(root, filepath.FromSlash(cur)), nil
}

// execForm parses an exec-form ENTRYPOINT or CMD (a JSON array).
func execForm(in instruction) ([]string, error) {
	var argv []string
	if err := json.Unmarshal([]byte(in.args), &argv); err != nil {
		return nil, fmt.Errorf("%s: not the exec form (a JSON array): %w", in, err)
	}
	return argv, nil
}

// ignoreRule is one line of .dockerignore.
type ignoreRule struct {
	pattern string
	re      *regexp.Regexp
	negate  bool
}

// parseDockerignore reads .dockerignore with Docker's rules: patterns are
// cleaned and made relative to the context, * and ? do not cross /, ** does,
// a leading ! re-includes; a path is excluded when the last rule matching it
// or one of its parent directories excludes.
func parseDockerignore(text string) ([]ignoreRule, error) {
	var rules []ignoreRule
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		r := ignoreRule{pattern: line}
		if p, ok := strings.CutPrefix(line, "!"); ok {
			r.negate, line = true, strings.TrimSpace(p)
		}
		line = path.Clean(line)
		if len(line) > 1 && line[0] == '/' {
			line = line[1:]
		}
		if strings.ContainsAny(line, "[]") {
			return nil, fmt.Errorf(".dockerignore: %q: character classes are not supported by the test's matcher", r.pattern)
		}
		var b strings.Builder
		b.WriteString("^")
		for i := 0; i < len(line); i++ {
			switch c := line[i]; {
			case c == '*' && i+1 < len(line) && line[i+1] == '*':
				i++
				if i+1 < len(line) && line[i+1] == '/' {
					i++
					b.WriteString("(.*/)?")
				} else {
					b.WriteString(".*")
				}
			case c == '*':
				b.WriteString("[^/]*")
			case c == '?':
				b.WriteString("[^/]")
			case c == '\\' && i+1 < len(line):
				i++
				b.WriteString(regexp.QuoteMeta(line[i : i+1]))
			default:
				b.WriteString(regexp.QuoteMeta(string(c)))
			}
		}
		b.WriteString("$")
		re, err := regexp.Compile(b.String())
		if err != nil {
			return nil, fmt.Errorf(".dockerignore: %q: %w", r.pattern, err)
		}
		r.re = re
		rules = append(rules, r)
	}
	return rules, nil
}

// ignored says whether the context path rel (slash-separated) is left out.
func ignored(rules []ignoreRule, rel string) bool {
	out := false
	for _, r := range rules {
		match := false
		parts := strings.Split(rel, "/")
		for i := range parts {
			if r.re.MatchString(strings.Join(parts[:i+1], "/")) {
				match = true
				break
			}
		}
		if match {
			out = !r.negate
		}
	}
	return out
}

// copyContext copies the repository at root to dst, leaving out what the
// rules exclude: the build context a container builder would send.
func copyContext(root, dst string, rules []ignoreRule) error {
	negations := false
	for _, r := range rules {
		negations = negations || r.negate
	}
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if os.IsNotExist(err) { // removed while we walk (others edit the tree)
				return nil
			}
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if rel == "." {
			return nil
		}
		if ignored(rules, filepath.ToSlash(rel)) {
			if d.IsDir() && !negations {
				return filepath.SkipDir
			}
			return nil
		}
		target := filepath.Join(dst, rel)
		switch {
		case d.IsDir():
			return os.MkdirAll(target, 0o755)
		case d.Type()&fs.ModeSymlink != 0:
			link, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(link, target)
		case d.Type().IsRegular():
			info, err := d.Info()
			if os.IsNotExist(err) {
				return nil
			}
			if err != nil {
				return err
			}
			if err := copyFile(p, target, info.Mode()); err != nil && !os.IsNotExist(err) {
				return err
			}
		}
		return nil
	})
}
