package chartcheck

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	releaseutil "helm.sh/helm/v4/pkg/release/v1/util"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// TestPlainManifest holds deploy/kubernetes/projector.yaml, the manifest
// for clusters without Helm, to the chart's rules: it decodes strictly,
// the grace period covers the preStop sleep and --shutdown-timeout,
// GOMEMLIMIT is 80-90% of the memory limit, the probes are on /livez and
// /readyz at the metrics port, and there are no more members than the
// demo topic's 6 partitions.
func TestPlainManifest(t *testing.T) {
	b, err := os.ReadFile("../../kubernetes/projector.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var d *appsv1.Deployment
	n := 0
	for name, doc := range releaseutil.SplitManifests(string(b)) {
		var head metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		switch head.Kind {
		case "":
			continue // the header's comments
		case "Deployment":
			d = decode(t, doc, map[string]*appsv1.Deployment{})
		case "ConfigMap":
			decode(t, doc, map[string]*corev1.ConfigMap{})
		case "Service":
			decode(t, doc, map[string]*corev1.Service{})
		default:
			t.Fatalf("a %s, which this test does not decode", head.Kind)
		}
		n++
	}
	if d == nil || n != 3 {
		t.Fatalf("want a ConfigMap, a Deployment and a Service; got %d documents", n)
	}
	spec := d.Spec.Template.Spec
	checkPodSpec(t, d.Name, spec, d.Spec.Template.Labels, d.Spec.Selector.MatchLabels)
	if d.Spec.Replicas == nil || *d.Spec.Replicas > 6 {
		t.Errorf("replicas %v: more than the 6 partitions of accounts.events", d.Spec.Replicas)
	}
	c := container(t, spec, "projector")

	timeout, err := time.ParseDuration(envValue(t, c, "PROJECTOR_SHUTDOWN_TIMEOUT"))
	if err != nil {
		t.Fatal(err)
	}
	var sleep int64
	if c.Lifecycle != nil && c.Lifecycle.PreStop != nil && c.Lifecycle.PreStop.Sleep != nil {
		sleep = c.Lifecycle.PreStop.Sleep.Seconds
	}
	if g := spec.TerminationGracePeriodSeconds; g == nil || *g <= sleep+int64(timeout/time.Second) {
		t.Errorf("terminationGracePeriodSeconds %v is not above the preStop sleep (%ds) + --shutdown-timeout (%v)", g, sleep, timeout)
	}

	limit := c.Resources.Limits.Memory().Value()
	gml := envValue(t, c, "GOMEMLIMIT")
	mib, err := strconv.ParseInt(strings.TrimSuffix(gml, "MiB"), 10, 64)
	if err != nil {
		t.Fatalf("GOMEMLIMIT %q: %v", gml, err)
	}
	if share := float64(mib<<20) / float64(limit); share < 0.8 || share >= 0.9 {
		t.Errorf("GOMEMLIMIT %s is %.0f%% of the limit %d, want 80-90%%", gml, share*100, limit)
	}
	if req := c.Resources.Requests.Memory().Value(); req < 692_000_000 {
		t.Errorf("memory request %d bytes is below the measured peak of 692 MB", req)
	}

	addr := envValue(t, c, "PROJECTOR_HTTP_ADDR")
	for path, p := range map[string]*corev1.Probe{"/livez": c.LivenessProbe, "/readyz": c.ReadinessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != path || ":"+strconv.Itoa(int(namedPort(c, p.HTTPGet.Port.StrVal))) != addr {
			t.Errorf("the probe for %s is not on the metrics port %s: %+v", path, addr, p)
		}
	}
}
