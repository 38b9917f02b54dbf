package main

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/projector-dev/projector/internal/testenv"
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
