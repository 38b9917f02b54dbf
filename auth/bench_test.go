package auth

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/golang-jwt/jwt/v5"
)

// What authentication adds to a request: a token file lookup, and a JWT
// check per algorithm, the first time and for a token that passed before.
func BenchmarkAuthenticate(b *testing.B) {
	path := filepath.Join(b.TempDir(), "tokens.yaml")
	file := "tokens:\n"
	for i := range 1000 {
		file += fmt.Sprintf("  - name: svc-%d\n    hash: %s\n    scopes: [\"read:*\"]\n", i, HashToken(fmt.Sprintf("token-%d", i)))
	}
	writeFile(b, path, file)
	log, _ := testLog()
	tokens, err := NewTokenFile(path, log, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("token file of 1000", func(b *testing.B) {
		r := request("token-500")
		for b.Loop() {
			if _, err := tokens.Authenticate(r); err != nil {
				b.Fatal(err)
			}
		}
	})
	k := newTestKeys(b)
	clock := newFakeClock()
	a, _ := jwksFileAuth(b, clock, map[string]any{"rsa-1": k.rsa, "ec-1": k.ec, "oct-1": k.hmac})
	for _, tc := range []struct {
		method jwt.SigningMethod
		kid    string
		key    any
	}{
		{jwt.SigningMethodRS256, "rsa-1", k.rsa},
		{jwt.SigningMethodES256, "ec-1", k.ec},
		{jwt.SigningMethodHS256, "oct-1", k.hmac},
	} {
		r := request(sign(b, tc.method, tc.kid, tc.key, claimsAt(clock.now())))
		b.Run(tc.method.Alg()+" first check", func(b *testing.B) {
			for b.Loop() {
				a.verified.clear()
				if _, err := a.Authenticate(r); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(tc.method.Alg()+" again", func(b *testing.B) {
			for b.Loop() {
				if _, err := a.Authenticate(r); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
