package composecheck

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
	"go.yaml.in/yaml/v3"
)

// repoRoot is the repository's top directory, where docker-compose.yml is.
var repoRoot = func() string {
	abs, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		panic(err)
	}
	return abs
}()

func repoPath(parts ...string) string { return filepath.Join(append([]string{repoRoot}, parts...)...) }

// loadStack loads docker-compose.yml as `docker compose config` does, in
// the repository, with this process's environment, every profile active
// (so that no service escapes the checks), and fails on any error.
func loadStack(t *testing.T) *types.Project {
	t.Helper()
	opts, err := cli.NewProjectOptions([]string{repoPath("docker-compose.yml")},
		cli.WithWorkingDirectory(repoRoot),
		cli.WithOsEnv,
		cli.WithDotEnv,
		cli.WithProfiles([]string{"*"}),
	)
	if err != nil {
		t.Fatal(err)
	}
	p, err := opts.LoadProject(context.Background())
	if err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	if len(p.DisabledServices) > 0 {
		t.Fatalf("docker-compose.yml: services %v left out though every profile is active", p.DisabledServices.GetProfiles())
	}
	return p
}

// pinnedTag is an image reference with a version tag: not latest, not
// without a tag.
var pinnedTag = regexp.MustCompile(`^[a-z0-9./_-]+:[A-Za-z0-9_.-]*[0-9][A-Za-z0-9_.-]*(@sha256:[0-9a-f]{64})?$`)

// TestComposeConfig: docker-compose.yml loads without an error, every
// image is pinned to a version, every build context and target exists,
// and every file or directory it mounts from the host is in the
// repository. With the Docker Compose plugin installed, `docker compose
// config` must accept the file too.
func TestComposeConfig(t *testing.T) {
	p := loadStack(t)
	want := []string{"kafka", "kafka-init", "schema-registry", "schema-init", "postgres", "projector", "relay",
		"outbox-writer", "otel-collector", "jaeger", "prometheus", "grafana"}
	if got := p.ServiceNames(); !sameSet(got, want) {
		t.Errorf("services %v, want %v", got, want)
	}
	dockerfile, err := os.ReadFile(repoPath("Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	mounts := 0
	for _, name := range p.ServiceNames() {
		s := p.Services[name]
		if s.Build == nil {
			if !pinnedTag.MatchString(s.Image) {
				t.Errorf("service %s: image %q is not pinned to a version", name, s.Image)
			}
		} else {
			ctx := s.Build.Context
			if st, err := os.Stat(ctx); err != nil || !st.IsDir() {
				t.Errorf("service %s: build context %s: %v", name, ctx, err)
			}
			if target := s.Build.Target; target != "" && !regexp.MustCompile(`(?mi)^FROM\s+\S+\s+AS\s+`+regexp.QuoteMeta(target)+`\s*$`).Match(dockerfile) {
				t.Errorf("service %s: build target %q is no stage of the Dockerfile", name, target)
			}
		}
		for _, v := range s.Volumes {
			if v.Type != types.VolumeTypeBind {
				continue
			}
			mounts++
			rel, err := filepath.Rel(repoRoot, v.Source)
			if err != nil || strings.HasPrefix(rel, "..") {
				t.Errorf("service %s: mounts %s, outside the repository", name, v.Source)
				continue
			}
			if _, err := os.Stat(v.Source); err != nil {
				t.Errorf("service %s: mounts %s at %s, which does not exist", name, rel, v.Target)
			}
		}
	}
	if mounts < 6 {
		t.Errorf("%d bind mounts checked; the stack has more: did the loader's shape change?", mounts)
	}

	if exec.Command("docker", "compose", "version").Run() != nil {
		t.Log("docker compose is not installed: `docker compose config` not run (compose-go above is its loader)")
		return
	}
	args := []string{"compose"}
	var profiles []string
	for _, s := range p.Services {
		profiles = append(profiles, s.Profiles...)
	}
	slices.Sort(profiles)
	for _, profile := range slices.Compact(profiles) {
		args = append(args, "--profile", profile)
	}
	cmd := exec.Command("docker", append(args, "config", "-q")...)
	cmd.Dir = repoRoot
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("docker compose config -q: %v\n%s", err, out)
	}
}

// TestComposeWiring: the addresses the services' files and environment
// name are the stack's: the collector's exporter and every OTLP endpoint,
// Grafana's data sources and dashboard folder, Prometheus's scrape targets.
func TestComposeWiring(t *testing.T) {
	p := loadStack(t)

	// The collector's configuration, as the collector service mounts it.
	var collector struct {
		Receivers map[string]struct {
			Protocols map[string]struct {
				Endpoint string `yaml:"endpoint"`
			} `yaml:"protocols"`
		} `yaml:"receivers"`
		Processors map[string]any `yaml:"processors"`
		Exporters  map[string]struct {
			Endpoint string `yaml:"endpoint"`
		} `yaml:"exporters"`
		Service struct {
			Pipelines map[string]struct {
				Receivers  []string `yaml:"receivers"`
				Processors []string `yaml:"processors"`
				Exporters  []string `yaml:"exporters"`
			} `yaml:"pipelines"`
		} `yaml:"service"`
	}
	readYAML(t, mountedFile(t, p, "otel-collector", "/etc/otelcol/collector.yaml"), &collector)
	if len(collector.Service.Pipelines["traces"].Exporters) == 0 {
		t.Errorf("collector: no traces pipeline with an exporter")
	}
	for name, pl := range collector.Service.Pipelines {
		for _, r := range pl.Receivers {
			if _, ok := collector.Receivers[r]; !ok {
				t.Errorf("collector: pipeline %s names receiver %s, which is not configured", name, r)
			}
		}
		for _, pr := range pl.Processors {
			if _, ok := collector.Processors[pr]; !ok {
				t.Errorf("collector: pipeline %s names processor %s, which is not configured", name, pr)
			}
		}
		for _, e := range pl.Exporters {
			exp, ok := collector.Exporters[e]
			if !ok {
				t.Errorf("collector: pipeline %s names exporter %s, which is not configured", name, e)
				continue
			}
			checkService(t, p, "collector exporter "+e, exp.Endpoint)
		}
	}
	otlpPorts := map[string]bool{}
	for _, r := range collector.Receivers {
		for _, proto := range r.Protocols {
			if _, port, err := net.SplitHostPort(proto.Endpoint); err == nil {
				otlpPorts[port] = true
			}
		}
	}
	traced := 0
	for _, name := range p.ServiceNames() {
		endpoint, ok := p.Services[name].Environment["OTEL_EXPORTER_OTLP_ENDPOINT"]
		if !ok || endpoint == nil {
			continue
		}
		traced++
		u, err := url.Parse(*endpoint)
		if err != nil || u.Hostname() != "otel-collector" || !otlpPorts[u.Port()] {
			t.Errorf("service %s: OTEL_EXPORTER_OTLP_ENDPOINT %q is not a port the collector listens on (%v)", name, *endpoint, otlpPorts)
		}
	}
	if traced < 2 {
		t.Errorf("%d services export traces; the projector and the outbox writer should", traced)
	}

	// Grafana: its data sources are the stack's, and the dashboard
	// provider reads the directory the dashboard is mounted at.
	var datasources struct {
		Datasources []struct {
			Type string `yaml:"type"`
			URL  string `yaml:"url"`
		} `yaml:"datasources"`
	}
	readYAML(t, mountedFile(t, p, "grafana", "/etc/grafana/provisioning/datasources/datasources.yml"), &datasources)
	kinds := map[string]bool{}
	for _, d := range datasources.Datasources {
		kinds[d.Type] = true
		checkService(t, p, "grafana data source "+d.Type, d.URL)
	}
	if !kinds["prometheus"] || !kinds["jaeger"] {
		t.Errorf("grafana data sources %v, want prometheus and jaeger", kinds)
	}
	var providers struct {
		Providers []struct {
			Options struct {
				Path string `yaml:"path"`
			} `yaml:"options"`
		} `yaml:"providers"`
	}
	readYAML(t, mountedFile(t, p, "grafana", "/etc/grafana/provisioning/dashboards/dashboards.yml"), &providers)
	if len(providers.Providers) != 1 {
		t.Fatalf("grafana: %d dashboard providers, want 1", len(providers.Providers))
	}
	dash := mountedFile(t, p, "grafana", providers.Providers[0].Options.Path+"/projector.json")
	if dash != repoPath("deploy", "grafana", "dashboards", "projector.json") {
		t.Errorf("grafana: the provider's directory holds %s, want deploy/grafana/dashboards/projector.json", dash)
	}
	if home := p.Services["grafana"].Environment["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]; home != nil {
		mountedFile(t, p, "grafana", *home)
	}

	// Prometheus scrapes services of the stack.
	var prom struct {
		ScrapeConfigs []struct {
			JobName      string `yaml:"job_name"`
			DNSSDConfigs []struct {
				Names []string `yaml:"names"`
			} `yaml:"dns_sd_configs"`
		} `yaml:"scrape_configs"`
	}
	readYAML(t, mountedFile(t, p, "prometheus", "/etc/prometheus/prometheus.yml"), &prom)
	jobs := map[string]bool{}
	for _, sc := range prom.ScrapeConfigs {
		jobs[sc.JobName] = true
		for _, d := range sc.DNSSDConfigs {
			for _, n := range d.Names {
				if _, ok := p.Services[n]; !ok {
					t.Errorf("prometheus job %s: %s is no service of the stack", sc.JobName, n)
				}
			}
		}
	}
	if !jobs["projector"] || !jobs["relay"] {
		t.Errorf("prometheus jobs %v, want projector and relay", jobs)
	}
}

// TestRegisterScript runs the schema registration script the stack's
// schema-init service runs, against a stand-in registry: the request must
// carry the .avsc file's schema intact, since a schema that lost its
// content or its escaping registers something no reader can use.
func TestRegisterScript(t *testing.T) {
	for _, tool := range []string{"sh", "curl", "sed", "tr"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed", tool)
		}
	}
	p := loadStack(t)
	script := mountedFile(t, p, "schema-init", "/register.sh")
	s := p.Services["schema-init"]
	if len(s.Command) != 3 {
		t.Fatalf("schema-init: command %v, want REGISTRY_URL SUBJECT FILE", s.Command)
	}
	checkService(t, p, "schema-init registry", s.Command[0])
	schemaFile := mountedFile(t, p, "schema-init", s.Command[2])

	type request struct {
		method, path, contentType string
		body                      []byte
	}
	// The handler runs on the server's goroutines; the test reads what
	// it recorded once the script has ended.
	var (
		mu       sync.Mutex
		requests []request
	)
	received := func() []request {
		mu.Lock()
		defer mu.Unlock()
		out := requests
		requests = nil
		return out
	}
	reg := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		requests = append(requests, request{r.Method, r.URL.Path, r.Header.Get("Content-Type"), body})
		mu.Unlock()
		w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
		_, _ = io.WriteString(w, `{"id":1}`)
	}))
	defer reg.Close()

	// A schema with what a naive quoting breaks: quotes inside a string,
	// a backslash, tabs, a CRLF line end.
	tricky := filepath.Join(t.TempDir(), "tricky.avsc")
	if err := os.WriteFile(tricky, []byte("{\"type\": \"record\", \"name\": \"T\",\r\n\t\"doc\": \"say \\\"hi\\\" \\\\ bye\",\n\t\"fields\": [{\"name\": \"a\", \"type\": \"string\"}]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, file := range []string{schemaFile, tricky} {
		out, err := exec.Command("sh", script, reg.URL, s.Command[1], file).CombinedOutput()
		if err != nil {
			t.Fatalf("register.sh %s: %v\n%s", file, err, out)
		}
		if !strings.Contains(string(out), `{"id":1}`) {
			t.Errorf("register.sh %s printed %q, want the registry's answer", file, out)
		}
		got := received()
		if len(got) != 1 {
			t.Fatalf("register.sh %s: %d requests, want 1", file, len(got))
		}
		r := got[0]
		if r.method != http.MethodPost || r.path != "/subjects/"+s.Command[1]+"/versions" || r.contentType != "application/vnd.schemaregistry.v1+json" {
			t.Errorf("register.sh %s: %s %s (%s), want POST /subjects/%s/versions", file, r.method, r.path, r.contentType, s.Command[1])
		}
		var body struct {
			SchemaType string `json:"schemaType"`
			Schema     string `json:"schema"`
		}
		if err := json.Unmarshal(r.body, &body); err != nil {
			t.Fatalf("register.sh %s sent a body that is not JSON: %v\n%s", file, err, r.body)
		}
		want, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var sent, fromFile any
		if err := json.Unmarshal([]byte(body.Schema), &sent); err != nil {
			t.Fatalf("register.sh %s: the schema sent is not JSON: %v\n%s", file, err, body.Schema)
		}
		if err := json.Unmarshal(want, &fromFile); err != nil {
			t.Fatal(err)
		}
		if !jsonEqual(sent, fromFile) || body.SchemaType != "AVRO" {
			t.Errorf("register.sh %s sent schema (%s) %s, want the file's %s", file, body.SchemaType, body.Schema, want)
		}
	}

	// A missing or empty file stops it before any request.
	empty := filepath.Join(t.TempDir(), "empty.avsc")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, file := range []string{empty, filepath.Join(t.TempDir(), "missing.avsc")} {
		out, err := exec.Command("sh", script, reg.URL, "x-value", file).CombinedOutput()
		if err == nil || !strings.Contains(string(out), file) {
			t.Errorf("register.sh %s: %v, %q; want a failure naming the file", file, err, out)
		}
	}
	if got := received(); len(got) != 0 {
		t.Errorf("register.sh sent %d requests for a missing or empty file", len(got))
	}
}

// mountedFile is the repository file that service s sees at path
// (through a bind mount of the file or of a directory holding it); the
// test fails if there is none or it does not exist.
func mountedFile(t *testing.T, p *types.Project, service, path string) string {
	t.Helper()
	s, ok := p.Services[service]
	if !ok {
		t.Fatalf("no service %s", service)
	}
	for _, v := range s.Volumes {
		if v.Type != types.VolumeTypeBind {
			continue
		}
		rel, err := filepath.Rel(v.Target, path)
		if err != nil || strings.HasPrefix(rel, "..") {
			continue
		}
		host := filepath.Join(v.Source, rel)
		if _, err := os.Stat(host); err != nil {
			t.Fatalf("service %s reads %s, which is %s on the host: %v", service, path, host, err)
		}
		return host
	}
	t.Fatalf("service %s reads %s, which no bind mount provides", service, path)
	return ""
}

// checkService checks that rawURL (a URL or host:port) names a service of
// the stack.
func checkService(t *testing.T, p *types.Project, what, rawURL string) {
	t.Helper()
	host := rawURL
	if u, err := url.Parse(rawURL); err == nil && u.Host != "" {
		host = u.Host
	}
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	if _, ok := p.Services[host]; !ok {
		t.Errorf("%s: %q is no service of the stack", what, rawURL)
	}
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := yaml.NewDecoder(bufio.NewReader(f)).Decode(v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

func sameSet(a, b []string) bool {
	a, b = slices.Sorted(slices.Values(a)), slices.Sorted(slices.Values(b))
	return slices.Equal(a, b)
}

func jsonEqual(a, b any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return string(x) == string(y)
}
