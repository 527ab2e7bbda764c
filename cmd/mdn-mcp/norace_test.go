//go:build !race

package main

// raceEnabled tells TestMain to build mdn-mcp with -race too.
const raceEnabled = false
