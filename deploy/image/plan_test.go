package image

import (
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
)

// step is one command of the build stage, run after the context was copied.
type step struct {
	from instruction
	cmd  command
	cwd  string            // in the stage
	env  map[string]string // the stage's ARGs and ENVs at that point
}

// finalCopy is a COPY --from=<build stage> of the final stage.
type finalCopy struct {
	from instruction
	srcs []string // in the build stage, absolute
	dst  string   // in the image, absolute; a trailing / kept
}

// plan is what the Dockerfile does, read but not done.
type plan struct {
	df           *dockerfile
	build, final *stage

	// Build stage.
	modCopy      int // index in build.instrs of COPY go.mod go.sum, -1 if none
	modDownload  int // of RUN go mod download, -1 if none
	contextCopy  int // of COPY . <dir>, -1 if none
	ctxMount     string
	steps        []step
	goBuild      *step // the go build step
	goBuildCount int

	// Final stage.
	copies     []finalCopy
	labels     map[string]string
	user       string
	entrypoint []string
	cmd        []string
	finalArgs  map[string]string
}

// sdkDir is the plugin SDK's module, which go.mod replaces with this folder.
const sdkDir = "plugins/sdk"

// readPlan reads the Dockerfile's build and final stages, with args
// standing for --build-arg values.
func readPlan(df *dockerfile, args map[string]string) (*plan, error) {
	p := &plan{df: df, final: df.stages[len(df.stages)-1], modCopy: -1, modDownload: -1, contextCopy: -1,
		labels: map[string]string{}, finalArgs: map[string]string{}}
	if len(df.stages) < 2 {
		return nil, fmt.Errorf("Dockerfile: one stage; want a build stage and a final stage")
	}
	// The build stage is the one the final stage copies from.
	for _, in := range p.final.instrs {
		if in.cmd != "COPY" {
			continue
		}
		for _, w := range strings.Fields(in.args) {
			if from, ok := strings.CutPrefix(w, "--from="); ok {
				st := df.stageNamed(from)
				if st == nil {
					return nil, fmt.Errorf("%s: --from=%s is not a stage of this Dockerfile", in, from)
				}
				if p.build != nil && p.build != st {
					return nil, fmt.Errorf("%s: the final stage copies from two stages; the test knows one build stage", in)
				}
				p.build = st
			}
		}
	}
	if p.build == nil {
		return nil, fmt.Errorf("Dockerfile: the final stage copies nothing from a build stage")
	}
	if err := p.readBuild(args); err != nil {
		return nil, err
	}
	if err := p.readFinal(args); err != nil {
		return nil, err
	}
	return p, nil
}

// declareArg handles ARG in a stage: a --build-arg value, else the default,
// else the global ARG of that name.
func declareArg(in instruction, vars, global, args map[string]string) error {
	name, def, hasDef := strings.Cut(in.args, "=")
	name = strings.TrimSpace(name)
	if v, ok := args[name]; ok {
		vars[name] = v
		return nil
	}
	if hasDef {
		v, err := expandWord(def, lookupIn(vars))
		if err != nil {
			return fmt.Errorf("%s: %w", in, err)
		}
		vars[name] = v
		return nil
	}
	if v, ok := global[name]; ok {
		vars[name] = v
	}
	return nil
}

func copyArgs(in instruction, vars map[string]string) (flags map[string]string, srcs []string, dst string, err error) {
	if strings.HasPrefix(in.args, "[") {
		return nil, nil, "", fmt.Errorf("%s: the JSON form of COPY is not supported by the test's interpreter", in)
	}
	words, err := shellWords(in.args, lookupIn(vars))
	if err != nil {
		return nil, nil, "", fmt.Errorf("%s: %w", in, err)
	}
	flags = map[string]string{}
	for len(words) > 0 && strings.HasPrefix(words[0], "--") {
		k, v, _ := strings.Cut(strings.TrimPrefix(words[0], "--"), "=")
		flags[k] = v
		words = words[1:]
	}
	if len(words) < 2 {
		return nil, nil, "", fmt.Errorf("%s: want sources and a destination", in)
	}
	return flags, words[:len(words)-1], words[len(words)-1], nil
}

func (p *plan) readBuild(args map[string]string) error {
	vars := map[string]string{}
	wd := "/"
	for i, in := range p.build.instrs {
		switch in.cmd {
		case "ARG":
			if err := declareArg(in, vars, p.df.globalArgs, args); err != nil {
				return err
			}
		case "ENV":
			kv, err := keyValues(in, lookupIn(vars))
			if err != nil {
				return err
			}
			for _, e := range kv {
				vars[e[0]] = e[1]
			}
		case "WORKDIR":
			d, err := expandWord(in.args, lookupIn(vars))
			if err != nil {
				return fmt.Errorf("%s: %w", in, err)
			}
			wd = abs(wd, d)
		case "COPY":
			flags, srcs, dst, err := copyArgs(in, vars)
			if err != nil {
				return err
			}
			if _, ok := flags["from"]; ok {
				return fmt.Errorf("%s: COPY --from in the build stage is not supported by the test's interpreter", in)
			}
			switch {
			case len(srcs) == 1 && path.Clean(srcs[0]) == ".":
				if p.contextCopy >= 0 {
					return fmt.Errorf("%s: the context is copied twice", in)
				}
				p.contextCopy, p.ctxMount = i, abs(wd, dst)
			case p.contextCopy < 0:
				names := map[string]bool{}
				for _, s := range srcs {
					names[path.Clean(s)] = true
				}
				if len(names) == 2 && names["go.mod"] && names["go.sum"] && abs(wd, dst) == wd {
					p.modCopy = i
					continue
				}
				// The modules go.mod replaces with a folder of the repository
				// (the plugin SDK): their go.mod and go.sum, to the same folder.
				if len(names) == 2 && names[sdkDir+"/go.mod"] && names[sdkDir+"/go.sum"] && abs(wd, dst) == abs(wd, sdkDir) {
					continue
				}
				return fmt.Errorf("%s: before the context, the build stage copies only go.mod and go.sum to its WORKDIR (and %s's to %s)", in, sdkDir, sdkDir)
			default:
				return fmt.Errorf("%s: a COPY after the context's is not supported by the test's interpreter", in)
			}
		case "RUN":
			env := map[string]string{}
			for k, v := range vars {
				env[k] = v
			}
			cmds, err := runCommands(in, lookupIn(vars))
			if err != nil {
				return err
			}
			for _, c := range cmds {
				st := step{from: in, cmd: c, cwd: wd, env: env}
				isDownload := len(c.argv) >= 3 && c.argv[0] == "go" && c.argv[1] == "mod" && c.argv[2] == "download"
				switch {
				case p.contextCopy < 0 && isDownload:
					if p.modCopy < 0 {
						return fmt.Errorf("%s: go mod download before go.mod and go.sum are copied", in)
					}
					p.modDownload = i
				case p.contextCopy < 0:
					return fmt.Errorf("%s: %q before the context is copied: only go mod download is expected there", in, c)
				case isDownload:
					// harmless after the context; nothing to run (go build downloads)
				default:
					p.steps = append(p.steps, st)
					if len(c.argv) >= 2 && c.argv[0] == "go" && c.argv[1] == "build" {
						p.goBuildCount++
						p.goBuild = &p.steps[len(p.steps)-1]
					}
				}
			}
		case "LABEL", "USER", "EXPOSE", "SHELL", "STOPSIGNAL":
			// no effect on the files the final stage takes
		default:
			return fmt.Errorf("%s: not supported in the build stage by the test's interpreter", in)
		}
	}
	// p.goBuild points into p.steps, which may have grown since: find it again.
	for i := range p.steps {
		if c := p.steps[i].cmd.argv; len(c) >= 2 && c[0] == "go" && c[1] == "build" {
			p.goBuild = &p.steps[i]
		}
	}
	if p.contextCopy < 0 {
		return fmt.Errorf("Dockerfile: the build stage never copies the context (COPY . .)")
	}
	return nil
}

func (p *plan) readFinal(args map[string]string) error {
	vars := map[string]string{}
	wd := "/"
	for _, in := range p.final.instrs {
		switch in.cmd {
		case "ARG":
			if err := declareArg(in, vars, p.df.globalArgs, args); err != nil {
				return err
			}
		case "ENV":
			kv, err := keyValues(in, lookupIn(vars))
			if err != nil {
				return err
			}
			for _, e := range kv {
				vars[e[0]] = e[1]
			}
		case "LABEL":
			kv, err := keyValues(in, lookupIn(vars))
			if err != nil {
				return err
			}
			for _, e := range kv {
				p.labels[e[0]] = e[1]
			}
		case "WORKDIR":
			d, err := expandWord(in.args, lookupIn(vars))
			if err != nil {
				return fmt.Errorf("%s: %w", in, err)
			}
			wd = abs(wd, d)
		case "USER":
			u, err := expandWord(in.args, lookupIn(vars))
			if err != nil {
				return fmt.Errorf("%s: %w", in, err)
			}
			p.user = u
		case "ENTRYPOINT":
			argv, err := execForm(in)
			if err != nil {
				return err
			}
			p.entrypoint = argv
		case "CMD":
			argv, err := execForm(in)
			if err != nil {
				return err
			}
			p.cmd = argv
		case "COPY":
			flags, srcs, dst, err := copyArgs(in, vars)
			if err != nil {
				return err
			}
			if flags["from"] == "" {
				return fmt.Errorf("%s: the final stage copies from the build context; the test knows only COPY --from the build stage", in)
			}
			c := finalCopy{from: in, dst: abs(wd, dst)}
			if strings.HasSuffix(dst, "/") && c.dst != "/" {
				c.dst += "/"
			}
			for _, s := range srcs {
				c.srcs = append(c.srcs, abs("/", s))
			}
			p.copies = append(p.copies, c)
		case "EXPOSE", "STOPSIGNAL", "HEALTHCHECK":
		case "RUN":
			return fmt.Errorf("%s: RUN in the final stage: a distroless or scratch image has no shell", in)
		default:
			return fmt.Errorf("%s: not supported in the final stage by the test's interpreter", in)
		}
	}
	p.finalArgs = vars
	return nil
}

// environ is the environment of a step's command: the test's own, the
// stage's ARGs and ENVs, then the command's assignments.
func (s step) environ() []string {
	env := os.Environ()
	for k, v := range s.env {
		env = append(env, k+"="+v)
	}
	return append(env, s.cmd.env...)
}

// execute runs the build stage's steps with the context at ctx and the
// stage's other paths under root, then lays out the final stage's files
// under rootfs. logf receives each command run.
func (p *plan) execute(ctx, root, rootfs string, logf func(string, ...any)) error {
	m := stageFS{ctxMount: p.ctxMount, ctx: ctx, root: root}
	for _, s := range p.steps {
		argv := s.cmd.argv
		switch argv[0] {
		case "go":
			if argv[1] != "build" {
				return fmt.Errorf("%s: %q: the test runs only go build", s.from, s.cmd)
			}
			args := append([]string{}, argv[1:]...)
			for i := 0; i < len(args); i++ {
				switch {
				case args[i] == "-o" && i+1 < len(args):
					args[i+1] = m.local(abs(s.cwd, args[i+1]))
				case strings.HasPrefix(args[i], "-o="):
					args[i] = "-o=" + m.local(abs(s.cwd, strings.TrimPrefix(args[i], "-o=")))
				}
			}
			cmd := exec.Command("go", args...)
			cmd.Dir = m.local(s.cwd)
			cmd.Env = s.environ()
			logf("%s\n  run: %s %s (in %s; %s)", s.from, "go", strings.Join(args, " "), cmd.Dir, strings.Join(s.cmd.env, " "))
			if out, err := cmd.CombinedOutput(); err != nil {
				return fmt.Errorf("%s: %w\n%s", s.from, err, out)
			}
		case "mkdir":
			for _, a := range argv[1:] {
				if a == "-p" {
					continue
				}
				if err := os.MkdirAll(m.local(abs(s.cwd, a)), 0o755); err != nil {
					return fmt.Errorf("%s: %w", s.from, err)
				}
			}
		case "ln":
			symbolic, force := false, false
			var ops []string
			for _, a := range argv[1:] {
				if strings.HasPrefix(a, "-") {
					symbolic = symbolic || strings.Contains(a, "s")
					force = force || strings.Contains(a, "f")
					continue
				}
				ops = append(ops, a)
			}
			if len(ops) != 2 {
				return fmt.Errorf("%s: %q: want ln [-s] TARGET LINK", s.from, s.cmd)
			}
			link := m.local(abs(s.cwd, ops[1]))
			if force {
				os.Remove(link)
			}
			var err error
			if symbolic {
				err = os.Symlink(ops[0], link) // the target is kept as written: a path in the image
			} else {
				err = os.Link(m.local(abs(s.cwd, ops[0])), link)
			}
			if err != nil {
				return fmt.Errorf("%s: %w", s.from, err)
			}
		default:
			return fmt.Errorf("%s: %q: the test's interpreter knows go build, mkdir -p and ln; teach it this command", s.from, s.cmd)
		}
	}
	for _, c := range p.copies {
		for _, src := range c.srcs {
			local := m.local(src)
			fi, err := os.Stat(local)
			if err != nil {
				return fmt.Errorf("%s: %s: %w", c.from, src, err)
			}
			dst := filepath.Join(rootfs, filepath.FromSlash(c.dst))
			if !fi.IsDir() && (strings.HasSuffix(c.dst, "/") || len(c.srcs) > 1) {
				dst = filepath.Join(dst, path.Base(src))
			}
			if err := copyTree(local, dst); err != nil {
				return fmt.Errorf("%s: %w", c.from, err)
			}
		}
	}
	return nil
}
