package server

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// jwtMinter signs etcd JWT tokens with the cluster's private key, the way
// etcd's own JWT token provider does (claims username, revision, exp), so
// that the HTTP API can act as the etcd user a client certificate names,
// which has no password to authenticate with. Only a process holding the
// private key can do this; etcd accepts the token like one it issued.
type jwtMinter struct {
	method jwt.SigningMethod
	key    crypto.PrivateKey
	ttl    time.Duration
}

// parseAuthToken splits etcd's --auth-token value ("jwt,k=v,...").
func parseAuthToken(s string) (typ string, opts map[string]string, err error) {
	parts := strings.Split(s, ",")
	opts = map[string]string{}
	for _, p := range parts[1:] {
		k, v, ok := strings.Cut(p, "=")
		if !ok || k == "" {
			return "", nil, fmt.Errorf("Config.Security.AuthToken %q: option %q is not key=value", s, p)
		}
		if _, dup := opts[k]; dup {
			return "", nil, fmt.Errorf("Config.Security.AuthToken %q: option %q given twice", s, k)
		}
		opts[k] = v
	}
	return parts[0], opts, nil
}

// newJWTMinter returns a minter for a "jwt,..." --auth-token with a
// private key, or nil for simple tokens and verify-only JWT settings.
func newJWTMinter(authToken string) (*jwtMinter, error) {
	typ, opts, err := parseAuthToken(authToken)
	if err != nil {
		return nil, err
	}
	if typ != "jwt" || opts["priv-key"] == "" {
		return nil, nil
	}
	method := jwt.GetSigningMethod(opts["sign-method"])
	if method == nil {
		return nil, fmt.Errorf("Config.Security.AuthToken: sign-method %q is not one etcd knows (ES256, RS256, EdDSA, ...)", opts["sign-method"])
	}
	pemBytes, err := os.ReadFile(opts["priv-key"])
	if err != nil {
		return nil, fmt.Errorf("Config.Security.AuthToken priv-key: %w", err)
	}
	m := &jwtMinter{method: method, ttl: 5 * time.Minute}
	if v := opts["ttl"]; v != "" {
		if m.ttl, err = time.ParseDuration(v); err != nil {
			return nil, fmt.Errorf("Config.Security.AuthToken ttl %q: %w", v, err)
		}
	}
	switch method.(type) {
	case *jwt.SigningMethodECDSA:
		m.key, err = jwt.ParseECPrivateKeyFromPEM(pemBytes)
	case *jwt.SigningMethodRSA, *jwt.SigningMethodRSAPSS:
		m.key, err = jwt.ParseRSAPrivateKeyFromPEM(pemBytes)
	case *jwt.SigningMethodEd25519:
		m.key, err = jwt.ParseEdPrivateKeyFromPEM(pemBytes)
	case *jwt.SigningMethodHMAC:
		m.key = pemBytes
	default:
		err = fmt.Errorf("unsupported sign-method %s", method.Alg())
	}
	if err != nil {
		return nil, fmt.Errorf("Config.Security.AuthToken priv-key %s: %w", opts["priv-key"], err)
	}
	return m, nil
}

// mint returns a token for user at the auth store's revision.
func (m *jwtMinter) mint(user string, revision uint64) (string, error) {
	if user == "" {
		return "", errors.New("no user name")
	}
	return jwt.NewWithClaims(m.method, jwt.MapClaims{
		"username": user,
		"revision": revision,
		"exp":      time.Now().Add(m.ttl).Unix(),
	}).SignedString(m.key)
}

// jwtUser reads the username claim of an etcd JWT without verifying it:
// only for naming a bearer token's user after etcd accepted the token.
func jwtUser(token string) string {
	claims := jwt.MapClaims{}
	if _, _, err := jwt.NewParser().ParseUnverified(token, claims); err != nil {
		return ""
	}
	u, _ := claims["username"].(string)
	return u
}

// defaultJWTAuthToken creates (once) an ECDSA P-256 key pair in
// dataDir/auth and returns the --auth-token value that uses it.
func defaultJWTAuthToken(dataDir string, ttl time.Duration) (string, error) {
	dir := filepath.Join(dataDir, "auth")
	priv, pub := filepath.Join(dir, "jwt-es256.key"), filepath.Join(dir, "jwt-es256.pub")
	if _, err := os.Stat(priv); errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return "", fmt.Errorf("Config.DataDir: create %s: %w", dir, err)
		}
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return "", err
		}
		privDER, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			return "", err
		}
		pubDER, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
		if err != nil {
			return "", err
		}
		if err := os.WriteFile(pub, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}), 0o600); err != nil {
			return "", err
		}
		if err := os.WriteFile(priv, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: privDER}), 0o600); err != nil {
			return "", err
		}
	} else if err != nil {
		return "", fmt.Errorf("Config.DataDir: %w", err)
	}
	return fmt.Sprintf("jwt,pub-key=%s,priv-key=%s,sign-method=ES256,ttl=%s", pub, priv, ttl), nil
}
