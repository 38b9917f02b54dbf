package main

// The addresses projector dev's embedded broker and registry listen on
// unless told otherwise; projector produce defaults to them, so that the
// two need no flags to find each other.
const (
	DevBrokers     = "127.0.0.1:9092"
	DevRegistryURL = "http://127.0.0.1:8081"
)
