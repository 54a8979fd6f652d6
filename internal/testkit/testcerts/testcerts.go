// Package testcerts writes a throw-away certificate authority, a server
// certificate for 127.0.0.1/localhost and a client certificate into a
// directory, for tests that run real servers over TLS.
package testcerts

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// Files are the paths of the written PEM files.
type Files struct {
	CA         string // CA certificate
	ServerCert string
	ServerKey  string
	ClientCert string // client certificate (CN "beacon-client"), signed by CA
	ClientKey  string
}

// Write creates the files in dir.
func Write(dir string) (Files, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Files{}, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "beacon-test-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return Files{}, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return Files{}, err
	}
	f := Files{
		CA:         filepath.Join(dir, "ca.pem"),
		ServerCert: filepath.Join(dir, "server.pem"),
		ServerKey:  filepath.Join(dir, "server-key.pem"),
		ClientCert: filepath.Join(dir, "client.pem"),
		ClientKey:  filepath.Join(dir, "client-key.pem"),
	}
	if err := writePEM(f.CA, "CERTIFICATE", caDER); err != nil {
		return Files{}, err
	}
	leaf := func(serial int64, cn string, usage []x509.ExtKeyUsage, certPath, keyPath string) error {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial),
			Subject:      pkix.Name{CommonName: cn},
			NotBefore:    now.Add(-time.Hour),
			NotAfter:     now.Add(24 * time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
			ExtKeyUsage:  usage,
			IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
			DNSNames:     []string{"localhost"},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return err
		}
		keyDER, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			return err
		}
		if err := writePEM(certPath, "CERTIFICATE", der); err != nil {
			return err
		}
		return writePEM(keyPath, "EC PRIVATE KEY", keyDER)
	}
	// The server certificate also allows client auth: etcd uses it for its
	// own internal gateway connections.
	if err := leaf(2, "localhost", []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, f.ServerCert, f.ServerKey); err != nil {
		return Files{}, err
	}
	if err := leaf(3, "beacon-client", []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, f.ClientCert, f.ClientKey); err != nil {
		return Files{}, err
	}
	return f, nil
}

func writePEM(path, typ string, der []byte) error {
	b := pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return fmt.Errorf("testcerts: %w", err)
	}
	return nil
}

// CA is a throw-away certificate authority that issues certificates on
// demand: servers for given hosts, clients with a given common name (an
// etcd user, when client-certificate authentication is on), expired or
// not-yet-valid ones, for tests of every way TLS can fail.
type CA struct {
	// File is the CA certificate's PEM file.
	File string

	dir    string
	cert   *x509.Certificate
	key    *ecdsa.PrivateKey
	serial int64
}

// NewCA creates a CA whose certificate is written to dir/<name>.pem.
func NewCA(dir, name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	ca := &CA{File: filepath.Join(dir, name+".pem"), dir: dir, cert: cert, key: key, serial: 1}
	if err := writePEM(ca.File, "CERTIFICATE", der); err != nil {
		return nil, err
	}
	return ca, nil
}

// Leaf is an issued certificate and its key.
type Leaf struct {
	Cert, Key string // PEM files
}

// LeafOptions describe a certificate to issue.
type LeafOptions struct {
	// CommonName is the subject CN (for a client, the etcd user name).
	CommonName string
	// Hosts are the DNS names and IP addresses a server certificate is
	// valid for; 127.0.0.1, ::1 and localhost when nil.
	Hosts []string
	// Server and Client choose the extended key usages; both when
	// neither is set.
	Server, Client bool
	// NotBefore and NotAfter bound the validity; an hour ago to a day
	// from now when zero.
	NotBefore, NotAfter time.Time
}

// Issue writes a certificate and key signed by the CA to
// dir/<name>.pem and dir/<name>-key.pem, replacing existing files
// atomically (rename), as a rotation would.
func (ca *CA) Issue(name string, o LeafOptions) (Leaf, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Leaf{}, err
	}
	now := time.Now()
	if o.NotBefore.IsZero() {
		o.NotBefore = now.Add(-time.Hour)
	}
	if o.NotAfter.IsZero() {
		o.NotAfter = now.Add(24 * time.Hour)
	}
	if o.Hosts == nil {
		o.Hosts = []string{"127.0.0.1", "::1", "localhost"}
	}
	if !o.Server && !o.Client {
		o.Server, o.Client = true, true
	}
	var usage []x509.ExtKeyUsage
	if o.Server {
		usage = append(usage, x509.ExtKeyUsageServerAuth)
	}
	if o.Client {
		usage = append(usage, x509.ExtKeyUsageClientAuth)
	}
	ca.serial++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(ca.serial),
		Subject:      pkix.Name{CommonName: o.CommonName},
		NotBefore:    o.NotBefore,
		NotAfter:     o.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  usage,
	}
	for _, h := range o.Hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return Leaf{}, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return Leaf{}, err
	}
	l := Leaf{Cert: filepath.Join(ca.dir, name+".pem"), Key: filepath.Join(ca.dir, name+"-key.pem")}
	// The key first: a reader that sees the new certificate finds its key.
	if err := replacePEM(l.Key, "EC PRIVATE KEY", keyDER); err != nil {
		return Leaf{}, err
	}
	if err := replacePEM(l.Cert, "CERTIFICATE", der); err != nil {
		return Leaf{}, err
	}
	return l, nil
}

// replacePEM writes path through a temporary file and a rename.
func replacePEM(path, typ string, der []byte) error {
	tmp := path + ".tmp"
	if err := writePEM(tmp, typ, der); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("testcerts: %w", err)
	}
	return nil
}
