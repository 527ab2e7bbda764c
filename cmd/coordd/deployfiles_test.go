package main

import (
	"context"
	"os"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// TestDeployFilesConfig runs --check-config on the coordd configurations
// of the deployment files: the Kubernetes ConfigMap's file with the
// Deployment's arguments (the Secret's placeholder as the Redis URL), each
// coordd service's command in docker-compose.yml, and the example
// configuration that make dist ships (deploy/coordd.example.yaml, as
// deploy/systemd/coordd.service starts it). deploy/ checks the rest of
// those files, and TestDist the example with the release's binary.
func TestDeployFilesConfig(t *testing.T) {
	decode := func(path string, v any) {
		t.Helper()
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(b, v); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
	}
	var cm struct {
		Data map[string]string `yaml:"data"`
	}
	decode("../../deploy/kubernetes/configmap.yaml", &cm)
	var secret struct {
		StringData map[string]string `yaml:"stringData"`
	}
	decode("../../deploy/kubernetes/secret.yaml", &secret)
	var dep struct {
		Spec struct {
			Template struct {
				Spec struct {
					Containers []struct {
						Args []string `yaml:"args"`
					} `yaml:"containers"`
				} `yaml:"spec"`
			} `yaml:"template"`
		} `yaml:"spec"`
	}
	decode("../../deploy/kubernetes/deployment.yaml", &dep)
	var compose struct {
		Services map[string]struct {
			Build struct {
				Target string `yaml:"target"`
			} `yaml:"build"`
			Command []string `yaml:"command"`
		} `yaml:"services"`
	}
	decode("../../docker-compose.yml", &compose)

	dir := t.TempDir()
	tests := map[string][]string{}
	if cs := dep.Spec.Template.Spec.Containers; len(cs) == 1 {
		var args []string
		for _, a := range cs[0].Args {
			if key, ok := strings.CutPrefix(a, "--config=/etc/coordd/"); ok {
				path := dir + "/" + key
				if err := os.WriteFile(path, []byte(cm.Data[key]), 0o600); err != nil {
					t.Fatal(err)
				}
				a = "--config=" + path
			}
			args = append(args, strings.ReplaceAll(a, "$(REDIS_URL)", secret.StringData["redis-url"]))
		}
		tests["kubernetes"] = args
	}
	for name, s := range compose.Services {
		if s.Build.Target == "coordd" {
			tests["compose "+name] = s.Command
		}
	}
	tests["example"] = []string{"--config", "../../deploy/coordd.example.yaml"}
	if len(tests) != 5 {
		t.Fatalf("found %d coordd configurations; want the Deployment's, 3 in docker-compose.yml and the example", len(tests))
	}
	for name, args := range tests {
		t.Run(name, func(t *testing.T) {
			if err := run(context.Background(), append(args, "--check-config"), os.Stderr); err != nil {
				t.Fatalf("coordd %s --check-config: %v", strings.Join(args, " "), err)
			}
		})
	}
}
