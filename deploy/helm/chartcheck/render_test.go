// Package chartcheck tests the Helm chart in ../projector the way Helm
// itself reads it: `helm lint` and `helm template` through Helm's own
// library (helm.sh/helm/v4), without a cluster, and every rendered
// document decoded strictly into the Kubernetes, prometheus-operator and
// KEDA API types, so that a misspelled or misplaced field fails here
// rather than at `kubectl apply`.
package chartcheck

import (
	"fmt"
	"log/slog"
	"maps"
	"os"
	"strings"
	"testing"

	kedav1alpha1 "github.com/kedacore/keda/v2/apis/keda/v1alpha1"
	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/v2/lint"
	"helm.sh/helm/v4/pkg/chart/v2/lint/support"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	releasev1 "helm.sh/helm/v4/pkg/release/v1"
	releaseutil "helm.sh/helm/v4/pkg/release/v1/util"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

const (
	chartDir = "../projector"
	// The oldest Kubernetes the chart supports (its kubeVersion): the
	// preStop sleep action is there from 1.30.
	kubeVersion = "v1.30.0"
	namespace   = "projection"
)

// TestMain silences Helm's log, which says at INFO, for every render, that
// the chart's files/alerts.yml is a symbolic link (to
// deploy/prometheus/alerts.yml, on purpose); lint findings are checked
// from lint's own result.
func TestMain(m *testing.M) {
	slog.SetDefault(slog.New(slog.DiscardHandler))
	os.Exit(m.Run())
}

// allOn turns every toggle of the chart on, with a secret for every secret
// file, over the defaults.
func allOn() map[string]any {
	return map[string]any{
		"database": map[string]any{
			"passwordSecret": map[string]any{"name": "projector-database"},
		},
		"kafka": map[string]any{
			"tls": map[string]any{
				"enabled":    true,
				"caSecret":   map[string]any{"name": "kafka-ca"},
				"certSecret": map[string]any{"name": "projector-kafka-client"},
				"keySecret":  map[string]any{"name": "projector-kafka-client"},
				"serverName": "kafka.internal",
			},
			"sasl": map[string]any{
				"mechanism":        "scram-sha-512",
				"username":         "projector",
				"passwordSecret":   map[string]any{"name": "projector-kafka-sasl"},
				"oauthTokenSecret": map[string]any{"name": "projector-kafka-token"},
			},
		},
		"registry": map[string]any{
			"user":           "projector",
			"passwordSecret": map[string]any{"name": "projector-registry"},
			"caSecret":       map[string]any{"name": "registry-ca"},
		},
		"extraConfigFiles": map[string]any{"account.avsc": `{"type": "record", "name": "Account", "fields": []}`},
		"metrics": map[string]any{
			"serviceMonitor": map[string]any{"enabled": true, "labels": map[string]any{"release": "prometheus"}},
			"prometheusRule": map[string]any{"enabled": true, "labels": map[string]any{"release": "prometheus"}},
		},
		"autoscaling": map[string]any{"enabled": true},
		"relay":       map[string]any{"enabled": true},
		"api":         map[string]any{"enabled": true, "auth": map[string]any{"tokenSecret": map[string]any{"name": "projector-api-tokens"}}},
		"env":         map[string]any{"PROJECTOR_STATE_CACHE_BYTES": "256MiB"},
	}
}

// with returns base overlaid with the path's value, path as a.b.c.
func with(base map[string]any, path string, value any) map[string]any {
	out := deepCopy(base)
	m := out
	keys := strings.Split(path, ".")
	for _, k := range keys[:len(keys)-1] {
		next, ok := m[k].(map[string]any)
		if !ok {
			next = map[string]any{}
		}
		next = deepCopy(next)
		m[k] = next
		m = next
	}
	m[keys[len(keys)-1]] = value
	return out
}

func deepCopy(m map[string]any) map[string]any {
	out := maps.Clone(m)
	if out == nil {
		out = map[string]any{}
	}
	for k, v := range out {
		if sub, ok := v.(map[string]any); ok {
			out[k] = deepCopy(sub)
		}
	}
	return out
}

// templateChart renders the chart as `helm template RELEASE ../projector
// --namespace projection --kube-version 1.30.0` with these values over the
// chart's own.
func templateChart(release string, values map[string]any) (string, error) {
	return templateChartSchema(release, values, true)
}

// templateChartSchema is templateChart, with values.schema.json checked or
// not (`--skip-schema-validation`).
func templateChartSchema(release string, values map[string]any, schema bool) (string, error) {
	chrt, err := loader.Load(chartDir)
	if err != nil {
		return "", fmt.Errorf("load the chart: %w", err)
	}
	kv, err := common.ParseKubeVersion(kubeVersion)
	if err != nil {
		return "", err
	}
	install := action.NewInstall(action.NewConfiguration())
	install.DryRunStrategy = action.DryRunClient
	install.Replace = true
	install.ReleaseName = release
	install.Namespace = namespace
	install.KubeVersion = kv
	install.SkipSchemaValidation = !schema
	rel, err := install.Run(chrt, values)
	if err != nil {
		return "", err
	}
	r, ok := rel.(*releasev1.Release)
	if !ok {
		return "", fmt.Errorf("helm returned a release of type %T", rel)
	}
	return r.Manifest, nil
}

// rendered is a rendered chart decoded into the API types.
type rendered struct {
	deployments     map[string]*appsv1.Deployment
	statefulSets    map[string]*appsv1.StatefulSet
	configMaps      map[string]*corev1.ConfigMap
	services        map[string]*corev1.Service
	pdbs            map[string]*policyv1.PodDisruptionBudget
	serviceMonitors map[string]*monitoringv1.ServiceMonitor
	rules           map[string]*monitoringv1.PrometheusRule
	scaledObjects   map[string]*kedav1alpha1.ScaledObject
	count           int
}

// render renders the chart and decodes every document strictly: a field
// the API type does not have, or one given twice, fails the test, as does
// a kind the test does not know.
func render(t *testing.T, release string, values map[string]any) *rendered {
	t.Helper()
	manifest, err := templateChart(release, values)
	if err != nil {
		t.Fatalf("helm template: %v", err)
	}
	r := &rendered{
		deployments:     map[string]*appsv1.Deployment{},
		statefulSets:    map[string]*appsv1.StatefulSet{},
		configMaps:      map[string]*corev1.ConfigMap{},
		services:        map[string]*corev1.Service{},
		pdbs:            map[string]*policyv1.PodDisruptionBudget{},
		serviceMonitors: map[string]*monitoringv1.ServiceMonitor{},
		rules:           map[string]*monitoringv1.PrometheusRule{},
		scaledObjects:   map[string]*kedav1alpha1.ScaledObject{},
	}
	for name, doc := range releaseutil.SplitManifests(manifest) {
		var head metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
			t.Fatalf("%s: %v\n%s", name, err, doc)
		}
		var obj metav1.Object
		switch head.APIVersion + " " + head.Kind {
		case "apps/v1 Deployment":
			obj = decode(t, doc, r.deployments)
		case "apps/v1 StatefulSet":
			obj = decode(t, doc, r.statefulSets)
		case "v1 ConfigMap":
			obj = decode(t, doc, r.configMaps)
		case "v1 Service":
			obj = decode(t, doc, r.services)
		case "policy/v1 PodDisruptionBudget":
			obj = decode(t, doc, r.pdbs)
		case "monitoring.coreos.com/v1 ServiceMonitor":
			obj = decode(t, doc, r.serviceMonitors)
		case "monitoring.coreos.com/v1 PrometheusRule":
			obj = decode(t, doc, r.rules)
		case "keda.sh/v1alpha1 ScaledObject":
			obj = decode(t, doc, r.scaledObjects)
		default:
			t.Fatalf("rendered a %s %s, which this test does not decode: add its API type\n%s", head.APIVersion, head.Kind, doc)
		}
		if obj.GetName() == "" {
			t.Errorf("a %s without a name:\n%s", head.Kind, doc)
		}
		if obj.GetLabels()["app.kubernetes.io/instance"] != release {
			t.Errorf("%s %s: label app.kubernetes.io/instance is %q, want the release %q", head.Kind, obj.GetName(), obj.GetLabels()["app.kubernetes.io/instance"], release)
		}
		r.count++
	}
	return r
}

// decode unmarshals doc strictly into a new T and files it by name.
func decode[T any, PT interface {
	*T
	metav1.Object
}](t *testing.T, doc string, into map[string]PT) PT {
	t.Helper()
	obj := PT(new(T))
	if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
		t.Fatalf("decoding strictly as %T: %v\n%s", obj, err, doc)
	}
	if _, dup := into[obj.GetName()]; dup {
		t.Fatalf("two %T named %s", obj, obj.GetName())
	}
	into[obj.GetName()] = obj
	return obj
}

// lintChart runs `helm lint` on the chart with these values and returns
// its findings of warning or worse.
func lintChart(values map[string]any) []string {
	kv, _ := common.ParseKubeVersion(kubeVersion)
	result := lint.RunAll(chartDir, values, namespace, lint.WithKubeVersion(kv))
	var bad []string
	for _, m := range result.Messages {
		if m.Severity >= support.WarningSev {
			bad = append(bad, m.Error())
		}
	}
	return bad
}
