package trace

import (
	"bytes"
	"compress/gzip"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// fullStream is the whole stream, in the benchmark module's directory (not in
// the core module's zip).
const fullStream = "../../cmd/keybench/data/git-history.tsv.gz"

func TestSample(t *testing.T) {
	ev := Sample()
	require.Len(t, ev, 20_000)
	require.NoError(t, CheckChain(ev))
	s := Summarize(ev)
	require.Equal(t, 1794, s.Keys)
	require.Equal(t, "Makefile", s.Hottest)
	require.Equal(t, 607, s.HottestEvents)
	for i, e := range ev {
		require.Equal(t, int64(i), e.Seq)
	}
	require.Equal(t, Event{
		Seq: 0, UnixTime: 1112911993, Commit: "e83c5163316f89bfbde7d9ab23ca2e25604af290", Key: "Makefile",
		PrevBlob: ZeroID, NextBlob: "a6bba79ba1f46a1bbf7773449c3bd2bb9bf48e8b", Status: 'A',
	}, ev[0])
	// A path git quotes stays quoted, as in the file.
	require.Equal(t, `"gitweb/test/M\303\244rchen"`, ev[7083].Key)
	// Each call gives a fresh slice.
	ev[0].Key = "changed"
	require.Equal(t, "Makefile", Sample()[0].Key)
	require.Less(t, SampleSize, 1_200_000, "keep the embedded sample small")
}

func TestFullStream(t *testing.T) {
	if fullStreamUnderRace {
		t.Skip("under -race the full stream takes 25-50 s: .ci/run runs this test without -race")
	}
	if _, err := os.Stat(fullStream); err != nil {
		if _, inRepo := os.Stat("../../go.work"); inRepo == nil {
			t.Fatalf("the repository's stream is missing: %v", err)
		}
		t.Skipf("outside the repository (no go.work): the stream is in the cmd/keybench module: %v", err)
	}
	ev, err := LoadFile(fullStream)
	require.NoError(t, err)
	require.Len(t, ev, 96_875)
	require.NoError(t, CheckChain(ev))
	s := Summarize(ev)
	require.Equal(t, 7326, s.Keys)
	require.Equal(t, "Makefile", s.Hottest)
	require.Equal(t, 1498, s.HottestEvents)
	// The sample is its prefix.
	require.Equal(t, Sample(), ev[:20_000])
}

func TestLoadPlainAndGzip(t *testing.T) {
	want := Sample()[:500]
	var plain bytes.Buffer
	require.NoError(t, Write(&plain, want))
	require.True(t, strings.HasPrefix(plain.String(), Header+"\n"))

	got, err := Load(bytes.NewReader(plain.Bytes()))
	require.NoError(t, err)
	require.Equal(t, want, got)

	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, err = zw.Write(plain.Bytes())
	require.NoError(t, err)
	require.NoError(t, zw.Close())
	got, err = Load(&gz)
	require.NoError(t, err)
	require.Equal(t, want, got)

	// Files, CRLF line ends, blank lines, and no header all load.
	dir := t.TempDir()
	p := filepath.Join(dir, "s.tsv")
	crlf := strings.ReplaceAll(plain.String(), "\n", "\r\n") + "\r\n\r\n"
	require.NoError(t, os.WriteFile(p, []byte(crlf), 0o644))
	got, err = LoadFile(p)
	require.NoError(t, err)
	require.Equal(t, want, got)

	got, err = Load(strings.NewReader(""))
	require.NoError(t, err)
	require.Empty(t, got)

	// Events of one key share their key string (interning).
	require.Equal(t, "Makefile", got2(t, plain.Bytes())[0].Key)
}

func got2(t *testing.T, b []byte) []Event {
	ev, err := Load(bytes.NewReader(b))
	require.NoError(t, err)
	return ev
}

func TestLoadMissingFile(t *testing.T) {
	_, err := LoadFile(filepath.Join(t.TempDir(), "nope.tsv"))
	require.Error(t, err)
	require.ErrorIs(t, err, os.ErrNotExist)
	require.Contains(t, err.Error(), "nope.tsv")
}

func TestLoadMalformed(t *testing.T) {
	const (
		a = "e83c5163316f89bfbde7d9ab23ca2e25604af290"
		b = "a6bba79ba1f46a1bbf7773449c3bd2bb9bf48e8b"
		z = "0000000000000000000000000000000000000000"
	)
	good := "0\t1\t" + a + "\tMakefile\t" + z + "\t" + b + "\tA\n"
	cases := []struct {
		name, bad, msg string
	}{
		{"too few fields", "1\t2\t" + a + "\tk\t" + z + "\t" + b + "\n", "want 7 tab-separated fields"},
		{"too many fields", "1\t2\t" + a + "\tk\t" + z + "\t" + b + "\tM\textra\n", "got 8"},
		{"spaces not tabs", "1 2 " + a + " k " + z + " " + b + " M\n", "got 1"},
		{"bad seq", "x\t2\t" + a + "\tk\t" + z + "\t" + b + "\tM\n", `seq "x"`},
		{"negative seq", "-1\t2\t" + a + "\tk\t" + z + "\t" + b + "\tM\n", `seq "-1"`},
		{"bad time", "1\tnoon\t" + a + "\tk\t" + z + "\t" + b + "\tM\n", `unix_time "noon"`},
		{"short commit", "1\t2\tabc\tk\t" + z + "\t" + b + "\tM\n", `commit "abc"`},
		{"empty key", "1\t2\t" + a + "\t\t" + z + "\t" + b + "\tM\n", "empty key"},
		{"bad prev", "1\t2\t" + a + "\tk\tXYZ\t" + b + "\tM\n", `prev_blob "XYZ"`},
		{"upper-case next", "1\t2\t" + a + "\tk\t" + z + "\t" + strings.ToUpper(b) + "\tM\n", "next_blob"},
		{"bad status", "1\t2\t" + a + "\tk\t" + z + "\t" + b + "\tR100\n", `status "R100"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			in := Header + "\n" + good + "\n" + c.bad + good
			_, err := Load(strings.NewReader(in))
			require.Error(t, err)
			var pe *ParseError
			require.True(t, errors.As(err, &pe), "error %v is not a *ParseError", err)
			require.Equal(t, 4, pe.Line, "the header, a good line and a blank line come first")
			require.Contains(t, err.Error(), "line 4: ")
			require.Contains(t, err.Error(), c.msg)
		})
	}

	// Through a file, the path is named too.
	p := filepath.Join(t.TempDir(), "bad.tsv.gz")
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte(good + "oops\n"))
	zw.Close()
	require.NoError(t, os.WriteFile(p, gz.Bytes(), 0o644))
	_, err := LoadFile(p)
	require.ErrorContains(t, err, "bad.tsv.gz: trace: line 2: want 7 tab-separated fields")

	// A truncated gzip stream is an error, not a short stream.
	_, err = Load(bytes.NewReader(gz.Bytes()[:gz.Len()-10]))
	require.Error(t, err)
}

func TestSyntheticChain(t *testing.T) {
	ev, err := Synthetic(50_000, 1000, 1.1, 7)
	require.NoError(t, err)
	require.Len(t, ev, 50_000)
	require.NoError(t, CheckChain(ev))
	_, broken := Replay(ev)
	require.Zero(t, broken)

	s := Summarize(ev)
	require.Equal(t, "key-0", s.Hottest, "rank 0 is the hottest key")
	require.LessOrEqual(t, s.Keys, 1000)
	// Zipf(1.1) over 1000 keys: key-0 draws about 1/H = 15% of events.
	require.InDelta(t, 0.15, float64(s.HottestEvents)/50_000, 0.03)

	var adds, dels, mods int
	for i, e := range ev {
		require.Equal(t, int64(i), e.Seq)
		switch e.Status {
		case 'A':
			adds++
			require.True(t, IsZero(e.PrevBlob))
		case 'D':
			dels++
			require.True(t, IsZero(e.NextBlob))
		case 'M':
			mods++
		default:
			t.Fatalf("status %c", e.Status)
		}
	}
	require.Positive(t, dels, "deletes exercise the all-zeros state")
	require.Greater(t, adds, s.Keys, "deleted keys come back")
	require.Greater(t, mods, dels)

	// Deterministic in its seed, and the stream round-trips through the TSV format.
	again, err := Synthetic(50_000, 1000, 1.1, 7)
	require.NoError(t, err)
	require.Equal(t, ev, again)
	other, err := Synthetic(50_000, 1000, 1.1, 8)
	require.NoError(t, err)
	require.NotEqual(t, ev, other)
	var buf bytes.Buffer
	require.NoError(t, Write(&buf, ev[:1000]))
	require.Equal(t, ev[:1000], got2(t, buf.Bytes()))
}

func TestSyntheticUniformAndErrors(t *testing.T) {
	ev, err := Synthetic(20_000, 10, 0, 1)
	require.NoError(t, err)
	s := Summarize(ev)
	require.Equal(t, 10, s.Keys)
	require.InDelta(t, 2000, s.HottestEvents, 200, "exponent 0 is uniform")

	ev, err = Synthetic(0, 1, 1, 1)
	require.NoError(t, err)
	require.Empty(t, ev)

	for _, bad := range []struct {
		n, keys int
		s       float64
	}{{-1, 1, 1}, {1, 0, 1}, {1, 1, -0.5}} {
		_, err := Synthetic(bad.n, bad.keys, bad.s, 1)
		require.Error(t, err, "%+v", bad)
	}
}

func TestRounds(t *testing.T) {
	base := Sample()[:3000]
	r := Rounds(base, 3)
	require.Len(t, r, 9000)
	require.NoError(t, CheckChain(r))
	require.Equal(t, "0/Makefile", r[0].Key)
	require.Equal(t, "2/Makefile", r[6000].Key)
	for i, e := range r {
		require.Equal(t, int64(i), e.Seq)
		require.Equal(t, base[i%3000].NextBlob, e.NextBlob)
	}
	final, broken := Replay(r)
	require.Zero(t, broken)
	require.Len(t, final, 3*Summarize(base).Keys)

	one := Rounds(base, 1)
	require.Equal(t, base, one)
	one[0].Key = "x"
	require.Equal(t, "Makefile", base[0].Key, "Rounds copies")

	require.Len(t, Limit(base, 10), 10)
	require.Len(t, Limit(base, 0), 3000)
	require.Len(t, Limit(base, 5000), 3000)
}

func TestReplayDetectsReordering(t *testing.T) {
	ev := Sample()[:2000]
	final, broken := Replay(ev)
	require.Zero(t, broken)
	// Swap two events of Makefile: both preconditions break, and the final
	// state differs when the later one was the key's last.
	var idx []int
	for i, e := range ev {
		if e.Key == "Makefile" {
			idx = append(idx, i)
		}
	}
	require.GreaterOrEqual(t, len(idx), 2)
	i, j := idx[len(idx)-2], idx[len(idx)-1]
	ev[i], ev[j] = ev[j], ev[i]
	final2, broken := Replay(ev)
	require.Equal(t, 2, broken)
	require.NotEqual(t, final["Makefile"], final2["Makefile"])
	require.Error(t, CheckChain(ev))
}

func TestKeyIDs(t *testing.T) {
	ev := Sample()[:1000]
	ids, keys := KeyIDs(ev)
	require.Len(t, ids, 1000)
	require.Len(t, keys, Summarize(ev).Keys)
	for i, e := range ev {
		require.Equal(t, e.Key, keys[ids[i]])
	}
	require.Equal(t, int32(0), ids[0])
}

func TestHolds(t *testing.T) {
	require.True(t, Holds("", ZeroID))
	require.False(t, Holds("", "ab"))
	require.True(t, Holds("ab", "ab"))
	require.False(t, Holds("ab", ZeroID))
	require.True(t, IsZero(strings.Repeat("0", 64)))
	require.False(t, IsZero(""))
}

func TestParseGitLog(t *testing.T) {
	const (
		c1 = "1111111111111111111111111111111111111111"
		c2 = "2222222222222222222222222222222222222222"
		b1 = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
		b2 = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
		z  = "0000000000000000000000000000000000000000"
	)
	log := "C " + c1 + " 100\n\n" +
		":000000 100644 " + z + " " + b1 + " A\ta file.txt\n" +
		":000000 100644 " + z + " " + b2 + " A\t\"q\\303\\244\"\n" +
		"C " + c2 + " 200\n\n" +
		":100644 100644 " + b1 + " " + b2 + " M\ta file.txt\n" +
		":100644 000000 " + b2 + " " + z + " D\t\"q\\303\\244\"\n"
	ev, err := ParseGitLog(strings.NewReader(log))
	require.NoError(t, err)
	require.Equal(t, []Event{
		{0, 100, c1, "a file.txt", z, b1, 'A'},
		{1, 100, c1, `"q\303\244"`, z, b2, 'A'},
		{2, 200, c2, "a file.txt", b1, b2, 'M'},
		{3, 200, c2, `"q\303\244"`, b2, z, 'D'},
	}, ev)
	require.NoError(t, CheckChain(ev))

	for _, bad := range []struct{ in, msg string }{
		{":100644 100644 " + b1 + " " + b2 + " M\tf\n", "line 1: a file line before the first commit line"},
		{"C " + c1 + " 1\n:100644 100644 " + b1 + " " + b2 + " R100\tf\n", "line 2: raw line"},
		{"C " + c1 + " 1\n:100644 100644 " + b1 + " " + b2 + " M f\n", "no tab"},
		{"C " + c1 + "\n", "line 1: commit line"},
		{"C " + c1 + " 1\ncommit " + c2 + "\n", `line 2: unexpected line "commit`},
	} {
		_, err := ParseGitLog(strings.NewReader(bad.in))
		require.ErrorContains(t, err, bad.msg)
	}
}

func TestFromGit(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git not installed")
	}
	dir := t.TempDir()
	git := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("git", append([]string{"-C", dir}, args...)...)
		cmd.Env = append(os.Environ(),
			"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=t",
			"GIT_COMMITTER_EMAIL=t@example.com", "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "git %v: %s", args, out)
		return strings.TrimSpace(string(out))
	}
	write := func(name, body string) {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644))
	}
	git("init", "-q", "-b", "main")
	write("a.txt", "1")
	write("b.txt", "1")
	git("add", ".")
	git("commit", "-q", "-m", "one")
	write("a.txt", "2")
	git("commit", "-q", "-am", "two")
	// A side branch merged back: first-parent history sees the merge as one
	// commit that changes what the branch changed.
	git("checkout", "-q", "-b", "side")
	write("c.txt", "side")
	git("add", "c.txt")
	git("commit", "-q", "-m", "side")
	git("checkout", "-q", "main")
	git("rm", "-q", "b.txt")
	git("commit", "-q", "-m", "three")
	git("merge", "-q", "--no-ff", "-m", "merge", "side")

	ev, err := FromGit(dir)
	require.NoError(t, err)
	require.NoError(t, CheckChain(ev))
	var got []string
	for _, e := range ev {
		got = append(got, string(e.Status)+" "+e.Key)
	}
	require.Equal(t, []string{"A a.txt", "A b.txt", "M a.txt", "D b.txt", "A c.txt"}, got)
	head := git("rev-parse", "HEAD")
	require.Equal(t, head, ev[len(ev)-1].Commit)
	require.Equal(t, git("rev-parse", "HEAD:a.txt"), ev[2].NextBlob)

	// Not a repository: git's own message, not a parse error.
	_, err = FromGit(t.TempDir())
	require.ErrorContains(t, err, "git log in")
	require.ErrorContains(t, err, "not a git repository")
}
