package auth

import (
	"fmt"
	"net/http"
	"strings"
)

// bearerToken returns the token of r's Authorization: Bearer header. Its
// errors wrap ErrUnauthenticated and never quote the header, which holds
// a secret even when it is malformed.
func bearerToken(r *http.Request) (string, error) {
	h := r.Header.Get("Authorization")
	if h == "" {
		return "", fmt.Errorf("%w: no Authorization header: want Authorization: Bearer <token>", ErrUnauthenticated)
	}
	scheme, token, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", fmt.Errorf("%w: the Authorization header is not of the Bearer scheme: want Authorization: Bearer <token>", ErrUnauthenticated)
	}
	token = strings.TrimSpace(token)
	if token == "" {
		return "", fmt.Errorf("%w: the Authorization header has an empty bearer token", ErrUnauthenticated)
	}
	return token, nil
}
