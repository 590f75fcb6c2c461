// Command checkversions checks the workspace's modules against the release
// procedure of docs/releasing.md:
//
//   - the release version is the first "## vX.Y.Z" heading of CHANGELOG.md;
//   - every module of go.work that requires another module of go.work
//     requires it at exactly that version, and replaces it with the
//     directory that holds it (for work inside the repository; a replace in
//     a dependency is ignored by the go command, so users get the tagged
//     versions);
//   - every module's path is the core's path followed by its directory, so
//     that its path-prefixed tag (kafka/v0.1.0) names it.
//
// With -tags it prints the tags of the release in the order they must be
// pushed: a module after every module it requires.
//
// Run from the repository root: go run ./.ci/checkversions [-tags]
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

type goMod struct {
	Module  struct{ Path string }
	Require []struct {
		Path     string
		Version  string
		Indirect bool
	}
	Replace []struct {
		Old struct{ Path, Version string }
		New struct{ Path, Version string }
	}
}

type goWork struct {
	Use []struct{ DiskPath string }
}

var heading = regexp.MustCompile(`^## \[?(v[0-9]+\.[0-9]+\.[0-9]+(?:-[0-9A-Za-z.-]+)?)\]?(?:\s|$)`)

func main() {
	tags := flag.Bool("tags", false, "print the release's tags in push order")
	flag.Parse()
	if err := run(*tags); err != nil {
		fmt.Fprintln(os.Stderr, "checkversions:", err)
		os.Exit(1)
	}
}

// releaseVersion is the first "## vX.Y.Z" heading of the changelog.
func releaseVersion(changelog string) (string, error) {
	f, err := os.Open(changelog)
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if m := heading.FindStringSubmatch(sc.Text()); m != nil {
			return m[1], nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", fmt.Errorf("%s has no \"## vX.Y.Z\" heading", changelog)
}

func editJSON(v any, args ...string) error {
	out, err := exec.Command("go", args...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return fmt.Errorf("go %s: %v: %s", strings.Join(args, " "), err, ee.Stderr)
		}
		return fmt.Errorf("go %s: %w", strings.Join(args, " "), err)
	}
	return json.Unmarshal(out, v)
}

func run(printTags bool) error {
	version, err := releaseVersion("CHANGELOG.md")
	if err != nil {
		return err
	}
	var work goWork
	if err := editJSON(&work, "work", "edit", "-json"); err != nil {
		return err
	}
	dirOf := map[string]string{} // module path -> clean directory ("." for the root)
	mods := map[string]goMod{}
	var root string
	for _, u := range work.Use {
		dir := filepath.Clean(u.DiskPath)
		var m goMod
		if err := editJSON(&m, "mod", "edit", "-json", filepath.Join(dir, "go.mod")); err != nil {
			return err
		}
		dirOf[m.Module.Path] = dir
		mods[m.Module.Path] = m
		if dir == "." {
			root = m.Module.Path
		}
	}
	if root == "" {
		return errors.New("go.work does not use the repository root")
	}

	var problems []string
	deps := map[string][]string{}
	for path, m := range mods {
		dir := dirOf[path]
		if dir != "." && path != root+"/"+filepath.ToSlash(dir) {
			problems = append(problems, fmt.Sprintf("%s: module path %s is not %s/%s: its tag %s/%s would not name it", dir, path, root, filepath.ToSlash(dir), filepath.ToSlash(dir), version))
		}
		for _, r := range m.Require {
			depDir, ours := dirOf[r.Path]
			if !ours {
				continue
			}
			deps[path] = append(deps[path], r.Path)
			if r.Version != version {
				problems = append(problems, fmt.Sprintf("%s/go.mod requires %s %s, the release is %s (CHANGELOG.md)", dir, r.Path, r.Version, version))
			}
			replaced := false
			for _, rep := range m.Replace {
				if rep.Old.Path != r.Path {
					continue
				}
				replaced = true
				want := depDir
				got := filepath.Clean(filepath.Join(dir, rep.New.Path))
				if rep.Old.Version != "" || rep.New.Version != "" || got != want {
					problems = append(problems, fmt.Sprintf("%s/go.mod: replace %s should be => %s (the directory that holds it)", dir, r.Path, relTo(dir, want)))
				}
			}
			if !replaced {
				problems = append(problems, fmt.Sprintf("%s/go.mod requires %s without a replace => %s: GOWORK=off builds would fetch it", dir, r.Path, relTo(dir, depDir)))
			}
		}
	}
	sort.Strings(problems)
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "\n  "))
	}
	if printTags {
		order, err := topo(mods, deps)
		if err != nil {
			return err
		}
		for _, path := range order {
			if path == root {
				fmt.Println(version)
			} else {
				fmt.Println(filepath.ToSlash(dirOf[path]) + "/" + version)
			}
		}
	}
	return nil
}

func relTo(from, to string) string {
	r, err := filepath.Rel(from, to)
	if err != nil {
		return to
	}
	return filepath.ToSlash(r)
}

// topo orders the modules so that each comes after every module it requires;
// ties by path, for a stable list.
func topo(mods map[string]goMod, deps map[string][]string) ([]string, error) {
	var paths []string
	for p := range mods {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	state := map[string]int{} // 0 new, 1 visiting, 2 done
	var order []string
	var visit func(string) error
	visit = func(p string) error {
		switch state[p] {
		case 1:
			return fmt.Errorf("modules require each other in a cycle through %s", p)
		case 2:
			return nil
		}
		state[p] = 1
		ds := append([]string(nil), deps[p]...)
		sort.Strings(ds)
		for _, d := range ds {
			if err := visit(d); err != nil {
				return err
			}
		}
		state[p] = 2
		order = append(order, p)
		return nil
	}
	for _, p := range paths {
		if err := visit(p); err != nil {
			return nil, err
		}
	}
	return order, nil
}
