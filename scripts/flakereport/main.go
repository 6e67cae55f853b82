// Command flakereport reads the output of `go test -json`, one file per
// condition given as NAME=FILE, and prints one line per test that failed at
// least once: its failures and runs under each condition. It exits 1 if any
// test failed. scripts/flakes runs it; it is a Go program so that the hunt
// needs nothing beyond the Go toolchain.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path"
	"sort"
	"strings"
	"text/tabwriter"
)

type event struct {
	Action  string
	Package string
	Test    string
}

type tally struct{ failed, runs int }

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: flakereport NAME=FILE ...")
		os.Exit(2)
	}
	var conditions []string
	counts := map[string]map[string]*tally{} // test -> condition -> tally
	for _, arg := range os.Args[1:] {
		name, file, ok := strings.Cut(arg, "=")
		if !ok {
			fmt.Fprintf(os.Stderr, "flakereport: %q is not NAME=FILE\n", arg)
			os.Exit(2)
		}
		conditions = append(conditions, name)
		if err := read(file, name, counts); err != nil {
			fmt.Fprintln(os.Stderr, "flakereport:", err)
			os.Exit(2)
		}
	}

	var flaky []string
	for test, byCondition := range counts {
		for _, t := range byCondition {
			if t.failed > 0 {
				flaky = append(flaky, test)
				break
			}
		}
	}
	sort.Strings(flaky)
	if len(flaky) == 0 {
		fmt.Println("no test failed (" + strings.Join(conditions, ", ") + ")")
		return
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "test\t"+strings.Join(conditions, "\t"))
	for _, test := range flaky {
		line := test
		for _, c := range conditions {
			t := counts[test][c]
			if t == nil {
				t = &tally{}
			}
			line += fmt.Sprintf("\t%d/%d", t.failed, t.runs)
		}
		fmt.Fprintln(w, line)
	}
	w.Flush()
	os.Exit(1)
}

// read adds the passes and failures in file to counts under condition. A
// package that fails with no failing test (a build failure, a panic, a
// timeout) counts as a failure of the package itself.
func read(file, condition string, counts map[string]map[string]*tally) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	add := func(name string, failed bool) {
		if counts[name] == nil {
			counts[name] = map[string]*tally{}
		}
		t := counts[name][condition]
		if t == nil {
			t = &tally{}
			counts[name][condition] = t
		}
		t.runs++
		if failed {
			t.failed++
		}
	}
	testFailed := map[string]bool{}
	// Tests begun and not yet ended, by package: one still running when
	// its package binary fails hung there, or was cut by the timeout.
	running := map[string]map[string]bool{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e event
		if json.Unmarshal(sc.Bytes(), &e) != nil {
			continue
		}
		if e.Test != "" {
			switch e.Action {
			case "run":
				if running[e.Package] == nil {
					running[e.Package] = map[string]bool{}
				}
				running[e.Package][e.Test] = true
			case "pass", "fail", "skip":
				delete(running[e.Package], e.Test)
			}
		}
		if e.Action != "pass" && e.Action != "fail" {
			continue
		}
		failed := e.Action == "fail"
		if e.Test != "" {
			add(path.Base(e.Package)+"."+e.Test, failed)
			testFailed[e.Package] = testFailed[e.Package] || failed
			continue
		}
		for name := range running[e.Package] {
			add(path.Base(e.Package)+"."+name, true)
		}
		add(e.Package+" (package)", failed && (!testFailed[e.Package] || len(running[e.Package]) > 0))
		delete(testFailed, e.Package)
		delete(running, e.Package)
	}
	return sc.Err()
}
