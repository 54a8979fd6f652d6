package kubetest

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	"github.com/beaconplane/beacon/internal/testkit/testpeer"
	"github.com/beaconplane/beacon/registry/kube"
	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset/typed/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	authenticationv1client "k8s.io/client-go/kubernetes/typed/authentication/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	discoveryv1client "k8s.io/client-go/kubernetes/typed/discovery/v1"
	rbacv1client "k8s.io/client-go/kubernetes/typed/rbac/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/yaml"
)

// StartTimeout bounds the start of the control plane (long: the machine
// may be busy compiling).
const StartTimeout = 90 * time.Second

// WaitTimeout bounds the harness's waits for the controllers.
const WaitTimeout = 60 * time.Second

// NodeName is the Node every test pod is bound to.
const NodeName = "beacon-test-node"

// PodLabel is the label (value "true") of the test pods, which each
// namespace's Service (ServiceName) selects.
const PodLabel = "beacon-test-pod"

// ServiceName is the headless Service Namespace creates, labelled
// kube.DiscoveryLabel=true, selecting every pod of the namespace created by
// Pod.
const ServiceName = "workers"

// ControlPlane is a running kube-apiserver and kube-controller-manager over
// an embedded etcd.
type ControlPlane struct {
	dir     string
	etcd    *etcdtest.Server
	apiBin  string
	kcmBin  string
	port    int
	prefix  string
	certDir string
	ca      []byte
	admin   *rest.Config

	mu     sync.Mutex
	api    *process
	kcm    *process
	nextIP int

	Core      corev1client.CoreV1Interface
	Slices    discoveryv1client.DiscoveryV1Interface
	RBAC      rbacv1client.RbacV1Interface
	Dynamic   dynamic.Interface
	Extension apiextensionsclient.ApiextensionsV1Interface
	authn     authenticationv1client.AuthenticationV1Interface
}

var shared struct {
	once sync.Once
	cp   *ControlPlane
	err  error
}

// Shared returns the package's control plane, starting it on first use. It
// skips the test (or fails it with BEACON_REQUIRE_PEERS) when the binaries
// are not built.
func Shared(tb testing.TB) *ControlPlane {
	tb.Helper()
	api := testpeer.Built(tb, "kube-apiserver")
	kcm := testpeer.Built(tb, "kube-controller-manager")
	shared.once.Do(func() { shared.cp, shared.err = Start(api, kcm, Options{}) })
	if shared.err != nil {
		tb.Fatalf("kubetest: %v", shared.err)
	}
	return shared.cp
}

// StopShared stops the package's control plane if it was started; call it
// from TestMain after m.Run.
func StopShared() {
	if shared.cp != nil {
		shared.cp.Stop()
	}
}

// Options adjust a control plane started by New or Start.
type Options struct {
	// NoCRD leaves the InstanceSet CRD out (InstallCRD installs it).
	NoCRD bool
	// NoControllers runs no kube-controller-manager.
	NoControllers bool
}

// New starts a control plane of the test's own (Shared is cheaper), stopped
// when the test ends.
func New(tb testing.TB, opts Options) *ControlPlane {
	tb.Helper()
	api := testpeer.Built(tb, "kube-apiserver")
	kcm := testpeer.Built(tb, "kube-controller-manager")
	cp, err := Start(api, kcm, opts)
	if err != nil {
		tb.Fatalf("kubetest: %v", err)
	}
	tb.Cleanup(cp.Stop)
	return cp
}

// Start starts a control plane from the two binaries.
func Start(apiBin, kcmBin string, opts Options) (cp *ControlPlane, err error) {
	dir, err := os.MkdirTemp("", "kubetest-")
	if err != nil {
		return nil, err
	}
	cp = &ControlPlane{dir: dir, apiBin: apiBin, kcmBin: kcmBin, certDir: filepath.Join(dir, "pki")}
	defer func() {
		if err != nil {
			cp.Stop()
		}
	}()
	if cp.etcd, err = etcdtest.New(etcdtest.Options{Dir: filepath.Join(dir, "etcd")}); err != nil {
		return nil, err
	}
	if err := cp.writeCerts(); err != nil {
		return nil, fmt.Errorf("certificates: %w", err)
	}
	if cp.port, err = etcdtest.FreePort(); err != nil {
		return nil, err
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	cp.prefix = "/kubetest-" + hex.EncodeToString(b[:])
	if err := cp.startAPIServer(); err != nil {
		return nil, err
	}
	rc := cp.admin
	cp.Core = corev1client.NewForConfigOrDie(rc)
	cp.Slices = discoveryv1client.NewForConfigOrDie(rc)
	cp.RBAC = rbacv1client.NewForConfigOrDie(rc)
	cp.Dynamic = dynamic.NewForConfigOrDie(rc)
	cp.Extension = apiextensionsclient.NewForConfigOrDie(rc)
	cp.authn = authenticationv1client.NewForConfigOrDie(rc)
	ctx, cancel := context.WithTimeout(context.Background(), StartTimeout)
	defer cancel()
	if !opts.NoCRD {
		if err := cp.InstallCRD(ctx); err != nil {
			return nil, err
		}
	}
	if _, err := cp.Core.Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: NodeName}}, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("create node: %w", err)
	}
	if !opts.NoControllers {
		if err := cp.startControllerManager(); err != nil {
			return nil, err
		}
	}
	return cp, nil
}

// InstallCRD creates the InstanceSet CRD (kube.CRD) and waits until it is
// established.
func (cp *ControlPlane) InstallCRD(ctx context.Context) error {
	if _, err := cp.Extension.CustomResourceDefinitions().Create(ctx, kube.CRD(), metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create the InstanceSet CRD: %w", err)
	}
	return cp.waitEstablished(ctx, kube.CRDName)
}

// InstallCRDFile creates the CRD a YAML file holds (Dynamo's:
// registry/kube/testdata/nvidia.com_dynamoworkermetadatas.yaml), unless it
// is there, and waits until it is established.
func (cp *ControlPlane) InstallCRDFile(ctx context.Context, path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(b, &crd); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if _, err := cp.Extension.CustomResourceDefinitions().Create(ctx, &crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create the CRD of %s: %w", path, err)
	}
	return cp.waitEstablished(ctx, crd.Name)
}

// waitEstablished waits until the CRD name is established and served.
func (cp *ControlPlane) waitEstablished(ctx context.Context, name string) error {
	return cp.WaitCRD(ctx, name, Established)
}

// Established reports whether crd (nil: deleted) is established.
func Established(crd *apiextensionsv1.CustomResourceDefinition) bool {
	if crd == nil {
		return false
	}
	for _, c := range crd.Status.Conditions {
		if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
			return true
		}
	}
	return false
}

// WaitCRD waits until the CRD name (nil once deleted) satisfies ok and the
// API server's discovery agrees with it: an established CRD's resource is
// listed in every version it serves, a deleted one's in none. The
// Established condition alone is not enough: discovery follows a CRD
// asynchronously, and a client that reads it in between (kube.Open does)
// finds the resource missing, or another version served.
func (cp *ControlPlane) WaitCRD(ctx context.Context, name string, ok func(*apiextensionsv1.CustomResourceDefinition) bool) error {
	rc := discovery.NewDiscoveryClientForConfigOrDie(cp.admin).RESTClient()
	err := wait.PollUntilContextCancel(ctx, 20*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		crd, err := cp.Extension.CustomResourceDefinitions().Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			crd = nil
		case err != nil:
			return false, nil
		}
		if !ok(crd) {
			return false, nil
		}
		return discoveryAgrees(ctx, rc, name, crd), nil
	})
	if err != nil {
		return fmt.Errorf("waiting for the CRD %s and the API server's discovery of it: %w", name, err)
	}
	return nil
}

// discoveryAgrees reports whether discovery, as kube.Open reads it (the
// group's and each version's document), lists the resource of the CRD name
// in exactly the versions crd serves: none if crd is nil or not established.
func discoveryAgrees(ctx context.Context, rc rest.Interface, name string, crd *apiextensionsv1.CustomResourceDefinition) bool {
	plural, group, _ := strings.Cut(name, ".")
	want := map[string]bool{}
	if Established(crd) {
		for _, v := range crd.Spec.Versions {
			want[v.Name] = v.Served
		}
	}
	var g metav1.APIGroup
	err := rc.Get().AbsPath("/apis", group).Do(ctx).Into(&g)
	if err != nil && !apierrors.IsNotFound(err) {
		return false
	}
	listed := map[string]bool{}
	for _, v := range g.Versions {
		var res metav1.APIResourceList
		err := rc.Get().AbsPath("/apis", group, v.Version).Do(ctx).Into(&res)
		if err != nil && !apierrors.IsNotFound(err) {
			return false
		}
		for _, r := range res.APIResources {
			if r.Name == plural {
				listed[v.Version] = true
			}
		}
	}
	for v, served := range want {
		if served && !listed[v] {
			return false
		}
	}
	for v := range listed {
		if !want[v] {
			return false
		}
	}
	return true
}

// Stop stops everything and removes the temporary files. It is
// idempotent.
func (cp *ControlPlane) Stop() {
	cp.mu.Lock()
	kcm, api := cp.kcm, cp.api
	cp.kcm, cp.api = nil, nil
	cp.mu.Unlock()
	kcm.stop()
	api.stop()
	if cp.etcd != nil {
		cp.etcd.Close()
	}
	_ = os.RemoveAll(cp.dir)
}

// Admin returns a client configuration with full rights (system:masters).
func (cp *ControlPlane) Admin() *rest.Config { return rest.CopyConfig(cp.admin) }

// Host returns the API server's URL.
func (cp *ControlPlane) Host() string { return cp.admin.Host }

// Etcd returns a client of the etcd under the API server (for compaction
// in tests).
func (cp *ControlPlane) Etcd(tb testing.TB) *clientv3.Client { return cp.etcd.Client(tb) }

// CompactEtcd compacts etcd up to its current revision, so that watches the
// API server resumes from older resourceVersions get 410 Gone.
func (cp *ControlPlane) CompactEtcd(tb testing.TB) {
	tb.Helper()
	cli := cp.Etcd(tb)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, "/kubetest-compact-probe")
	if err != nil {
		tb.Fatalf("kubetest: etcd get: %v", err)
	}
	if _, err := cli.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		tb.Fatalf("kubetest: compact: %v", err)
	}
}

// process is a child process with its output in a file.
type process struct {
	name   string
	cmd    *exec.Cmd
	log    string
	exited chan struct{}
	err    error
}

func (cp *ControlPlane) spawn(name, bin string, args ...string) (*process, error) {
	logPath := filepath.Join(cp.dir, name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	cmd := testpeer.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	// The control plane dies with the test process, even on a crash
	// (testpeer.Command).
	if err := cmd.Start(); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	p := &process{name: name, cmd: cmd, log: logPath, exited: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		_ = f.Close()
		close(p.exited)
	}()
	return p, nil
}

// stop ends the process: SIGTERM, then SIGKILL after 10 s.
func (p *process) stop() {
	if p == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

// tail returns the end of the process's log.
func (p *process) tail() string {
	b, _ := os.ReadFile(p.log)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

func (cp *ControlPlane) file(name string) string { return filepath.Join(cp.certDir, name) }

func (cp *ControlPlane) startAPIServer() error {
	p, err := cp.spawn("kube-apiserver", cp.apiBin,
		"--etcd-servers="+cp.etcd.Endpoint(),
		"--etcd-prefix="+cp.prefix,
		"--etcd-compaction-interval=0", // tests compact explicitly (CompactEtcd)
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(cp.port),
		"--tls-cert-file="+cp.file("apiserver.crt"),
		"--tls-private-key-file="+cp.file("apiserver.key"),
		"--client-ca-file="+cp.file("ca.crt"),
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file="+cp.file("sa.key"),
		"--service-account-signing-key-file="+cp.file("sa.key"),
		"--authorization-mode=RBAC",
		"--service-cluster-ip-range=10.0.0.0/24",
		"--disable-admission-plugins=ServiceAccount",
		"--profiling=false",
		"--v=1",
	)
	if err != nil {
		return err
	}
	cp.mu.Lock()
	cp.api = p
	cp.mu.Unlock()
	ca, _ := os.ReadFile(cp.file("ca.crt"))
	cert, _ := os.ReadFile(cp.file("admin.crt"))
	key, _ := os.ReadFile(cp.file("admin.key"))
	cp.ca = ca
	cp.admin = &rest.Config{
		Host:            "https://127.0.0.1:" + strconv.Itoa(cp.port),
		TLSClientConfig: rest.TLSClientConfig{CAData: ca, CertData: cert, KeyData: key},
		QPS:             100,
		Burst:           200,
	}
	return cp.waitReady(p)
}

// waitReady polls /readyz (a process offers no event to wait on) until it
// answers 200, the process exits, or StartTimeout passes.
func (cp *ControlPlane) waitReady(p *process) error {
	cert, err := tls.X509KeyPair(cp.admin.CertData, cp.admin.KeyData)
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(cp.ca)
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}},
	}}
	defer hc.CloseIdleConnections()
	deadline := time.Now().Add(StartTimeout)
	for time.Now().Before(deadline) {
		select {
		case <-p.exited:
			return fmt.Errorf("kube-apiserver exited: %v\n%s", p.err, p.tail())
		default:
		}
		resp, err := hc.Get(cp.admin.Host + "/readyz")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("kube-apiserver not ready after %v:\n%s", StartTimeout, p.tail())
}

func (cp *ControlPlane) startControllerManager() error {
	kc := filepath.Join(cp.dir, "admin.kubeconfig")
	if err := WriteKubeconfig(kc, cp.admin, "default"); err != nil {
		return err
	}
	p, err := cp.spawn("kube-controller-manager", cp.kcmBin,
		"--kubeconfig="+kc,
		"--leader-elect=false",
		"--controllers=endpointslice-controller,garbage-collector-controller",
		"--secure-port=0",
		"--use-service-account-credentials=false",
		"--v=1",
	)
	if err != nil {
		return err
	}
	cp.mu.Lock()
	cp.kcm = p
	cp.mu.Unlock()
	return nil
}

// KillAPIServer kills kube-apiserver (SIGKILL, a crash); StartAPIServer
// starts it again on the same port and etcd.
func (cp *ControlPlane) KillAPIServer(tb testing.TB) {
	tb.Helper()
	cp.mu.Lock()
	p := cp.api
	cp.api = nil
	cp.mu.Unlock()
	if p != nil {
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

// PauseAPIServer freezes kube-apiserver (SIGSTOP): connections stay open
// and nothing answers, as with a hung process. The returned function
// resumes it (SIGCONT); it also runs when the test ends.
func (cp *ControlPlane) PauseAPIServer(tb testing.TB) (resume func()) {
	tb.Helper()
	cp.mu.Lock()
	p := cp.api
	cp.mu.Unlock()
	if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		tb.Fatalf("kubetest: SIGSTOP kube-apiserver: %v", err)
	}
	var once sync.Once
	resume = func() { once.Do(func() { _ = p.cmd.Process.Signal(syscall.SIGCONT) }) }
	tb.Cleanup(resume)
	return resume
}

// StartAPIServer starts a stopped kube-apiserver again and waits until it
// is ready, then restarts kube-controller-manager (if it runs). The old
// controller manager's informers lost the API server: client-go's
// reflectors retry with a backoff that grows with every failure (up to 30 s
// plus as much jitter) and resets only after 2 minutes, so after a few
// restarts the EndpointSlice controller took up to a minute to notice a pod
// turning Ready, and the next test (TestReadinessGatesVisibility) failed
// waiting for it. A new one lists at once.
func (cp *ControlPlane) StartAPIServer(tb testing.TB) {
	tb.Helper()
	if err := cp.startAPIServer(); err != nil {
		tb.Fatalf("kubetest: restart kube-apiserver: %v", err)
	}
	cp.mu.Lock()
	kcm := cp.kcm
	cp.kcm = nil
	cp.mu.Unlock()
	if kcm == nil {
		return
	}
	kcm.stop()
	if err := cp.startControllerManager(); err != nil {
		tb.Fatalf("kubetest: restart kube-controller-manager: %v", err)
	}
}

// Logs returns the end of the control plane's logs (for failed tests).
func (cp *ControlPlane) Logs() string {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	var b strings.Builder
	for _, p := range []*process{cp.api, cp.kcm} {
		if p != nil {
			fmt.Fprintf(&b, "--- %s ---\n%s\n", p.name, p.tail())
		}
	}
	return b.String()
}

// WriteKubeconfig writes a kubeconfig for rc (client certificate or bearer
// token) with namespace as its context's namespace.
func WriteKubeconfig(path string, rc *rest.Config, namespace string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["test"] = &clientcmdapi.Cluster{Server: rc.Host, CertificateAuthorityData: rc.CAData}
	cfg.AuthInfos["test"] = &clientcmdapi.AuthInfo{
		ClientCertificateData: rc.CertData, ClientKeyData: rc.KeyData, Token: rc.BearerToken,
	}
	cfg.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "test", Namespace: namespace}
	cfg.CurrentContext = "test"
	return clientcmd.WriteToFile(*cfg, path)
}

// writeCerts creates a CA, the API server's serving certificate for
// 127.0.0.1, an admin client certificate (O=system:masters) and the service
// account signing key.
func (cp *ControlPlane) writeCerts() error {
	if err := os.MkdirAll(cp.certDir, 0o700); err != nil {
		return err
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "kubetest-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(48 * time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return err
	}
	if err := writePEM(cp.file("ca.crt"), "CERTIFICATE", caDER); err != nil {
		return err
	}
	leaf := func(name string, serial int64, tmpl *x509.Certificate) error {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		tmpl.SerialNumber = big.NewInt(serial)
		tmpl.NotBefore, tmpl.NotAfter = now.Add(-time.Hour), now.Add(48*time.Hour)
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return err
		}
		kder, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			return err
		}
		return errors.Join(writePEM(cp.file(name+".crt"), "CERTIFICATE", der), writePEM(cp.file(name+".key"), "EC PRIVATE KEY", kder))
	}
	if err := leaf("apiserver", 2, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		DNSNames:    []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"},
	}); err != nil {
		return err
	}
	if err := leaf("admin", 3, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "kubetest-admin", Organization: []string{"system:masters"}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}); err != nil {
		return err
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	der, err := x509.MarshalECPrivateKey(saKey)
	if err != nil {
		return err
	}
	return writePEM(cp.file("sa.key"), "EC PRIVATE KEY", der)
}

func writePEM(path, typ string, der []byte) error {
	var b bytes.Buffer
	if err := pem.Encode(&b, &pem.Block{Type: typ, Bytes: der}); err != nil {
		return err
	}
	return os.WriteFile(path, b.Bytes(), 0o600)
}

var _ = discoveryv1.EndpointSlice{}
