package chartcheck

import (
	"maps"
	"os"
	"path"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	kedav1alpha1 "github.com/kedacore/keda/v2/apis/keda/v1alpha1"
	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"
)

// chartValues reads the chart's values.yaml, for the figures the tests
// compare the rendered manifests with.
func chartValues(t *testing.T) map[string]any {
	t.Helper()
	b, err := os.ReadFile(chartDir + "/values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var v map[string]any
	if err := yaml.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

func TestLint(t *testing.T) {
	for name, values := range map[string]map[string]any{
		"defaults":  nil,
		"all on":    allOn(),
		"stateful":  with(allOn(), "kind", "StatefulSet"),
		"prom keda": with(with(allOn(), "autoscaling.trigger", "prometheus"), "kind", "StatefulSet"),
	} {
		if bad := lintChart(values); len(bad) > 0 {
			t.Errorf("helm lint with %s:\n%s", name, strings.Join(bad, "\n"))
		}
	}
}

// TestRenderDefaults: the defaults give the members' Deployment, its
// ConfigMap, Service and PodDisruptionBudget, and nothing that needs a
// CRD or an optional component.
func TestRenderDefaults(t *testing.T) {
	r := render(t, "projector", nil)
	if len(r.deployments) != 1 || r.deployments["projector"] == nil {
		t.Fatalf("want the Deployment projector, got %v", keys(r.deployments))
	}
	for what, n := range map[string]int{
		"ConfigMap":           len(r.configMaps),
		"Service":             len(r.services),
		"PodDisruptionBudget": len(r.pdbs),
	} {
		if n != 1 {
			t.Errorf("%d %ss, want 1", n, what)
		}
	}
	if n := len(r.statefulSets) + len(r.serviceMonitors) + len(r.rules) + len(r.scaledObjects); n != 0 {
		t.Errorf("the defaults render %d StatefulSets, ServiceMonitors, PrometheusRules or ScaledObjects", n)
	}
	if r.count != 4 {
		t.Errorf("rendered %d documents, want 4", r.count)
	}
	d := r.deployments["projector"]
	c := container(t, d.Spec.Template.Spec, "projector")
	if got := envValue(t, c, "PROJECTOR_CONFIG"); got != "/etc/projector/config/projections.yaml" {
		t.Errorf("PROJECTOR_CONFIG %q", got)
	}
	if cm := r.configMaps["projector-config"]; cm == nil || !strings.Contains(cm.Data["projections.yaml"], "topic: accounts.events") {
		t.Errorf("the ConfigMap projector-config does not hold the projection file: %v", r.configMaps)
	}
	if vol := volume(d.Spec.Template.Spec, "config"); vol == nil || vol.ConfigMap == nil || vol.ConfigMap.Name != "projector-config" {
		t.Errorf("the members do not mount the ConfigMap projector-config: %+v", vol)
	}
	checkPodSpec(t, "projector", d.Spec.Template.Spec, d.Spec.Template.Labels, d.Spec.Selector.MatchLabels)
}

// TestRenderAllOn: every toggle on renders every kind, each decoded
// strictly, under another release name.
func TestRenderAllOn(t *testing.T) {
	for _, kind := range []string{"Deployment", "StatefulSet"} {
		t.Run(kind, func(t *testing.T) {
			r := render(t, "prod", with(allOn(), "kind", kind))
			want := map[string]int{"ServiceMonitor": 1, "PrometheusRule": 1, "ScaledObject": 1, "ConfigMap": 1, "PodDisruptionBudget": 1}
			got := map[string]int{"ServiceMonitor": len(r.serviceMonitors), "PrometheusRule": len(r.rules), "ScaledObject": len(r.scaledObjects), "ConfigMap": len(r.configMaps), "PodDisruptionBudget": len(r.pdbs)}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("rendered %v, want %v", got, want)
			}
			for _, name := range []string{"prod-projector-relay", "prod-projector-api"} {
				if r.deployments[name] == nil {
					t.Errorf("no Deployment %s: %v", name, keys(r.deployments))
				}
				if r.services[name] == nil {
					t.Errorf("no Service %s: %v", name, keys(r.services))
				}
			}
			wantServices := []string{"prod-projector", "prod-projector-api", "prod-projector-relay"}
			if kind == "StatefulSet" {
				wantServices = append(wantServices, "prod-projector-members")
				slices.Sort(wantServices)
			}
			if got := keys(r.services); !slices.Equal(got, wantServices) {
				t.Errorf("Services %v, want %v", got, wantServices)
			}
			for name, d := range r.deployments {
				checkPodSpec(t, name, d.Spec.Template.Spec, d.Spec.Template.Labels, d.Spec.Selector.MatchLabels)
			}
			for name, s := range r.statefulSets {
				checkPodSpec(t, name, s.Spec.Template.Spec, s.Spec.Template.Labels, s.Spec.Selector.MatchLabels)
			}
			for name, s := range r.services {
				if problems := validation.IsDNS1035Label(name); len(problems) > 0 {
					t.Errorf("Service name %q: %v", name, problems)
				}
				if len(s.Spec.Selector) == 0 {
					t.Errorf("Service %s selects nothing", name)
				}
			}
			if cm := r.configMaps["prod-projector-config"]; cm == nil || cm.Data["account.avsc"] == "" {
				t.Errorf("extraConfigFiles not in the ConfigMap: %v", r.configMaps)
			}
		})
	}
}

// checkPodSpec checks what the API server would refuse or what would
// never work: the selector matching the pod's labels, mounts of volumes
// that exist, probes on a named port of the container, a variable given
// twice.
func checkPodSpec(t *testing.T, name string, spec corev1.PodSpec, labels, selector map[string]string) {
	t.Helper()
	for k, v := range selector {
		if labels[k] != v {
			t.Errorf("%s: the selector's %s=%s is not among the pod's labels %v", name, k, v, labels)
		}
	}
	volumes := map[string]bool{}
	for _, v := range spec.Volumes {
		if volumes[v.Name] {
			t.Errorf("%s: two volumes named %s", name, v.Name)
		}
		volumes[v.Name] = true
	}
	for _, c := range spec.Containers {
		ports := map[string]int32{}
		for _, p := range c.Ports {
			ports[p.Name] = p.ContainerPort
		}
		for _, m := range c.VolumeMounts {
			if !volumes[m.Name] {
				t.Errorf("%s: container %s mounts the volume %s, which the pod does not have", name, c.Name, m.Name)
			}
		}
		for _, p := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe} {
			if p == nil || p.HTTPGet == nil {
				t.Errorf("%s: container %s lacks an HTTP liveness or readiness probe", name, c.Name)
				continue
			}
			if _, ok := ports[p.HTTPGet.Port.StrVal]; !ok {
				t.Errorf("%s: a probe on port %q, which container %s does not name", name, p.HTTPGet.Port.String(), c.Name)
			}
		}
		seen := map[string]bool{}
		for _, e := range c.Env {
			if seen[e.Name] {
				t.Errorf("%s: %s given twice", name, e.Name)
			}
			seen[e.Name] = true
		}
	}
}

// TestShutdownTiming: the kubelet kills a member only after the preStop
// sleep and --shutdown-timeout have both run out, for the defaults and for
// other settings.
func TestShutdownTiming(t *testing.T) {
	for _, tc := range []struct {
		name              string
		values            map[string]any
		preStop, shutdown int64
	}{
		{"defaults", nil, 5, 20},
		{"long shutdown", map[string]any{"shutdown": map[string]any{"timeoutSeconds": 50}}, 5, 50},
		{"no preStop", map[string]any{"shutdown": map[string]any{"preStopSleepSeconds": 0}}, 0, 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := render(t, "projector", tc.values).deployments["projector"].Spec.Template.Spec
			c := container(t, spec, "projector")
			timeout, err := time.ParseDuration(envValue(t, c, "PROJECTOR_SHUTDOWN_TIMEOUT"))
			if err != nil {
				t.Fatalf("PROJECTOR_SHUTDOWN_TIMEOUT: %v", err)
			}
			if want := time.Duration(tc.shutdown) * time.Second; timeout != want {
				t.Errorf("--shutdown-timeout %v, want %v", timeout, want)
			}
			var sleep int64
			if c.Lifecycle != nil && c.Lifecycle.PreStop != nil {
				if c.Lifecycle.PreStop.Sleep == nil {
					t.Fatalf("a preStop hook other than a sleep: %+v (the image has no shell)", c.Lifecycle.PreStop)
				}
				sleep = c.Lifecycle.PreStop.Sleep.Seconds
			}
			if sleep != tc.preStop {
				t.Errorf("preStop sleeps %ds, want %d", sleep, tc.preStop)
			}
			grace := spec.TerminationGracePeriodSeconds
			if grace == nil {
				t.Fatal("no terminationGracePeriodSeconds: Kubernetes' 30s would apply whatever --shutdown-timeout says")
			}
			if budget := sleep + int64(timeout/time.Second); *grace <= budget {
				t.Errorf("terminationGracePeriodSeconds %d is not above the preStop sleep (%ds) + --shutdown-timeout (%v): the member is killed before it may leave the group", *grace, sleep, timeout)
			}
		})
	}
}

// TestMemory: GOMEMLIMIT is set below the memory limit, at 80-90% of it,
// and the request covers the resident set the benchmark measured at a
// million aggregates (692 MB).
func TestMemory(t *testing.T) {
	const measuredPeak = 692_000_000
	for _, tc := range []struct {
		name   string
		values map[string]any
		want   string
	}{
		{"defaults", nil, "870MiB"},
		{"2Gi", map[string]any{"resources": map[string]any{"limits": map[string]any{"memory": "2Gi"}}}, "1740MiB"},
		{"decimal", map[string]any{"resources": map[string]any{"limits": map[string]any{"memory": "1500M"}}}, "1215MiB"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := container(t, render(t, "projector", tc.values).deployments["projector"].Spec.Template.Spec, "projector")
			got := envValue(t, c, "GOMEMLIMIT")
			if got != tc.want {
				t.Errorf("GOMEMLIMIT %q, want %q", got, tc.want)
			}
			limit := c.Resources.Limits.Memory().Value()
			mib, err := strconv.ParseInt(strings.TrimSuffix(got, "MiB"), 10, 64)
			if err != nil {
				t.Fatalf("GOMEMLIMIT %q: %v", got, err)
			}
			if share := float64(mib<<20) / float64(limit); share < 0.8 || share >= 0.9 {
				t.Errorf("GOMEMLIMIT %s is %.0f%% of the limit %d, want 80-90%%", got, share*100, limit)
			}
			if tc.values == nil {
				if req := c.Resources.Requests.Memory().Value(); req < measuredPeak {
					t.Errorf("memory request %d bytes is below the measured peak %d", req, measuredPeak)
				}
				if limit < measuredPeak || mib<<20 < measuredPeak {
					t.Errorf("the limit %d or GOMEMLIMIT %s is below the measured peak %d", limit, got, measuredPeak)
				}
			}
		})
	}
	// The relay and the API get theirs from their own limits.
	r := render(t, "projector", allOn())
	for _, name := range []string{"projector-relay", "projector-api"} {
		c := r.deployments[name].Spec.Template.Spec.Containers[0]
		if got := envValue(t, c, "GOMEMLIMIT"); got != "217MiB" {
			t.Errorf("%s: GOMEMLIMIT %q, want 217MiB (85%% of 256Mi)", name, got)
		}
	}
	// Without a memory limit there is nothing to derive it from.
	c := container(t, render(t, "projector", map[string]any{"resources": map[string]any{"limits": map[string]any{"memory": nil}}}).deployments["projector"].Spec.Template.Spec, "projector")
	for _, e := range c.Env {
		if e.Name == "GOMEMLIMIT" {
			t.Errorf("GOMEMLIMIT %q without a memory limit", e.Value)
		}
	}
}

// TestProbes: liveness on /livez and readiness on /readyz, at the port
// --http-addr listens on, for every component.
func TestProbes(t *testing.T) {
	r := render(t, "projector", allOn())
	for name, d := range r.deployments {
		c := d.Spec.Template.Spec.Containers[0]
		addr := envValue(t, c, "PROJECTOR_HTTP_ADDR")
		for _, p := range []struct {
			probe *corev1.Probe
			path  string
		}{{c.LivenessProbe, "/livez"}, {c.ReadinessProbe, "/readyz"}} {
			if p.probe == nil || p.probe.HTTPGet == nil {
				t.Errorf("%s: no HTTP probe for %s", name, p.path)
				continue
			}
			if p.probe.HTTPGet.Path != p.path {
				t.Errorf("%s: probe on %s, want %s", name, p.probe.HTTPGet.Path, p.path)
			}
			port := namedPort(c, p.probe.HTTPGet.Port.StrVal)
			if ":"+strconv.Itoa(int(port)) != addr {
				t.Errorf("%s: probe %s on port %d, but PROJECTOR_HTTP_ADDR is %q", name, p.path, port, addr)
			}
		}
	}
	members := r.deployments["projector"].Spec.Template.Spec.Containers[0]
	if members.Ports[0].Name != "http-metrics" {
		t.Errorf("the members' port is named %q, want http-metrics (the ServiceMonitor scrapes it)", members.Ports[0].Name)
	}
}

// TestReplicasWithinPartitions: the members never outnumber the
// partitions, with or without KEDA.
func TestReplicasWithinPartitions(t *testing.T) {
	v := chartValues(t)
	partitions := int32(v["partitions"].(float64))
	d := render(t, "projector", nil).deployments["projector"]
	if d.Spec.Replicas == nil || *d.Spec.Replicas > partitions {
		t.Errorf("replicas %v with partitions %d", d.Spec.Replicas, partitions)
	}
	r := render(t, "projector", allOn())
	so := r.scaledObjects["projector"]
	if so.Spec.MaxReplicaCount == nil || *so.Spec.MaxReplicaCount != partitions {
		t.Errorf("KEDA maxReplicaCount %v, want partitions (%d)", so.Spec.MaxReplicaCount, partitions)
	}
	if reps := r.deployments["projector"].Spec.Replicas; reps != nil {
		t.Errorf("replicas %d rendered beside a ScaledObject: each upgrade would reset what KEDA chose", *reps)
	}
}

// TestRefusedValues: values that would render members beyond the
// partitions, a GOMEMLIMIT from a limit not understood, a variable
// contradicting what the chart derives, a misspelled key or a value of the
// wrong type (values.schema.json) are refused with the value named.
func TestRefusedValues(t *testing.T) {
	for _, tc := range []struct {
		values map[string]any
		want   string
	}{
		{map[string]any{"replicas": 7}, "replicas 7 exceeds partitions 6"},
		{map[string]any{"api": map[string]any{"enabled": true}}, "api.auth.tokenSecret.name is required with api.auth.mode tokens"},
		{map[string]any{"api": map[string]any{"enabled": true, "auth": map[string]any{"mode": "jwt"}}}, "api.auth.jwt.issuer is required with api.auth.mode jwt"},
		{map[string]any{"api": map[string]any{"auth": map[string]any{"mode": "open"}}}, "at '/api/auth/mode'"},
		{with(allOn(), "autoscaling.maxReplicas", 12), "autoscaling.maxReplicas 12 exceeds partitions 6"},
		{map[string]any{"partitions": 0}, "at '/partitions': minimum: got 0, want 1"},
		{map[string]any{"partitions": "six"}, "at '/partitions': got string, want integer"},
		{map[string]any{"replica": 2}, "additional properties 'replica' not allowed"},
		{map[string]any{"database": map[string]any{"passwordSecret": map[string]any{"nmae": "db"}}}, "at '/database/passwordSecret': additional properties 'nmae' not allowed"},
		{with(allOn(), "autoscaling.trigger", "cpu"), "at '/autoscaling/trigger': value must be one of 'kafka', 'prometheus'"},
		{with(with(allOn(), "autoscaling.trigger", "prometheus"), "autoscaling.minReplicas", 0), "autoscaling.minReplicas 0 with the prometheus trigger"},
		{map[string]any{"resources": map[string]any{"limits": map[string]any{"memory": "1GB"}}}, `resources.limits.memory "1GB": want a whole number of bytes`},
		{map[string]any{"goMemLimitPercent": 120}, "at '/goMemLimitPercent': maximum: got 120, want 100"},
		{map[string]any{"kind": "DaemonSet"}, "at '/kind': value must be one of 'Deployment', 'StatefulSet'"},
		{map[string]any{"env": map[string]any{"PROJECTOR_SHUTDOWN_TIMEOUT": "60s"}}, "env PROJECTOR_SHUTDOWN_TIMEOUT: set shutdown.timeoutSeconds instead"},
		{map[string]any{"env": map[string]any{"GOMEMLIMIT": "2GiB"}}, "env GOMEMLIMIT: set resources.limits.memory and goMemLimitPercent instead"},
		{map[string]any{"database": map[string]any{"passwordSecret": map[string]any{"name": "db", "key": ""}}}, `the Secret "db" for PROJECTOR_DATABASE_PASSWORD_FILE names no key`},
	} {
		_, err := templateChart("projector", tc.values)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("values %v: got %v, want an error with %q", tc.values, err, tc.want)
		}
	}
	// Without values.schema.json (--skip-schema-validation) the templates
	// still refuse what would render a broken workload.
	for _, tc := range []struct {
		values map[string]any
		want   string
	}{
		{map[string]any{"partitions": 0}, "partitions 0: want the number of partitions"},
		{with(allOn(), "autoscaling.trigger", "cpu"), `autoscaling.trigger "cpu": want kafka or prometheus`},
		{map[string]any{"goMemLimitPercent": 120}, "goMemLimitPercent 120: want a whole percentage"},
		{map[string]any{"kind": "DaemonSet"}, `kind "DaemonSet": want Deployment or StatefulSet`},
		{map[string]any{"shutdown": map[string]any{"marginSeconds": 0}}, "shutdown.marginSeconds at least 1"},
	} {
		_, err := templateChartSchema("projector", tc.values, false)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("values %v without the schema: got %v, want an error with %q", tc.values, err, tc.want)
		}
	}
}

// The variables that name a file holding a secret, and the Secret each
// comes from in allOn.
var secretFiles = map[string]string{
	"PROJECTOR_DATABASE_PASSWORD_FILE":      "projector-database",
	"PROJECTOR_KAFKA_TLS_CA_FILE":           "kafka-ca",
	"PROJECTOR_KAFKA_TLS_CERT_FILE":         "projector-kafka-client",
	"PROJECTOR_KAFKA_TLS_KEY_FILE":          "projector-kafka-client",
	"PROJECTOR_KAFKA_SASL_PASSWORD_FILE":    "projector-kafka-sasl",
	"PROJECTOR_KAFKA_SASL_OAUTH_TOKEN_FILE": "projector-kafka-token",
	"PROJECTOR_REGISTRY_PASSWORD_FILE":      "projector-registry",
	"PROJECTOR_REGISTRY_TLS_CA_FILE":        "registry-ca",
}

// TestSecretsAsFiles: every secret reaches projector as a file of a
// mounted Secret, named by its *_FILE variable; no secret is in the
// environment, and with none configured nothing is mounted.
func TestSecretsAsFiles(t *testing.T) {
	r := render(t, "projector", allOn())
	for name, d := range r.deployments {
		spec := d.Spec.Template.Spec
		c := spec.Containers[0]
		mounts := map[string]string{} // mount path → volume
		for _, m := range c.VolumeMounts {
			mounts[m.MountPath] = m.Name
			if m.Name == "secrets" && !m.ReadOnly {
				t.Errorf("%s: the secrets are mounted writable", name)
			}
		}
		for env, secret := range secretFiles {
			file := envValue(t, c, env)
			vol := volume(spec, mounts[path.Dir(file)])
			if vol == nil || vol.Projected == nil {
				t.Errorf("%s: %s=%s is not in a mounted projected volume", name, env, file)
				continue
			}
			if vol.Projected.DefaultMode == nil || *vol.Projected.DefaultMode&0o007 != 0 {
				t.Errorf("%s: the secret files are readable by others (mode %v)", name, vol.Projected.DefaultMode)
			}
			found := false
			for _, src := range vol.Projected.Sources {
				for _, item := range src.Secret.Items {
					if item.Path == path.Base(file) {
						found = src.Secret.Name == secret
					}
				}
			}
			if !found {
				t.Errorf("%s: %s=%s is not the Secret %s's file", name, env, file, secret)
			}
		}
		for _, e := range c.Env {
			if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
				t.Errorf("%s: %s comes from a Secret through the environment", name, e.Name)
			}
			if strings.Contains(strings.ToLower(e.Name), "password") && !strings.HasSuffix(e.Name, "_FILE") {
				t.Errorf("%s: %s set in the environment", name, e.Name)
			}
		}
	}
	d := render(t, "projector", nil).deployments["projector"]
	if v := volume(d.Spec.Template.Spec, "secrets"); v != nil {
		t.Errorf("a secrets volume without any secret configured: %+v", v)
	}
	// The whole URL from a Secret stays possible, through the environment.
	d = render(t, "projector", map[string]any{"database": map[string]any{"urlSecret": map[string]any{"name": "projector-database"}}}).deployments["projector"]
	for _, e := range d.Spec.Template.Spec.Containers[0].Env {
		if e.Name == "PROJECTOR_DATABASE_URL" && (e.ValueFrom == nil || e.ValueFrom.SecretKeyRef.Name != "projector-database" || e.ValueFrom.SecretKeyRef.Key != "url") {
			t.Errorf("PROJECTOR_DATABASE_URL with database.urlSecret: %+v", e)
		}
	}
}

// TestVariablesAreProjectors: every PROJECTOR_ variable the chart sets is
// one projector reads (docs/configuration.md lists them): projector reports
// one it does not read, and a misspelled one would silently fall back to a
// default.
func TestVariablesAreProjectors(t *testing.T) {
	ref, err := os.ReadFile("../../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{}
	for _, name := range regexp.MustCompile(`PROJECTOR_[A-Z0-9_]+`).FindAllString(string(ref), -1) {
		known[name] = true
	}
	r := render(t, "projector", with(allOn(), "kind", "StatefulSet"))
	var specs []corev1.PodSpec
	for _, d := range r.deployments {
		specs = append(specs, d.Spec.Template.Spec)
	}
	for _, s := range r.statefulSets {
		specs = append(specs, s.Spec.Template.Spec)
	}
	for _, spec := range specs {
		for _, e := range spec.Containers[0].Env {
			if strings.HasPrefix(e.Name, "PROJECTOR_") && !known[e.Name] {
				t.Errorf("%s is not a variable projector reads", e.Name)
			}
		}
	}
}

// TestStatefulSet: each member's --instance-id is its pod name, and the
// StatefulSet's governing Service exists.
func TestStatefulSet(t *testing.T) {
	r := render(t, "projector", map[string]any{"kind": "StatefulSet"})
	s := r.statefulSets["projector"]
	if s == nil || len(r.deployments) != 0 {
		t.Fatalf("want the StatefulSet projector alone, got %v and Deployments %v", keys(r.statefulSets), keys(r.deployments))
	}
	c := container(t, s.Spec.Template.Spec, "projector")
	var id *corev1.EnvVar
	for i := range c.Env {
		if c.Env[i].Name == "PROJECTOR_INSTANCE_ID" {
			id = &c.Env[i]
		}
	}
	if id == nil || id.ValueFrom == nil || id.ValueFrom.FieldRef == nil || id.ValueFrom.FieldRef.FieldPath != "metadata.name" {
		t.Errorf("PROJECTOR_INSTANCE_ID is not the pod name: %+v", id)
	}
	svc := r.services[s.Spec.ServiceName]
	if svc == nil || svc.Spec.ClusterIP != "None" {
		t.Errorf("serviceName %q is not a rendered headless Service", s.Spec.ServiceName)
	}
	// A Deployment's pods are not stable: no instance id.
	d := container(t, render(t, "projector", nil).deployments["projector"].Spec.Template.Spec, "projector")
	for _, e := range d.Env {
		if e.Name == "PROJECTOR_INSTANCE_ID" {
			t.Errorf("a Deployment sets PROJECTOR_INSTANCE_ID: %+v", e)
		}
	}
}

// TestScaledObject: KEDA scales the workload the chart renders, on the lag
// of the group the members join.
func TestScaledObject(t *testing.T) {
	for _, kind := range []string{"Deployment", "StatefulSet"} {
		r := render(t, "projector", with(allOn(), "kind", kind))
		so := r.scaledObjects["projector"]
		// KEDA's own checks of its admission webhook that need no cluster.
		if err := kedav1alpha1.CheckReplicaCountBoundsAreValid(so); err != nil {
			t.Errorf("%s: KEDA refuses the replica bounds: %v", kind, err)
		}
		if err := kedav1alpha1.ValidateTriggers(so.Spec.Triggers); err != nil {
			t.Errorf("%s: KEDA refuses the triggers: %v", kind, err)
		}
		if so.Spec.ScaleTargetRef.Kind != kind || so.Spec.ScaleTargetRef.Name != "projector" {
			t.Errorf("%s: ScaledObject targets %s %s", kind, so.Spec.ScaleTargetRef.Kind, so.Spec.ScaleTargetRef.Name)
		}
		var spec corev1.PodSpec
		if kind == "Deployment" {
			spec = r.deployments["projector"].Spec.Template.Spec
		} else {
			spec = r.statefulSets["projector"].Spec.Template.Spec
		}
		identity := envValue(t, container(t, spec, "projector"), "PROJECTOR_IDENTITY")
		if len(so.Spec.Triggers) != 1 {
			t.Fatalf("%d triggers, want one per topic (1)", len(so.Spec.Triggers))
		}
		tr := so.Spec.Triggers[0]
		want := map[string]string{
			"bootstrapServers":         "kafka-bootstrap:9092",
			"consumerGroup":            identity,
			"topic":                    "accounts.events",
			"lagThreshold":             "1000",
			"limitToPartitionsWithLag": "true",
			"offsetResetPolicy":        "earliest",
		}
		if tr.Type != "kafka" || !reflect.DeepEqual(tr.Metadata, want) {
			t.Errorf("trigger %s %v, want kafka %v", tr.Type, tr.Metadata, want)
		}
	}
	so := render(t, "projector", with(allOn(), "autoscaling.trigger", "prometheus")).scaledObjects["projector"]
	if err := kedav1alpha1.ValidateTriggers(so.Spec.Triggers); err != nil {
		t.Errorf("KEDA refuses the prometheus trigger: %v", err)
	}
	tr := so.Spec.Triggers[0]
	if want := `sum(max by (topic, partition) (projector_consumer_lag{group="accounts-projector"}))`; tr.Type != "prometheus" || tr.Metadata["query"] != want {
		t.Errorf("trigger %s query %q, want prometheus %q", tr.Type, tr.Metadata["query"], want)
	}
}

// TestServiceMonitor: it scrapes /metrics on the members' and the relay's
// Services, and only those.
func TestServiceMonitor(t *testing.T) {
	r := render(t, "projector", with(allOn(), "kind", "StatefulSet"))
	sm := r.serviceMonitors["projector"]
	if len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Port != "http-metrics" || sm.Spec.Endpoints[0].Path != "/metrics" {
		t.Errorf("endpoints %+v", sm.Spec.Endpoints)
	}
	if sm.Labels["release"] != "prometheus" {
		t.Errorf("metrics.serviceMonitor.labels not on the ServiceMonitor: %v", sm.Labels)
	}
	var scraped []string
	for name, svc := range r.services {
		if matches(sm, svc.Labels) {
			scraped = append(scraped, name)
		}
	}
	slices.Sort(scraped)
	if want := []string{"projector", "projector-relay"}; !slices.Equal(scraped, want) {
		t.Errorf("the ServiceMonitor selects the Services %v, want %v", scraped, want)
	}
}

func matches(sm *monitoringv1.ServiceMonitor, labels map[string]string) bool {
	for k, v := range sm.Spec.Selector.MatchLabels {
		if labels[k] != v {
			return false
		}
	}
	for _, e := range sm.Spec.Selector.MatchExpressions {
		if e.Operator != "In" || !slices.Contains(e.Values, labels[e.Key]) {
			return false
		}
	}
	return true
}

// TestPrometheusRuleIsAlertsFile: the PrometheusRule carries
// deploy/prometheus/alerts.yml as it is, so that the rules promtool tests
// are the ones the chart installs.
func TestPrometheusRuleIsAlertsFile(t *testing.T) {
	b, err := os.ReadFile("../../prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var want monitoringv1.PrometheusRuleSpec
	if err := yaml.UnmarshalStrict(b, &want); err != nil {
		t.Fatalf("deploy/prometheus/alerts.yml as a PrometheusRule spec: %v", err)
	}
	rule := render(t, "projector", allOn()).rules["projector"]
	if !reflect.DeepEqual(rule.Spec, want) {
		// Name the rules that differ rather than print both files.
		got := map[string]monitoringv1.Rule{}
		for _, g := range rule.Spec.Groups {
			for _, r := range g.Rules {
				got[g.Name+"/"+r.Alert+r.Record] = r
			}
		}
		for _, g := range want.Groups {
			for _, r := range g.Rules {
				name := g.Name + "/" + r.Alert + r.Record
				if !reflect.DeepEqual(got[name], r) {
					gotY, _ := yaml.Marshal(got[name])
					wantY, _ := yaml.Marshal(r)
					t.Errorf("the chart's rule %s differs from deploy/prometheus/alerts.yml's:\n--- chart\n%s--- alerts.yml\n%s", name, gotY, wantY)
				}
				delete(got, name)
			}
		}
		for name := range got {
			t.Errorf("the chart has the rule %s, which deploy/prometheus/alerts.yml has not", name)
		}
		if !t.Failed() {
			t.Errorf("the chart's PrometheusRule differs from deploy/prometheus/alerts.yml in its groups")
		}
	}
	if len(want.Groups) == 0 || len(want.Groups[0].Rules) < 10 {
		t.Errorf("alerts.yml holds %d groups: is it read?", len(want.Groups))
	}
	if rule.Labels["release"] != "prometheus" {
		t.Errorf("metrics.prometheusRule.labels not on the PrometheusRule: %v", rule.Labels)
	}
}

// TestConfigChecksum: a changed projection file changes the pods' template,
// so that an upgrade restarts the members with it.
func TestConfigChecksum(t *testing.T) {
	a := render(t, "projector", nil).deployments["projector"].Spec.Template.Annotations["checksum/config"]
	b := render(t, "projector", map[string]any{"projections": "projections: []\n"}).deployments["projector"].Spec.Template.Annotations["checksum/config"]
	if a == "" || a == b {
		t.Errorf("checksum/config %q before and %q after changing the projection file", a, b)
	}
}

func container(t *testing.T, spec corev1.PodSpec, name string) corev1.Container {
	t.Helper()
	for _, c := range spec.Containers {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no container %s", name)
	return corev1.Container{}
}

func envValue(t *testing.T, c corev1.Container, name string) string {
	t.Helper()
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value
		}
	}
	t.Fatalf("container %s does not set %s", c.Name, name)
	return ""
}

func volume(spec corev1.PodSpec, name string) *corev1.Volume {
	for i := range spec.Volumes {
		if spec.Volumes[i].Name == name {
			return &spec.Volumes[i]
		}
	}
	return nil
}

func namedPort(c corev1.Container, name string) int32 {
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort
		}
	}
	return 0
}

func keys[V any](m map[string]V) []string {
	return slices.Sorted(maps.Keys(m))
}

// TestReadAPI: the read API's pod runs projector serve with the API on
// the port its Service targets, metrics and probes on their own port,
// the members' identity (for staleness) and the authentication asked for:
// a token file mounted from its Secret, a JWT issuer's settings, or none.
func TestReadAPI(t *testing.T) {
	r := render(t, "projector", allOn())
	d := r.deployments["projector-api"]
	c := container(t, d.Spec.Template.Spec, "api")
	if got := envValue(t, c, "PROJECTOR_API_ADDR"); got != ":8081" {
		t.Errorf("PROJECTOR_API_ADDR %q, want :8081", got)
	}
	if got := envValue(t, c, "PROJECTOR_HTTP_ADDR"); got != ":8080" {
		t.Errorf("PROJECTOR_HTTP_ADDR %q, want :8080", got)
	}
	if got := envValue(t, c, "PROJECTOR_IDENTITY"); got == "" {
		t.Error("no PROJECTOR_IDENTITY: serve cannot tell a row's staleness")
	}
	if c.ReadinessProbe.HTTPGet.Port.String() != "http-metrics" || c.LivenessProbe.HTTPGet.Port.String() != "http-metrics" {
		t.Errorf("probes on %s and %s, want http-metrics", c.ReadinessProbe.HTTPGet.Port.String(), c.LivenessProbe.HTTPGet.Port.String())
	}
	svc := r.services["projector-api"]
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].TargetPort.String() != "api" || svc.Spec.Ports[0].Port != 8081 {
		t.Errorf("the API's Service ports %+v, want 8081 to the api port alone", svc.Spec.Ports)
	}
	if got := envValue(t, c, "PROJECTOR_AUTH"); got != "tokens" {
		t.Errorf("PROJECTOR_AUTH %q, want tokens", got)
	}
	file := envValue(t, c, "PROJECTOR_AUTH_TOKEN_FILE")
	mounted := false
	for _, m := range c.VolumeMounts {
		if m.Name == "api-auth" && strings.HasPrefix(file, m.MountPath+"/") {
			mounted = true
		}
	}
	found := false
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.Name == "api-auth" && v.Secret != nil && v.Secret.SecretName == "projector-api-tokens" {
			found = true
		}
	}
	if !mounted || !found {
		t.Errorf("token file %s is not in the mounted Secret projector-api-tokens", file)
	}

	jwt := render(t, "projector", with(with(allOn(), "api.auth.mode", "jwt"), "api.auth.jwt",
		map[string]any{"issuer": "https://id.example", "audience": "projector", "jwksUrl": "https://id.example/jwks"}))
	c = container(t, jwt.deployments["projector-api"].Spec.Template.Spec, "api")
	for name, want := range map[string]string{"PROJECTOR_AUTH": "jwt", "PROJECTOR_AUTH_ISSUER": "https://id.example",
		"PROJECTOR_AUTH_AUDIENCE": "projector", "PROJECTOR_AUTH_JWKS_URL": "https://id.example/jwks"} {
		if got := envValue(t, c, name); got != want {
			t.Errorf("jwt: %s %q, want %q", name, got, want)
		}
	}
	for _, e := range c.Env {
		if e.Name == "PROJECTOR_AUTH_TOKEN_FILE" {
			t.Error("jwt: a token file is set too")
		}
	}
}
