package serializer

// strongestWrite is the one write that does to a record all that the
// queued writes ops would do, in their order: the latest of them in
// storeOp's order. Opened clears the in-flight mark as InitializeEnded
// does, and writes never recreate a forgotten record, so a Forget leaves
// nothing for the others to do, before or after it.
func strongestWrite(ops []storeOp) storeOp {
	strongest := ops[0]
	for _, op := range ops[1:] {
		strongest = max(strongest, op)
	}
	return strongest
}
