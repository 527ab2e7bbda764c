// Package deploy holds no code: its tests check the deployment files (the
// Dockerfile and .dockerignore at the repository root, docker-compose.yml,
// haproxy/haproxy.cfg, the Kubernetes manifests under kubernetes/, the
// systemd unit under systemd/ and the example configuration
// coordd.example.yaml), the release archives make dist builds and the
// docs (their links, and every shell example run as written:
// examples_test.go), so that the libraries they parse with stay out of
// coordd's binary.
package deploy
