package main

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Identities the control plane accepts (client certificates signed by the CA).
const (
	adminUser       = "admin"
	adminGroup      = "system:masters"
	restrictedUser  = "drover-restricted"
	serviceIPRange  = "10.96.0.0/24"
	kubernetesSvcIP = "10.96.0.1"
)

// keyPair is a certificate and its private key, both PEM encoded.
type keyPair struct {
	certPEM []byte
	keyPEM  []byte
	cert    *x509.Certificate
	key     crypto.Signer
}

// pki is everything the control plane and its clients need. Files live in
// DIR/pki; the kubeconfigs embed the data so they need no file paths.
type pki struct {
	dir        string
	ca         keyPair
	serving    keyPair
	admin      keyPair
	restricted keyPair
	saKeyPEM   []byte
	saPubPEM   []byte
	users      map[string]keyPair // extra identities from --user
}

// extraUser is an identity asked for with --user NAME[:GROUP,...].
type extraUser struct {
	name   string
	groups []string
}

var userName = regexp.MustCompile(`^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$`)

func parseUser(v string) (extraUser, error) {
	name, groups, _ := strings.Cut(v, ":")
	if !userName.MatchString(name) {
		return extraUser{}, fmt.Errorf("user name %q: want lower-case letters, digits, '.', '-'", name)
	}
	switch name {
	case "ca", "apiserver", "sa", "admin", "restricted", "audit-policy":
		return extraUser{}, fmt.Errorf("user name %q is reserved", name)
	}
	u := extraUser{name: name}
	if groups != "" {
		u.groups = strings.Split(groups, ",")
	}
	return u, nil
}

func (p *pki) path(name string) string { return filepath.Join(p.dir, name) }

// newPKI generates a fresh CA, a serving certificate for 127.0.0.1/localhost,
// client certificates for the two identities and a service-account signing key,
// and writes them (PEM) to dir.
func newPKI(dir string, users []extraUser) (*pki, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	p := &pki{dir: dir}
	now := time.Now()
	notBefore, notAfter := now.Add(-time.Hour), now.Add(365*24*time.Hour)

	var err error
	p.ca, err = issue(&x509.Certificate{
		Subject:               pkix.Name{CommonName: "drover-controlplane-ca"},
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}, nil)
	if err != nil {
		return nil, fmt.Errorf("ca: %w", err)
	}
	p.serving, err = issue(&x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver"},
		NotBefore:   notBefore,
		NotAfter:    notAfter,
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames: []string{"localhost", "kubernetes", "kubernetes.default",
			"kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.IPv6loopback, net.ParseIP(kubernetesSvcIP)},
	}, &p.ca)
	if err != nil {
		return nil, fmt.Errorf("serving cert: %w", err)
	}
	client := func(cn string, groups ...string) (keyPair, error) {
		return issue(&x509.Certificate{
			Subject:     pkix.Name{CommonName: cn, Organization: groups},
			NotBefore:   notBefore,
			NotAfter:    notAfter,
			KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		}, &p.ca)
	}
	if p.admin, err = client(adminUser, adminGroup); err != nil {
		return nil, fmt.Errorf("admin cert: %w", err)
	}
	if p.restricted, err = client(restrictedUser); err != nil {
		return nil, fmt.Errorf("restricted cert: %w", err)
	}
	p.users = map[string]keyPair{}
	for _, u := range users {
		kp, err := client(u.name, u.groups...)
		if err != nil {
			return nil, fmt.Errorf("%s cert: %w", u.name, err)
		}
		p.users[u.name] = kp
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	if p.saKeyPEM, err = keyPEM(saKey); err != nil {
		return nil, err
	}
	pubDER, err := x509.MarshalPKIXPublicKey(saKey.Public())
	if err != nil {
		return nil, err
	}
	p.saPubPEM = pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER})

	files := map[string][]byte{
		"ca.crt":         p.ca.certPEM,
		"ca.key":         p.ca.keyPEM,
		"apiserver.crt":  p.serving.certPEM,
		"apiserver.key":  p.serving.keyPEM,
		"admin.crt":      p.admin.certPEM,
		"admin.key":      p.admin.keyPEM,
		"restricted.crt": p.restricted.certPEM,
		"restricted.key": p.restricted.keyPEM,
		"sa.key":         p.saKeyPEM,
		"sa.pub":         p.saPubPEM,
	}
	for name, kp := range p.users {
		files[name+".crt"] = kp.certPEM
		files[name+".key"] = kp.keyPEM
	}
	for name, data := range files {
		if err := writeFileAtomic(p.path(name), data, 0o600); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// issue creates a P-256 key and a certificate from tmpl, signed by parent
// (self-signed when parent is nil).
func issue(tmpl *x509.Certificate, parent *keyPair) (keyPair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return keyPair{}, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return keyPair{}, err
	}
	tmpl.SerialNumber = serial.Add(serial, big.NewInt(1))
	signerCert, signerKey := tmpl, crypto.Signer(key)
	if parent != nil {
		signerCert, signerKey = parent.cert, parent.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signerCert, key.Public(), signerKey)
	if err != nil {
		return keyPair{}, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return keyPair{}, err
	}
	kp, err := keyPEM(key)
	if err != nil {
		return keyPair{}, err
	}
	return keyPair{
		certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		keyPEM:  kp,
		cert:    cert,
		key:     key,
	}, nil
}

// keyPEM encodes a private key as PKCS#8 ("PRIVATE KEY"), which every TLS
// stack (Go, rustls, OpenSSL) reads.
func keyPEM(key crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// writeKubeconfig writes a kubeconfig with all credentials embedded as data.
func (p *pki) writeKubeconfig(path, server, user string, id keyPair) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["controlplane"] = &clientcmdapi.Cluster{
		Server:                   server,
		CertificateAuthorityData: p.ca.certPEM,
	}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{
		ClientCertificateData: id.certPEM,
		ClientKeyData:         id.keyPEM,
	}
	cfg.Contexts[user] = &clientcmdapi.Context{Cluster: "controlplane", AuthInfo: user, Namespace: "default"}
	cfg.CurrentContext = user
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		return err
	}
	return writeFileAtomic(path, data, 0o600)
}

// adminTLS is the client TLS configuration the readiness probe uses.
func (p *pki) adminTLS() (*tls.Config, error) {
	cert, err := tls.X509KeyPair(p.admin.certPEM, p.admin.keyPEM)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(p.ca.cert)
	return &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

// writeFileAtomic writes data to a temporary file beside path and renames it
// into place, so readers never see a partial file.
func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, mode); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
