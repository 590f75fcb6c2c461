package trace

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"strings"
)

// gitLogArgs is the command of cmd/keybench/data/README.md, with the settings that
// could change its output pinned: paths quoted as git does by default, no
// colour, no signature lines.
var gitLogArgs = []string{
	"-c", "core.quotePath=true", "-c", "log.showSignature=false",
	"log", "--first-parent", "--diff-merges=first-parent", "--raw", "--no-renames",
	"--no-abbrev", "--reverse", "--no-color", "--format=C %H %at", "HEAD",
}

// FromGit builds a stream from the first-parent history of the git
// repository at dir (its work tree or .git directory), oldest commit first:
// one event per file a commit changes against its first parent, the way
// cmd/keybench/data/git-history.tsv.gz was made. It runs
//
//	git log --first-parent --diff-merges=first-parent --raw --no-renames \
//	        --no-abbrev --reverse --format='C %H %at' HEAD
//
// and needs git 2.31 or later on the PATH. The precondition chain holds by
// construction: each commit is diffed against the previous one.
func FromGit(dir string) ([]Event, error) {
	return FromGitContext(context.Background(), dir)
}

// FromGitContext is FromGit, killing git when ctx ends.
func FromGitContext(ctx context.Context, dir string) ([]Event, error) {
	cmd := exec.CommandContext(ctx, "git", append([]string{"-C", dir}, gitLogArgs...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("trace: git: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("trace: running git: %w", err)
	}
	events, perr := ParseGitLog(out)
	if perr != nil {
		_, _ = io.Copy(io.Discard, out) // let git finish writing
	}
	werr := cmd.Wait()
	if werr != nil {
		msg := strings.TrimSpace(stderr.String())
		if msg == "" {
			msg = werr.Error()
		}
		return nil, fmt.Errorf("trace: git log in %s failed: %s", dir, msg)
	}
	if perr != nil {
		return nil, fmt.Errorf("trace: git log in %s: %w", dir, perr)
	}
	return events, nil
}

// ParseGitLog parses the output of FromGit's git log command: a line
// "C <commit> <unix time>" per commit, then one line per changed file,
// ":<old mode> <new mode> <old blob> <new blob> <status>\t<path>". Blank lines
// are skipped; anything else is a *ParseError.
func ParseGitLog(r io.Reader) ([]Event, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var (
		events []Event
		in     interner
		commit string
		when   int64
		line   int
	)
	for sc.Scan() {
		line++
		b := sc.Bytes()
		switch {
		case len(b) == 0:
		case b[0] == 'C' && len(b) > 2 && b[1] == ' ':
			f := strings.Fields(string(b[2:]))
			if len(f) != 2 || !isHexID([]byte(f[0])) {
				return nil, &ParseError{line, fmt.Sprintf("commit line %q: want \"C <commit id> <unix time>\"", b)}
			}
			t, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				return nil, &ParseError{line, fmt.Sprintf("commit line %q: bad time", b)}
			}
			commit, when = in.get([]byte(f[0])), t
		case b[0] == ':':
			if commit == "" {
				return nil, &ParseError{line, "a file line before the first commit line"}
			}
			tab := bytes.IndexByte(b, '\t')
			if tab < 0 {
				return nil, &ParseError{line, fmt.Sprintf("raw line %q has no tab before the path", b)}
			}
			f := strings.Fields(string(b[1:tab]))
			path := b[tab+1:]
			if len(f) != 5 || !isHexID([]byte(f[2])) || !isHexID([]byte(f[3])) || len(f[4]) == 0 || len(path) == 0 {
				return nil, &ParseError{line, fmt.Sprintf("raw line %q: want \":<mode> <mode> <blob> <blob> <status>\\t<path>\"", b)}
			}
			if bytes.IndexByte(path, '\t') >= 0 {
				// git quotes a path with a tab; a raw one cannot be a key of
				// the TSV stream, which has no escapes.
				return nil, &ParseError{line, fmt.Sprintf("raw line %q: a tab in the path (git quotes such paths: is core.quotePath off?)", b)}
			}
			if st := f[4][0]; len(f[4]) != 1 || !validStatus(st) {
				return nil, &ParseError{line, fmt.Sprintf("raw line %q: status %q is not one of A, M, D, T (renames must be off)", b, f[4])}
			}
			events = append(events, Event{
				Seq:      int64(len(events)),
				UnixTime: when,
				Commit:   commit,
				Key:      in.get(path),
				PrevBlob: in.get([]byte(f[2])),
				NextBlob: in.get([]byte(f[3])),
				Status:   f[4][0],
			})
		default:
			return nil, &ParseError{line, fmt.Sprintf("unexpected line %q", b)}
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, &ParseError{line + 1, "line longer than 1 MiB"}
		}
		return nil, err
	}
	return events, nil
}
