package main

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/projection"
)

// TestRegistryCredentials gives the registry's credentials each way a
// user can: every request must carry them as basic auth, and bad
// combinations are refused naming the flag.
func TestRegistryCredentials(t *testing.T) {
	fake, _ := testenv.Registry(t)
	var seen []string
	fake.Intercept(func(w http.ResponseWriter, r *http.Request) bool {
		user, pass, ok := r.BasicAuth()
		seen = append(seen, user+":"+pass)
		if !ok || user != "reader" || pass != secret {
			http.Error(w, `{"error_code": 401, "message": "unauthorized"}`, http.StatusUnauthorized)
			return true
		}
		return false
	})
	plain := fake.URL()
	u, _ := url.Parse(plain)
	u.User = url.UserPassword("reader", secret)
	for _, tc := range []struct {
		name string
		c    common
	}{
		{"in the URL", common{registryURL: u.String()}},
		{"flags", common{registryURL: plain, registryAuth: registryAuth{registryUser: "reader", registryPassword: secret}}},
		{"password flag, user in the URL", common{registryURL: strings.Replace(plain, "://", "://reader@", 1), registryAuth: registryAuth{registryPassword: secret}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			seen = nil
			cl, err := tc.c.registryClient()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := cl.Subjects(t.Context()); err != nil {
				t.Fatalf("list subjects: %v (the registry saw %q)", err, seen)
			}
			if len(seen) == 0 || seen[0] != "reader:"+secret {
				t.Errorf("the registry saw credentials %q, want reader's", seen)
			}
		})
	}
	for _, tc := range []struct {
		c    common
		want string
	}{
		{common{registryURL: plain, registryAuth: registryAuth{registryPassword: secret}}, "--registry-password (PROJECTOR_REGISTRY_PASSWORD) needs --registry-user"},
		{common{registryURL: "registry:8081"}, "--registry-url registry:8081: want an http:// or https:// URL"},
		{common{registryURL: "http://reader:" + secret + "@h:bad/"}, "--registry-url http://reader:xxxxx@h:bad/"},
	} {
		_, err := tc.c.registryClient()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("registryClient(%q): got %v, want an error saying %q", tc.c.registryURL, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), secret) {
			t.Errorf("registryClient(%q): error %q shows the password", tc.c.registryURL, err)
		}
	}
}

// TestAwaitsSchemaOnEitherNotFound waits for a projection's schema on
// registries that say "nothing registered yet" as Confluent's does
// (subject not found) and as Apicurio's does (version not found): run
// waits, says so once, and starts when the schema is registered. Any other
// error still stops it.
func TestAwaitsSchemaOnEitherNotFound(t *testing.T) {
	for _, tc := range []struct {
		name string
		code int
		wait bool
	}{
		{"subject not found", 40401, true},
		{"version not found", 40402, true},
		{"registry error", 50001, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake, cl := testenv.Registry(t)
			var registered atomic.Bool
			fake.Intercept(func(w http.ResponseWriter, r *http.Request) bool {
				if registered.Load() || !strings.HasSuffix(r.URL.Path, "/versions/latest") {
					return false
				}
				w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
				w.WriteHeader(tc.code / 100)
				fmt.Fprintf(w, `{"error_code": %d, "message": "no"}`, tc.code)
				return true
			})
			projs, err := projection.Parse(demo.Projections, ".")
			if err != nil {
				t.Fatal(err)
			}
			var logs syncBuffer
			done := make(chan error, 1)
			go func() {
				_, err := awaitReaderSchemas(t.Context(), slog.New(slog.NewTextHandler(&logs, nil)), cl, projs)
				done <- err
			}()
			if !tc.wait {
				if err := <-done; err == nil || !strings.Contains(err.Error(), "set schema") {
					t.Fatalf("startup on error %d: %v, want it to stop naming the schema", tc.code, err)
				}
				return
			}
			testenv.WaitFor(t, 10*time.Second, testenv.Holds("a line saying what it waits for", func() bool {
				return strings.Contains(logs.String(), "waiting for a schema under subject "+demo.Topic+"-value")
			}))
			select {
			case err := <-done:
				t.Fatalf("stopped instead of waiting: %v", err)
			default:
			}
			if _, err := demo.RegisterSchemas(t.Context(), cl); err != nil {
				t.Fatal(err)
			}
			registered.Store(true)
			if err := <-done; err != nil {
				t.Fatalf("after the schema was registered: %v", err)
			}
			if n := strings.Count(logs.String(), "waiting for a schema"); n != 1 {
				t.Errorf("said %d times that it waits, want once", n)
			}
		})
	}
}
