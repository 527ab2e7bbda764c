package server

// growStack grows the calling goroutine's stack, while the stack is still
// shallow, to the 8 KiB a GetOrFetch call's goroutine reaches anyway.
// grpc-go runs each stream on a new goroutine, whose stack starts at 2 KiB
// and is grown to 4 KiB before the first interceptor runs; the handler
// then outgrew it deep below the interceptor chain (in grpc.recv), and
// growing copies the stack and adjusts every frame on it. Grown here,
// where few frames are on it, the copy is cheap: a warm hit's stack
// copying halves, and the stack's size is unchanged (docs/performance.md,
// BenchmarkWarmHitFloor). With what the stack holds here, a 4 KiB frame
// needs the 8 KiB stack; a 6 KiB one would make every stream hold 16 KiB.
//
//go:noinline
func growStack(i int) byte {
	var frame [4 << 10]byte
	frame[i] = 1 // an index the compiler cannot see through keeps the array
	return frame[i/2]
}
