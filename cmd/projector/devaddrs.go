package main

// The addresses projector dev's embedded broker and registry listen on
// unless told otherwise; projector produce defaults to them, so that the
// two need no flags to find each other.
const (
	DevBrokers     = "127.0.0.1:9092"
	DevRegistryURL = "http://127.0.0.1:8081"
)

// DevHTTPAddr is where projector dev serves /metrics, /livez and /readyz
// unless told otherwise: loopback only, since dev runs on a laptop, often
// on a network it does not control; run's default listens on every
// interface, for the scraper of its deployment.
const DevHTTPAddr = "127.0.0.1:8080"

// DevIdentity is projector dev's consumer identity unless told otherwise:
// dev moves its identity's stored offsets back to 0 on every start (its
// embedded topics start empty), which must never happen to the identity a
// projector run keeps in the same database.
const DevIdentity = "projector-dev"
