package docs

import (
	"bufio"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// linkRE matches an inline Markdown link or image: [text](target).
var linkRE = regexp.MustCompile(`\[[^\]]*\]\(([^)\s]+)\)`)

// TestRelativeLinks: every relative link in the repository's Markdown files
// (outside fenced code blocks) points at a file or folder that exists, and
// a "#anchor" on a Markdown file (or alone, within the file) names one of
// its headings as GitHub renders them.
func TestRelativeLinks(t *testing.T) {
	root := ".."
	var files []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && p != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "bin" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(p, ".md") {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 10 {
		t.Fatalf("found only %d Markdown files under %s: %v", len(files), root, files)
	}
	anchors := map[string]map[string]bool{}
	for _, f := range files {
		links, err := mdLinks(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range links {
			if strings.Contains(l.target, "://") || strings.HasPrefix(l.target, "mailto:") {
				continue
			}
			path, anchor, _ := strings.Cut(l.target, "#")
			target := f
			if path != "" {
				target = filepath.Join(filepath.Dir(f), path)
				if _, err := os.Stat(target); err != nil {
					t.Errorf("%s:%d: link to %s: no such file or folder", f, l.line, l.target)
					continue
				}
			}
			if anchor == "" || !strings.HasSuffix(target, ".md") {
				continue
			}
			if anchors[target] == nil {
				if anchors[target], err = mdAnchors(target); err != nil {
					t.Fatal(err)
				}
			}
			if !anchors[target][anchor] {
				t.Errorf("%s:%d: link to %s: %s has no heading with anchor #%s", f, l.line, l.target, target, anchor)
			}
		}
	}
}

type mdLink struct {
	target string
	line   int
}

// mdLinks returns the inline links of a Markdown file outside fenced
// code blocks and code spans.
func mdLinks(path string) ([]mdLink, error) {
	var out []mdLink
	err := eachProseLine(path, func(n int, line string) {
		for _, m := range linkRE.FindAllStringSubmatch(stripCodeSpans(line), -1) {
			out = append(out, mdLink{target: m[1], line: n})
		}
	})
	return out, err
}

// mdAnchors returns the anchors GitHub gives a file's headings: lower
// case, punctuation dropped, spaces as hyphens, "-1", "-2" … on repeats.
func mdAnchors(path string) (map[string]bool, error) {
	out := map[string]bool{}
	err := eachProseLine(path, func(_ int, line string) {
		if !strings.HasPrefix(line, "#") {
			return
		}
		h := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(h) {
			switch {
			case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
				b.WriteRune(r)
			case r == ' ':
				b.WriteByte('-')
			}
		}
		a := b.String()
		for i, base := 1, a; out[a]; i++ {
			a = base + "-" + itoa(i)
		}
		out[a] = true
	})
	return out, err
}

// eachProseLine calls fn with each line (1-based number) of a Markdown
// file that is not inside a fenced code block.
func eachProseLine(path string, fn func(n int, line string)) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	fence := ""
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
			}
			continue
		}
		if strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
			fence = trimmed[:3]
			continue
		}
		fn(n, line)
	}
	return sc.Err()
}

// stripCodeSpans blanks `code spans`, whose brackets are not links.
func stripCodeSpans(line string) string {
	parts := strings.Split(line, "`")
	for i := 1; i < len(parts); i += 2 {
		if i < len(parts)-1 {
			parts[i] = ""
		}
	}
	return strings.Join(parts, "`")
}

func itoa(i int) string { return strconv.Itoa(i) }
