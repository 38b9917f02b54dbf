package main

// The fixed addresses of projector dev's embedded broker and registry.
// projector produce defaults to them, so that dev in one terminal and
// produce in another need no flags.
const (
	DevBrokers     = "127.0.0.1:9092"
	DevRegistryURL = "http://127.0.0.1:8081"
)
