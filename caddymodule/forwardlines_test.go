package caddymodule

import "testing"

func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// A request that gives up ahead of its turn lets the next one go only
// once every request before it is through.
func TestAForwardLinesNextGoesOnlyAfterEveryEarlierRequest(t *testing.T) {
	var f forwardLines
	first, firstThrough := f.join("s")
	if first != nil {
		t.Fatal("the first request of a line waits")
	}
	second, secondThrough := f.join("s")
	third, thirdThrough := f.join("s")
	secondThrough() // gives up while the first still waits
	if closed(third) {
		t.Fatal("the third request may go while the first is not through")
	}
	firstThrough()
	<-second
	<-third
	thirdThrough()
	thirdThrough() // more than once is fine
	if n := len(f.lines); n != 0 {
		t.Fatalf("%d lines left once every request is through, want none", n)
	}
	if other, _ := f.join("other"); other != nil {
		t.Fatal("a request of another session waits")
	}
}
