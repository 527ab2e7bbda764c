package main

import "github.com/coordd/coordd/coordinator"

// protectionConfig holds an upstream's protection fields, inline in its
// YAML entry.
type protectionConfig struct{}

func (p protectionConfig) protection() (coordinator.Protection, error) {
	return coordinator.Protection{}, nil
}
