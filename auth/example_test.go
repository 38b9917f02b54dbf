package auth_test

import (
	"fmt"

	"github.com/projector-dev/projector/auth"
)

// A token file stores the hash of each token, never the token.
func ExampleHashToken() {
	fmt.Println(auth.HashToken("test"))
	// Output: sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
}

// read:* stands for every read:<projection>, and for nothing else.
func ExamplePrincipal_Allows() {
	p := auth.Principal{Subject: "portal", Scopes: []string{auth.ScopeReadAll}, Tenant: "acme"}
	fmt.Println(p.Allows(auth.ReadScope("orders")), p.Allows(auth.ScopeAdmin))
	// Output: true false
}
