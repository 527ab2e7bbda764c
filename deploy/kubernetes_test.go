package deploy

import (
	"bytes"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

// strictDecoder decodes manifests into the Kubernetes API types, refusing
// unknown and duplicate fields, as `kubectl apply --validate=strict` does.
func strictDecoder(t *testing.T) runtime.Decoder {
	t.Helper()
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, appsv1.AddToScheme, policyv1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	return serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer()
}

// manifests are the objects of deploy/kubernetes, by kind/name.
type manifests struct {
	deployment *appsv1.Deployment // coordd
	services   map[string]*corev1.Service
	configMap  *corev1.ConfigMap
	secret     *corev1.Secret
	pdb        *policyv1.PodDisruptionBudget // coordd's

	mcp    *appsv1.Deployment // the MCP server fleet, mdn-mcp
	mcpPDB *policyv1.PodDisruptionBudget
}

var docSep = regexp.MustCompile(`(?m)^---\s*$`)

// loadManifests decodes every YAML document of deploy/kubernetes (except
// kustomization.yaml) strictly, and returns the objects with the files
// that hold them.
func loadManifests(t *testing.T) (m manifests, files []string) {
	t.Helper()
	dec := strictDecoder(t)
	paths, err := filepath.Glob("kubernetes/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	m.services = map[string]*corev1.Service{}
	for _, path := range paths {
		if filepath.Base(path) == "kustomization.yaml" {
			continue
		}
		files = append(files, filepath.Base(path))
		for i, doc := range docSep.Split(readFile(t, path), -1) {
			if len(bytes.TrimSpace(stripComments([]byte(doc)))) == 0 {
				continue
			}
			obj, _, err := dec.Decode([]byte(doc), nil, nil)
			if err != nil {
				t.Fatalf("%s, document %d: %v", path, i+1, err)
			}
			switch o := obj.(type) {
			case *appsv1.Deployment:
				if o.Name == "mdn-mcp" {
					m.mcp = o
				} else {
					m.deployment = o
				}
			case *corev1.Service:
				m.services[o.Name] = o
			case *corev1.ConfigMap:
				m.configMap = o
			case *corev1.Secret:
				m.secret = o
			case *policyv1.PodDisruptionBudget:
				if o.Name == "mdn-mcp" {
					m.mcpPDB = o
				} else {
					m.pdb = o
				}
			default:
				t.Fatalf("%s: unexpected %T", path, obj)
			}
		}
	}
	if m.deployment == nil || m.configMap == nil || m.secret == nil || m.pdb == nil || m.mcp == nil || m.mcpPDB == nil || len(m.services) != 3 {
		t.Fatalf("manifests: deployment %v, configmap %v, secret %v, pdb %v, mdn-mcp deployment %v and pdb %v, %d services; want one of each and 3 services",
			m.deployment != nil, m.configMap != nil, m.secret != nil, m.pdb != nil, m.mcp != nil, m.mcpPDB != nil, len(m.services))
	}
	return m, files
}

func stripComments(b []byte) []byte {
	return regexp.MustCompile(`(?m)^\s*#.*$`).ReplaceAll(b, nil)
}

// TestKubernetesStrict: the decoder used below does refuse a misspelt field.
func TestKubernetesStrict(t *testing.T) {
	doc := strings.Replace(readFile(t, "kubernetes/deployment.yaml"), "readinessProbe:", "readinesProbe:", 1)
	if _, _, err := strictDecoder(t).Decode([]byte(doc), nil, nil); err == nil || !strings.Contains(err.Error(), "readinesProbe") {
		t.Fatalf("decoding a misspelt field: %v; want an error naming it", err)
	}
}

// coorddDurations are the coordd config fields the manifests must agree with.
type coorddDurations struct {
	Listen        string `json:"listen"`
	DrainDelay    string `json:"drain_delay"`
	ShutdownGrace string `json:"shutdown_grace"`
}

// TestKubernetesManifests checks how the manifests fit together: probes on
// the gRPC health service at the container's port, Services and the PDB
// selecting the pods, the config and the Redis URL reaching the container
// from the ConfigMap and the Secret, and a termination grace that outlasts
// the drain. cmd/coordd's tests check the ConfigMap's config with coordd's
// own loader.
func TestKubernetesManifests(t *testing.T) {
	m, files := loadManifests(t)
	d := m.deployment
	pod := d.Spec.Template
	sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	if err != nil || !sel.Matches(labels.Set(pod.Labels)) {
		t.Fatalf("deployment selector %v (%v) does not match its pods' labels %v", d.Spec.Selector, err, pod.Labels)
	}
	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("containers = %d; want 1", len(pod.Spec.Containers))
	}
	c := pod.Spec.Containers[0]
	var grpcPort int32
	for _, p := range c.Ports {
		if p.Name == "grpc" {
			grpcPort = p.ContainerPort
		}
	}
	if grpcPort == 0 {
		t.Fatal("no container port named grpc")
	}
	for name, probe := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
		if probe == nil || probe.GRPC == nil || probe.GRPC.Port != grpcPort || (probe.GRPC.Service != nil && *probe.GRPC.Service != "") {
			t.Errorf("%s probe %+v; want a grpc probe of service \"\" on port %d", name, probe, grpcPort)
		}
	}
	if sc := pod.Spec.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		t.Error("pod securityContext: want runAsNonRoot")
	}

	// The config file: --config names a file of the ConfigMap's volume.
	cfgPath, ok := flagValue(c.Args, "config")
	if !ok {
		t.Fatalf("args %q; want --config", c.Args)
	}
	var cfgText string
	for _, vm := range c.VolumeMounts {
		key, ok := strings.CutPrefix(cfgPath, strings.TrimSuffix(vm.MountPath, "/")+"/")
		if !ok {
			continue
		}
		for _, v := range pod.Spec.Volumes {
			if v.Name == vm.Name && v.ConfigMap != nil && v.ConfigMap.Name == m.configMap.Name {
				cfgText = m.configMap.Data[key]
			}
		}
	}
	if cfgText == "" {
		t.Fatalf("--config=%s is no key of ConfigMap %s mounted in the container", cfgPath, m.configMap.Name)
	}
	var cd coorddDurations
	if err := yaml.Unmarshal([]byte(cfgText), &cd); err != nil {
		t.Fatalf("ConfigMap's coordd config: %v", err)
	}
	if !strings.HasSuffix(cd.Listen, ":50051") || strings.HasPrefix(cd.Listen, "127.") || grpcPort != 50051 {
		t.Errorf("coordd listen %q, container port %d; want every interface on 50051", cd.Listen, grpcPort)
	}
	delay, err1 := time.ParseDuration(cd.DrainDelay)
	grace, err2 := time.ParseDuration(cd.ShutdownGrace)
	if err1 != nil || err2 != nil {
		t.Fatalf("drain_delay %q, shutdown_grace %q: want both set: %v %v", cd.DrainDelay, cd.ShutdownGrace, err1, err2)
	}
	tg := 30 * time.Second // Kubernetes' default
	if s := pod.Spec.TerminationGracePeriodSeconds; s != nil {
		tg = time.Duration(*s) * time.Second
	}
	if tg <= delay+grace {
		t.Errorf("terminationGracePeriodSeconds %v; want more than drain_delay %v + shutdown_grace %v", tg, delay, grace)
	}

	// The Redis URL: --redis=$(VAR), VAR from a key of the Secret.
	redisArg, _ := flagValue(c.Args, "redis")
	envName, ok := strings.CutPrefix(redisArg, "$(")
	envName, ok2 := strings.CutSuffix(envName, ")")
	if !ok || !ok2 {
		t.Fatalf("--redis=%q; want $(ENV) from the Secret", redisArg)
	}
	var fromSecret bool
	for _, e := range c.Env {
		if e.Name == envName && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			ref := e.ValueFrom.SecretKeyRef
			_, inData := m.secret.Data[ref.Key]
			_, inString := m.secret.StringData[ref.Key]
			fromSecret = ref.Name == m.secret.Name && (inData || inString)
		}
	}
	if !fromSecret {
		t.Errorf("env %s: want it from a key of Secret %s", envName, m.secret.Name)
	}

	// Services: one headless for dns:/// round-robin, one ClusterIP; both
	// select the pods and reach the grpc port.
	for name, headless := range map[string]bool{"coordd-headless": true, "coordd": false} {
		s, ok := m.services[name]
		if !ok {
			t.Errorf("no Service %s", name)
			continue
		}
		if got := s.Spec.ClusterIP == corev1.ClusterIPNone; got != headless {
			t.Errorf("Service %s: headless %v; want %v", name, got, headless)
		}
		if !headless && s.Spec.Type != corev1.ServiceTypeClusterIP {
			t.Errorf("Service %s: type %q; want ClusterIP", name, s.Spec.Type)
		}
		if !labels.SelectorFromSet(s.Spec.Selector).Matches(labels.Set(pod.Labels)) || len(s.Spec.Selector) == 0 {
			t.Errorf("Service %s: selector %v does not select the pods", name, s.Spec.Selector)
		}
		if len(s.Spec.Ports) != 1 || s.Spec.Ports[0].Port != 50051 || s.Spec.Ports[0].TargetPort != intstr.FromString("grpc") {
			t.Errorf("Service %s: ports %+v; want 50051 to the grpc port", name, s.Spec.Ports)
		}
	}

	psel, err := metav1.LabelSelectorAsSelector(m.pdb.Spec.Selector)
	if err != nil || !psel.Matches(labels.Set(pod.Labels)) {
		t.Errorf("PodDisruptionBudget selector %v does not select the pods", m.pdb.Spec.Selector)
	}
	if m.pdb.Spec.MaxUnavailable == nil && m.pdb.Spec.MinAvailable == nil {
		t.Error("PodDisruptionBudget: neither maxUnavailable nor minAvailable")
	}

	// kustomization.yaml lists every manifest.
	var k struct {
		APIVersion string   `json:"apiVersion"`
		Kind       string   `json:"kind"`
		Resources  []string `json:"resources"`
	}
	if err := yaml.UnmarshalStrict([]byte(readFile(t, "kubernetes/kustomization.yaml")), &k); err != nil {
		t.Fatalf("kustomization.yaml: %v", err)
	}
	if got, want := sortedCopy(k.Resources), sortedCopy(files); k.Kind != "Kustomization" || !slices.Equal(got, want) {
		t.Errorf("kustomization %s resources = %v; want %v", k.Kind, got, want)
	}
}

// TestKubernetesMCPFleet: the MCP server fleet runs several replicas of
// mdn-mcp over Streamable HTTP, each calling every coordd pod through the
// headless Service; a ClusterIP Service (no session affinity: the replicas
// are stateless) selects them; readiness follows /healthz, which turns 503
// on SIGTERM; the termination grace outlasts the drain; the tokens come
// from optional keys of the Secret.
func TestKubernetesMCPFleet(t *testing.T) {
	m, _ := loadManifests(t)
	d := m.mcp
	pod := d.Spec.Template
	sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	if err != nil || !sel.Matches(labels.Set(pod.Labels)) {
		t.Fatalf("mdn-mcp selector %v (%v) does not match its pods' labels %v", d.Spec.Selector, err, pod.Labels)
	}
	if d.Spec.Replicas == nil || *d.Spec.Replicas < 2 {
		t.Errorf("mdn-mcp replicas %v; want several", d.Spec.Replicas)
	}
	if labels.SelectorFromSet(m.deployment.Spec.Template.Labels).Matches(labels.Set(pod.Labels)) {
		t.Error("mdn-mcp pods carry coordd's labels: coordd's Services would select them")
	}
	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("containers = %d; want 1", len(pod.Spec.Containers))
	}
	c := pod.Spec.Containers[0]
	httpAddr, _ := flagValue(c.Args, "http")
	var port int32
	for _, p := range c.Ports {
		if p.Name == "http" {
			port = p.ContainerPort
		}
	}
	if port == 0 || httpAddr != fmt.Sprintf(":%d", port) {
		t.Fatalf("--http=%q, container port http %d; want every interface on that port", httpAddr, port)
	}
	if a, _ := flagValue(c.Args, "coordd"); a != "dns:///coordd-headless:50051" {
		t.Errorf("--coordd=%q; want dns:///coordd-headless:50051 (every coordd pod, balanced by the client)", a)
	}
	if _, ok := m.services["coordd-headless"]; !ok {
		t.Error("no Service coordd-headless for --coordd")
	}
	if p := c.ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz" || p.HTTPGet.Port != intstr.FromString("http") {
		t.Errorf("readiness probe %+v; want GET /healthz on port http", p)
	}
	if c.LivenessProbe == nil {
		t.Error("no liveness probe")
	}
	delay, err1 := time.ParseDuration(must(flagValue(c.Args, "drain-delay")))
	grace, err2 := time.ParseDuration(must(flagValue(c.Args, "shutdown-grace")))
	if err1 != nil || err2 != nil {
		t.Fatalf("--drain-delay, --shutdown-grace: want both: %v %v", err1, err2)
	}
	if rp := c.ReadinessProbe; time.Duration(rp.PeriodSeconds*rp.FailureThreshold)*time.Second > delay {
		t.Errorf("readiness probe notices a drain after %ds × %d; want within --drain-delay %v", rp.PeriodSeconds, rp.FailureThreshold, delay)
	}
	tg := 30 * time.Second
	if s := pod.Spec.TerminationGracePeriodSeconds; s != nil {
		tg = time.Duration(*s) * time.Second
	}
	if tg <= delay+grace {
		t.Errorf("terminationGracePeriodSeconds %v; want more than --drain-delay %v + --shutdown-grace %v", tg, delay, grace)
	}
	for _, name := range []string{"MDN_MCP_TOKEN", "COORDD_TOKEN"} {
		var ok bool
		for _, e := range c.Env {
			if e.Name == name && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
				ref := e.ValueFrom.SecretKeyRef
				ok = ref.Name == m.secret.Name && ref.Optional != nil && *ref.Optional
			}
		}
		if !ok {
			t.Errorf("env %s: want it from an optional key of Secret %s", name, m.secret.Name)
		}
	}
	s, ok := m.services["mdn-mcp"]
	if !ok {
		t.Fatal("no Service mdn-mcp")
	}
	if s.Spec.Type != corev1.ServiceTypeClusterIP || s.Spec.ClusterIP == corev1.ClusterIPNone {
		t.Errorf("Service mdn-mcp: type %q, clusterIP %q; want a ClusterIP Service", s.Spec.Type, s.Spec.ClusterIP)
	}
	if s.Spec.SessionAffinity != "" && s.Spec.SessionAffinity != corev1.ServiceAffinityNone {
		t.Errorf("Service mdn-mcp: sessionAffinity %q; want none: the replicas are stateless", s.Spec.SessionAffinity)
	}
	if len(s.Spec.Selector) == 0 || !labels.SelectorFromSet(s.Spec.Selector).Matches(labels.Set(pod.Labels)) {
		t.Errorf("Service mdn-mcp: selector %v does not select the mdn-mcp pods", s.Spec.Selector)
	}
	if len(s.Spec.Ports) != 1 || s.Spec.Ports[0].TargetPort != intstr.FromString("http") {
		t.Errorf("Service mdn-mcp: ports %+v; want one, to the http port", s.Spec.Ports)
	}
	psel, err := metav1.LabelSelectorAsSelector(m.mcpPDB.Spec.Selector)
	if err != nil || !psel.Matches(labels.Set(pod.Labels)) {
		t.Errorf("mdn-mcp PodDisruptionBudget selector %v does not select the pods", m.mcpPDB.Spec.Selector)
	}
}

func must(v string, _ bool) string { return v }
