package peers

import (
	"fmt"

	"github.com/nats-io/nats.go"
)

// DialNATS connects to the NATS server at url.
func DialNATS(url, name string) (*nats.Conn, error) {
	nc, err := nats.Connect(url, nats.Name(name), nats.Timeout(DialTimeout), nats.NoReconnect())
	if err != nil {
		return nil, fmt.Errorf("nats: %w", err)
	}
	return nc, nil
}

// NATSVersion reads the version the server at url announces.
func NATSVersion(url string) (string, error) {
	nc, err := DialNATS(url, "cheetah-bench-version")
	if err != nil {
		return "", err
	}
	defer nc.Close()
	return nc.ConnectedServerVersion(), nil
}
