// Package deploy holds no code: its tests check the deployment files (the
// Dockerfile and .dockerignore at the repository root, docker-compose.yml,
// haproxy/haproxy.cfg and the Kubernetes manifests under kubernetes/), so
// that the libraries they parse with stay out of coordd's binary.
package deploy
