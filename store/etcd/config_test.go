package etcd_test

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon/store/etcd"
)

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  etcd.Config
		want string // substring of the error; "" means valid
	}{
		{"zero value", etcd.Config{}, ""},
		{"host:port", etcd.Config{Endpoints: []string{"etcd-0:2379", "10.0.0.2:2379", "[::1]:2379"}}, ""},
		{"urls", etcd.Config{Endpoints: []string{"http://etcd-0:2379", "HTTP://etcd-1:2379/"}}, ""},
		{"https with files", etcd.Config{Endpoints: []string{"https://etcd:2379"}, CA: "ca.pem", ClientCert: "c.pem", ClientKey: "k.pem"}, ""},
		{"host:port with CA", etcd.Config{Endpoints: []string{"etcd:2379"}, CA: "ca.pem"}, ""},
		{"credentials", etcd.Config{Username: "u", Password: "p"}, ""},
		{"timeouts", etcd.Config{DialTimeout: time.Second, RequestTimeout: time.Minute, ListPageSize: 10}, ""},

		{"empty endpoint", etcd.Config{Endpoints: []string{"a:1", ""}}, "Endpoints[1] (ETCD_ENDPOINTS): empty endpoint"},
		{"no port", etcd.Config{Endpoints: []string{"etcd"}}, `endpoint "etcd": want host:port`},
		{"url without port", etcd.Config{Endpoints: []string{"http://etcd"}}, "want host:port"},
		{"bad port", etcd.Config{Endpoints: []string{"etcd:http"}}, `port "http" is not a number in 1-65535`},
		{"port zero", etcd.Config{Endpoints: []string{"etcd:0"}}, "is not a number in 1-65535"},
		{"port too big", etcd.Config{Endpoints: []string{"etcd:65536"}}, "is not a number in 1-65535"},
		{"no host", etcd.Config{Endpoints: []string{":2379"}}, "has no host"},
		{"unbracketed ipv6", etcd.Config{Endpoints: []string{"::1:2379"}}, "too many colons"},
		{"scheme", etcd.Config{Endpoints: []string{"unix://etcd:2379"}}, `scheme "unix" is not http or https`},
		{"path", etcd.Config{Endpoints: []string{"http://etcd:2379/v3"}}, "has a path, query or fragment"},
		{"query", etcd.Config{Endpoints: []string{"http://etcd:2379?x=1"}}, "has a path, query or fragment"},
		{"userinfo", etcd.Config{Endpoints: []string{"http://u:p@etcd:2379"}}, "carries credentials"},
		{"space", etcd.Config{Endpoints: []string{"etcd 1:2379"}}, "space or control character"},
		{"mixed schemes", etcd.Config{Endpoints: []string{"http://a:2379", "https://b:2379"}}, "mix http and https"},
		{"http with CA", etcd.Config{Endpoints: []string{"http://a:2379"}, CA: "ca.pem"}, "plain http:// but TLS files are set"},
		{"duplicate", etcd.Config{Endpoints: []string{"a:2379", "http://a:2379"}}, "listed twice"},
		{"user without password", etcd.Config{Username: "u"}, "Password is empty"},
		{"password without user", etcd.Config{Password: "p"}, "Username is empty"},
		{"cert without key", etcd.Config{ClientCert: "c.pem"}, "ClientKey is empty"},
		{"key without cert", etcd.Config{ClientKey: "k.pem"}, "ClientCert is empty"},
		{"negative dial timeout", etcd.Config{DialTimeout: -time.Second}, "DialTimeout -1s is negative"},
		{"negative request timeout", etcd.Config{RequestTimeout: -1}, "RequestTimeout -1ns is negative"},
		{"negative page size", etcd.Config{ListPageSize: -1}, "ListPageSize -1 is negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Validate: %v", err)
			case tc.want == "":
			case err == nil:
				t.Fatalf("Validate accepted the config, want an error containing %q", tc.want)
			case !errors.Is(err, etcd.ErrInvalidConfig):
				t.Fatalf("error %v does not match ErrInvalidConfig", err)
			case !strings.Contains(err.Error(), tc.want):
				t.Fatalf("error %q does not contain %q", err, tc.want)
			}
		})
	}
}

func TestConfigFromEnv(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		want etcd.Config
	}{
		{"nothing set", nil, etcd.Config{}},
		{"blank endpoints", map[string]string{etcd.EnvEndpoints: "  "}, etcd.Config{}},
		{"one endpoint", map[string]string{etcd.EnvEndpoints: "http://etcd:2379"}, etcd.Config{Endpoints: []string{"http://etcd:2379"}}},
		{"list with spaces", map[string]string{etcd.EnvEndpoints: " a:2379 , https://b:2379,c:2379 "},
			etcd.Config{Endpoints: []string{"a:2379", "https://b:2379", "c:2379"}}},
		{"empty item kept for Validate", map[string]string{etcd.EnvEndpoints: "a:2379,,b:2379"},
			etcd.Config{Endpoints: []string{"a:2379", "", "b:2379"}}},
		{"everything", map[string]string{
			etcd.EnvEndpoints:  "https://etcd:2379",
			etcd.EnvUsername:   "beacon",
			etcd.EnvPassword:   " secret with spaces ",
			etcd.EnvCA:         "/etc/etcd/ca.pem ",
			etcd.EnvClientCert: "/etc/etcd/client.pem",
			etcd.EnvClientKey:  "/etc/etcd/client-key.pem",
		}, etcd.Config{
			Endpoints: []string{"https://etcd:2379"},
			Username:  "beacon", Password: " secret with spaces ",
			CA: "/etc/etcd/ca.pem", ClientCert: "/etc/etcd/client.pem", ClientKey: "/etc/etcd/client-key.pem",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, name := range []string{etcd.EnvEndpoints, etcd.EnvUsername, etcd.EnvPassword, etcd.EnvCA, etcd.EnvClientCert, etcd.EnvClientKey} {
				t.Setenv(name, tc.env[name])
			}
			got := etcd.ConfigFromEnv()
			if !slices.Equal(got.Endpoints, tc.want.Endpoints) || got.Username != tc.want.Username || got.Password != tc.want.Password ||
				got.CA != tc.want.CA || got.ClientCert != tc.want.ClientCert || got.ClientKey != tc.want.ClientKey {
				t.Fatalf("ConfigFromEnv() = %+v, want %+v", got, tc.want)
			}
		})
	}
}
